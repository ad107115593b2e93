// What docs/cli.md promises of the client commands, checked against the real CLI process and tiny
// HTTP servers of the test's own (a server that never answers, a stream that breaks off): every
// Ctrl-C ends with one `interrupted` line and stops the request in flight, `logs --follow` says when
// it lost the stream, and a command that takes no arguments refuses them.
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, test } from "node:test";
import { ASSAY_BIN, cleanEnv, collect, ROOT, spawnCli } from "../helpers/cli.ts";
import { within } from "../helpers/client.ts";

const TASK = "100000042";

/** A server answering with `handler`; its URL and a way to close it (and every connection). */
async function tinyServer(handler: http.RequestListener) {
  const server = http.createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

/** Children still running when a test ends (it failed): killed, never left behind. */
const children = new Set<ChildProcess>();
after(() => {
  for (const child of children)
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
});

/** `assay <args>` against `url`, tracked in `children`. */
function spawnClient(args: readonly string[], url: string): ChildProcess {
  const child = spawnCli([...args], env(url));
  children.add(child);
  return child;
}

const env = (url: string) => cleanEnv({ ASSAY_URL: url, ASSAY_TOKEN: "assay_test" });

const json = (res: http.ServerResponse, data: unknown) => {
  res.writeHead(200, { "content-type": "application/json" });
  res.end(JSON.stringify({ data }));
};

const event = (id: number, type: string, runId: string | null, data: Record<string, unknown>) => ({
  id: String(id),
  taskId: TASK,
  runId,
  type,
  data,
  createdAt: "2026-12-01T00:00:00.000Z",
});

const frame = (e: { id: string; type: string }) =>
  `id: ${e.id}\nevent: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`;

const lines = (stdout: string) =>
  stdout
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.parse(l) as { kind: string; message?: string });

test("Ctrl-C, SIGTERM or SIGHUP in any command ends with one `interrupted` line and exit 130, 143 or 129, not an error line", async () => {
  let asked = () => {};
  // Takes every request and never answers.
  const { url, close } = await tinyServer(() => asked());
  try {
    // SIGTERM (timeout, systemd, a cancelled CI job) and SIGHUP killed the command outright: no line,
    // exit 143 by the signal.
    for (const args of [
      ["status", TASK],
      ["tasks"],
      ["download", TASK, "--out", "/nonexistent-never-made"],
      ["logs", TASK],
      ["cancel", TASK],
    ])
      for (const [signal, code] of [
        ["SIGINT", 130],
        ["SIGTERM", 143],
        ["SIGHUP", 129],
      ] as const) {
        const reached = new Promise<void>((r) => {
          asked = r;
        });
        const child = spawnClient(args, url);
        const done = collect(child);
        await reached;
        child.kill(signal);
        const r = await within(done, 5000, `assay ${args.join(" ")} after ${signal}`);
        assert.deepEqual([r.code, r.signal], [code, null], `${signal}: ${r.stderr}`);
        const printed = lines(r.stdout) as { kind: string; signal?: string }[];
        assert.deepEqual(
          printed.map((l) => [l.kind, l.signal]),
          [["interrupted", signal === "SIGINT" ? undefined : signal]],
          `assay ${args.join(" ")}: ${r.stdout}`,
        );
        assert.match(r.stderr, signal === "SIGINT" ? /interrupted/ : new RegExp(`stopped by ${signal}`));
      }
  } finally {
    close();
  }
});

test("a closed terminal (its SIGHUP, then writes that fail EIO) ends a command with 129, not a crash's 1", async () => {
  let asked = () => {};
  const { url, close } = await tinyServer(() => asked());
  // The command on a pseudo-terminal of its own, whose master Python closes when told on stdin: the
  // kernel sends the group SIGHUP, and the terminal answers every write after with EIO.
  const harness = `import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
sys.stdin.readline()
os.close(fd)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))`;
  try {
    const reached = new Promise<void>((r) => {
      asked = r;
    });
    const child = spawn("python3", ["-c", harness, process.execPath, ASSAY_BIN, "tasks"], {
      env: env(url),
      cwd: ROOT,
      stdio: ["pipe", "pipe", "pipe"],
    });
    const done = collect(child);
    await reached;
    child.stdin?.end("close\n");
    const r = await within(done, 10_000, "assay tasks after its terminal closed");
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout.trim(), "129", r.stderr);
  } finally {
    close();
  }
});

test("Ctrl-C once the followed task has ended stops the last requests at once, not after their 30 s timeout", async () => {
  // How many looks at the task answer before the one that never does: follow looks once before
  // the stream, logs --follow only after it.
  let answered = 0;
  let taskGets = 0;
  let asked = () => {};
  const { url, close } = await tinyServer((req, res) => {
    const route = new URL(req.url ?? "", "http://x").pathname;
    if (route === `/api/analysis-tasks/${TASK}`) {
      if (++taskGets <= answered) json(res, { taskId: TASK, status: "running", totalCount: 1 });
      else asked();
    } else if (route.endsWith("/logs")) json(res, { items: [], nextCursor: null });
    else if (route.endsWith("/events")) {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(frame(event(700000001, "task.succeeded", null, { status: "succeeded" })));
    } else asked();
  });
  try {
    for (const [args, looks] of [
      [["follow", TASK], 1],
      [["logs", TASK, "--follow"], 0],
    ] as const) {
      answered = looks;
      taskGets = 0;
      const reached = new Promise<void>((r) => {
        asked = r;
      });
      const child = spawnClient(args, url);
      const done = collect(child);
      await reached;
      const t0 = performance.now();
      child.kill("SIGINT");
      const r = await within(done, 10_000, `assay ${args.join(" ")} after Ctrl-C`);
      assert.equal(r.code, 130, `assay ${args.join(" ")}: ${r.stderr}`);
      assert.ok(performance.now() - t0 < 3000, `assay ${args.join(" ")} took ${performance.now() - t0} ms`);
    }
  } finally {
    close();
  }
});

test("logs --follow says on stderr when it lost the stream and when it is back, and prints each event once", async () => {
  let streams = 0;
  const first = event(700000001, "task.running", null, { status: "running" });
  const closing = event(700000002, "task.succeeded", null, { status: "succeeded" });
  const { url, close } = await tinyServer((req, res) => {
    const route = new URL(req.url ?? "", "http://x").pathname;
    if (route === `/api/analysis-tasks/${TASK}`)
      json(res, { taskId: TASK, status: "succeeded", totalCount: 0 });
    else if (route.endsWith("/logs")) json(res, { items: [], nextCursor: null });
    else if (route.endsWith("/events")) {
      res.writeHead(200, { "content-type": "text/event-stream" });
      // The first stream breaks off after one event; the second resumes after it.
      if (++streams === 1) res.write(frame(first), () => setTimeout(() => res.destroy(), 50));
      else {
        assert.equal(req.headers["last-event-id"], first.id);
        res.end(frame(first) + frame(closing));
      }
    }
  });
  try {
    const r = await within(
      collect(spawnClient(["logs", TASK, "--follow"], url)),
      20_000,
      "assay logs --follow",
    );
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(
      lines(r.stdout).map((l) => (l as unknown as { id: string }).id),
      [first.id, closing.id],
    );
    assert.match(r.stderr, /connection lost \(.*\); reconnecting/);
    assert.match(r.stderr, /reconnected/);
  } finally {
    close();
  }
});

test("tasks, files and types refuse arguments they do not take (exit 2), before asking the server", async () => {
  // Nothing listens here: the usage error must come first.
  const nowhere = env("http://127.0.0.1:9");
  for (const args of [
    ["tasks", "failed"],
    ["files", "données.csv"],
    ["types", "summary"],
  ]) {
    const r = await collect(spawnCli(args, nowhere));
    assert.equal(r.code, 2, `assay ${args.join(" ")}: ${r.stdout}${r.stderr}`);
    const [error] = lines(r.stdout) as { kind: string; code?: string; message?: string }[];
    assert.equal(error?.kind, "error");
    assert.equal(error?.code, "USAGE");
    assert.match(error?.message ?? "", new RegExp(`unexpected argument ${args[1]}`));
  }
});
