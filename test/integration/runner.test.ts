// The seed's process scenarios, each through a real worker, real files and a real child process.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { buffer } from "node:stream/consumers";
import { after, before, describe, test } from "node:test";
import { resolveExecutable } from "../../src/analyses/programs.ts";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { decide } from "../../src/queue/outcomes.ts";
import { type ClaimedRun, type Outcome, runClaim, runComplete, runReapExpired } from "../../src/queue/sql.ts";
import type { HandlerContext, HandlerOutcome } from "../../src/queue/worker.ts";
import { discardAttempt, processHandler } from "../../src/runner/handler.ts";
import { bearer } from "../helpers/app.ts";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";
import {
  alive,
  FIXTURE,
  fixtureProgram,
  outputTree,
  type RunnerEnv,
  runnerEnv,
  runOutputDir,
  strayOutputs,
  writeProgram,
} from "../helpers/runner.ts";
import { createTestBucket } from "../helpers/s3.ts";

let env: RunnerEnv;
let input: string;
before(async () => {
  env = await runnerEnv();
  input = await env.file("a,b\n1,2\n");
});
after(() => env.close());

let typeSeq = 0;
/** Runs one task of a fresh test-only type through a worker; returns the run row. */
async function runOne(
  parameters: Record<string, unknown>,
  program: Partial<Parameters<typeof fixtureProgram>[1]> & { timeoutMs?: number } = {},
  o: { fileId?: string; killGraceMs?: number; maxAttempts?: number; nice?: number; memoryMb?: number } = {},
) {
  const type = `fx-${++typeSeq}`;
  const w = env.worker([{ ...fixtureProgram(type), ...program }], {
    killGraceMs: o.killGraceMs ?? 500,
    ...(o.nice === undefined ? {} : { nice: o.nice }),
    ...(o.memoryMb === undefined ? {} : { memoryMb: o.memoryMb }),
  });
  const taskId = await env.task(type, [o.fileId ?? input], parameters, o.maxAttempts ?? 1);
  await w.start();
  const task = await waitForTerminal(env.db.sql, taskId, 30_000);
  await w.stop();
  const [run] = await env.db.sql`
    select id::float8, status, error_code, error_message, result, attempt from runs where task_id = ${taskId}`;
  return {
    task,
    run: run as {
      id: number;
      status: string;
      error_code: string | null;
      error_message: string | null;
      result: Record<string, unknown> | null;
      attempt: number;
    },
    taskId,
  };
}

/** The pid a fixture reported in its first progress message ("pid 123" / "grandchild 123"). */
async function reportedPid(taskId: string, label: "pid" | "grandchild"): Promise<number> {
  const [event] = await waitFor(async () => {
    const rows = await env.db
      .sql`select data from task_events where task_id = ${taskId} and type = 'run.progress'`;
    return rows.length > 0 ? rows : undefined;
  });
  return Number(new RegExp(`${label} (\\d+)`).exec(event?.data.message)?.[1]);
}

const noStrayOutputs = async () => assert.deepEqual(await strayOutputs(env), []);

/** A program written for one test (see writeProgram). */
const program = (name: string, body: string) => writeProgram(env.dataDir, name, body);

describe("starting", () => {
  test("command missing → ANALYSIS_PROCESS_START_FAILED", async () => {
    const { run } = await runOne({ mode: "ok" }, { executable: "/nonexistent/bin/python9" });
    assert.equal(run.status, "failed");
    assert.equal(run.error_code, "ANALYSIS_PROCESS_START_FAILED");
    await noStrayOutputs();
  });

  test("under a memory limit (prlimit): a program past it fails 'ran out of memory', not retried; one under it succeeds; a missing command still fails to start", {
    skip: resolveExecutable("prlimit") ? false : "prlimit (util-linux) is not on PATH",
  }, async () => {
    // Allocates 64 MiB at a time, untouched (the limit counts address space, not resident pages):
    // past 1 GiB without using the machine's memory.
    const hungry = program(
      "hungry",
      `say({ type: "progress", percent: 1, message: "allocating" });
const held = [];
for (;;) held.push(Buffer.allocUnsafeSlow(64 * 2 ** 20));`,
    );
    const { run } = await runOne({}, hungry, { memoryMb: 1024, maxAttempts: 2 });
    assert.deepEqual([run.status, run.error_code, run.attempt], ["failed", "ANALYSIS_PROCESS_FAILED", 1]);
    assert.equal(
      run.error_message,
      "the program ran out of memory: it may use 1024 MiB (ASSAY_CHILD_MEMORY_MB)",
    );
    const ok = await runOne({ mode: "ok" }, {}, { memoryMb: 1024 });
    assert.equal(ok.run.status, "succeeded", ok.run.error_message ?? "");
    const missing = await runOne(
      { mode: "ok" },
      { executable: "/nonexistent/bin/python9" },
      { memoryMb: 1024 },
    );
    assert.deepEqual(
      [missing.run.error_code, missing.run.error_message],
      ["ANALYSIS_PROCESS_START_FAILED", "the program could not be started (ENOENT)"],
    );
    await noStrayOutputs();
  });

  test("script path missing → ANALYSIS_PROCESS_START_FAILED", async () => {
    const { run } = await runOne({ mode: "ok" }, { script: path.join(path.dirname(FIXTURE), "missing.mjs") });
    assert.equal(run.error_code, "ANALYSIS_PROCESS_START_FAILED");
  });

  test("cwd missing → ANALYSIS_PROCESS_START_FAILED", async () => {
    const { run } = await runOne({ mode: "ok" }, { cwd: "/nonexistent/cwd" });
    assert.equal(run.error_code, "ANALYSIS_PROCESS_START_FAILED");
  });

  test("input file without read permission → ANALYSIS_INPUT_INVALID, not retried", async () => {
    const locked = await env.file("a\n1\n", 0o000);
    const { run } = await runOne({ mode: "ok" }, {}, { fileId: locked, maxAttempts: 3 });
    assert.equal(run.error_code, "ANALYSIS_INPUT_INVALID");
    assert.equal(run.attempt, 1);
  });

  test("command, env and cwd come from the registry; parameters arrive as one plain argument", async () => {
    // biome-ignore lint/suspicious/noTemplateCurlyInString: shell syntax that must arrive as plain data
    const evil = { mode: "echo-params", title: "$(touch /tmp/assay-pwned); `id` | rm -rf / && echo ${HOME}" };
    const { run } = await runOne(evil);
    assert.equal(run.status, "succeeded");
    const dir = await runOutputDir(env, run.id);
    const seen = JSON.parse(fs.readFileSync(path.join(dir, "params.json"), "utf8"));
    assert.deepEqual(seen.params, evil);
    assert.equal(fs.existsSync("/tmp/assay-pwned"), false);
    assert.deepEqual(Object.keys(seen.env).sort(), ["HOME", "LANG", "PATH", "TMPDIR", "TZ"]);
    assert.equal(seen.cwd, path.dirname(FIXTURE));
    assert.equal(seen.argv[0], "--input");
    assert.ok(!JSON.stringify(seen.env).includes("postgres://"));
  });

  test("HOME is a private folder inside the attempt's own work folder, gone with it (local and S3 stores)", async () => {
    const homesInTmp = () => fs.readdirSync(os.tmpdir()).filter((n) => n.startsWith("assay-home-"));
    const before = new Set(homesInTmp());
    const bucket = await createTestBucket();
    const remote = await runnerEnv({ store: bucket.store() });
    try {
      for (const e of [env, remote]) {
        const type = `fx-${++typeSeq}`;
        const w = e.worker([fixtureProgram(type)]);
        const taskId = await e.task(type, [await e.file("a,b\n1,2\n")], { mode: "home" });
        await w.start();
        const task = await waitForTerminal(e.db.sql, taskId, 30_000);
        await w.stop();
        assert.equal(task.status, "succeeded", e.storage.kind);
        const [run] = await e.db.sql<{ key: string }[]>`
          select output_key as key from runs where task_id = ${taskId}`;
        const key = run?.key as string;
        const { stream } = await e.storage.open(`outputs/${key}/home.json`);
        const { home } = JSON.parse((await buffer(stream)).toString());
        // `<workDir>/<runId>.<attempt>.<leaseToken>/home`: the attempt's folder is named as its output key.
        assert.equal(home, path.join(e.dataDir, "work", path.basename(key), "home"), e.storage.kind);
        assert.equal(fs.existsSync(home), false, "removed with the attempt's folder");
        assert.deepEqual(fs.readdirSync(path.join(e.dataDir, "work")), [], e.storage.kind);
        // Only the declared output was stored: the home stayed out of it.
        assert.deepEqual(
          (await e.storage.list(`outputs/${key}/`)).map((o) => o.key),
          [`outputs/${key}/home.json`],
        );
      }
    } finally {
      await remote.close();
      await bucket.drop();
    }
    assert.deepEqual(
      homesInTmp().filter((n) => !before.has(n)),
      [],
      "no home left in the system's tmp folder",
    );
  });

  test("the program and what it starts run at the configured CPU priority, never above the worker's", async () => {
    const own = os.getPriority();
    const lowered = await runOne({ mode: "priority" }, {}, { nice: Math.min(19, own + 7) });
    assert.equal(lowered.run.status, "succeeded");
    const want = Math.min(19, own + 7);
    assert.deepEqual(lowered.run.result?.metrics, { nice: want, childNice: want });
    // A setting at or below the worker's own leaves the worker's (raising it would need privileges).
    const kept = await runOne({ mode: "priority" }, {}, { nice: 0 });
    assert.deepEqual(kept.run.result?.metrics, { nice: own, childNice: own });
  });
});

describe("stdout protocol", () => {
  test("valid JSON Lines → succeeded with metrics, output published", async () => {
    const { run } = await runOne({ mode: "ok" });
    assert.equal(run.status, "succeeded");
    assert.deepEqual(run.result, {
      outputFileName: "out.json",
      metrics: { bytes: 1 },
      files: [{ name: "out.json", size: 11 }],
    });
    const dir = await runOutputDir(env, run.id);
    assert.ok(fs.existsSync(path.join(dir, "out.json")));
    // The store's modes, not the program's umask (0644 in a 0755 folder: every local account read
    // them): the file, its folder, the task's and outputs/ (made by this file's first publish); and
    // files/ and .partial/ (its first upload's).
    const mode = (p: string) => (fs.statSync(p).mode & 0o777).toString(8);
    const made = [path.join(dir, "out.json"), dir, path.dirname(dir), env.outputsRoot];
    made.push(path.join(env.dataDir, "files"), path.join(env.dataDir, ".partial"));
    assert.deepEqual(made.map(mode), ["640", "750", "750", "750", "750", "750"]);
    await noStrayOutputs();
  });

  test("a worker's scratch folder removed under it (by hand, a cleaner of old files) is made again: the next run succeeds", async () => {
    const work = path.join(env.dataDir, "work");
    fs.rmSync(work, { recursive: true });
    const { run } = await runOne({ mode: "ok" });
    assert.equal(run.status, "succeeded", run.error_message ?? "");
    assert.equal(run.attempt, 1);
    assert.deepEqual(fs.readdirSync(work), [], "made again, and the attempt's folder gone");
    assert.equal(fs.statSync(work).mode & 0o777, 0o700);
    await noStrayOutputs();
  });

  test("an invalid JSON line → ANALYSIS_OUTPUT_INVALID, the process is killed", async () => {
    const t0 = Date.now();
    const { run } = await runOne({ mode: "invalid-json" });
    assert.equal(run.error_code, "ANALYSIS_OUTPUT_INVALID");
    assert.ok(Date.now() - t0 < 10_000, "killed, not waited out");
    await noStrayOutputs();
  });

  test("a JSON line split across chunks is one event", async () => {
    const gate = path.join(env.dataDir, "split-line-gate");
    const ran = runOne({ mode: "split-line", gate });
    // The program holds its result back until the whole line's progress is recorded.
    await waitFor(
      async () =>
        (
          await env.db.sql`
          select 1 from task_events where type = 'run.progress' and data->>'message' = 'split across chunks'`
        ).length > 0,
      20_000,
      "the split line's progress to be recorded",
    );
    fs.writeFileSync(gate, "");
    const { run, taskId } = await ran;
    assert.equal(run.status, "succeeded");
    const [progress] = await env.db.sql`
      select data from task_events where task_id = ${taskId} and type = 'run.progress' and data->>'percent' = '42'`;
    assert.equal(progress?.data.message, "split across chunks");
  });

  test("stdout over the limit → ANALYSIS_OUTPUT_INVALID, group killed", async () => {
    const { run } = await runOne({ mode: "flood" });
    assert.equal(run.error_code, "ANALYSIS_OUTPUT_INVALID");
    assert.match(run.error_message ?? "", /exceeded/);
  });

  test("a line over 64 KiB → ANALYSIS_OUTPUT_INVALID", async () => {
    const { run } = await runOne({ mode: "long-line" });
    assert.equal(run.error_code, "ANALYSIS_OUTPUT_INVALID");
  });

  test("stderr output with exit 0 → still succeeded (stderr is diagnostics only)", async () => {
    const { run } = await runOne({ mode: "stderr-ok" });
    assert.equal(run.status, "succeeded");
  });

  test("non-zero exit with empty stderr → ANALYSIS_PROCESS_FAILED, never an input error", async () => {
    const { run } = await runOne({ mode: "exit", code: 1 });
    assert.equal(run.error_code, "ANALYSIS_PROCESS_FAILED");
    assert.match(run.error_message ?? "", /code 1/);
  });

  test("exit codes: 2 input, 3 data, 5 internal are permanent; 4 is retried", async () => {
    for (const [code, expected] of [
      [2, "ANALYSIS_INPUT_INVALID"],
      [3, "ANALYSIS_DATA_INVALID"],
      [5, "ANALYSIS_PROCESS_FAILED"],
    ] as const) {
      const { run } = await runOne({ mode: "exit", code }, {}, { maxAttempts: 3 });
      assert.equal(run.error_code, expected, `exit ${code}`);
      assert.equal(run.attempt, 1, `exit ${code} is not retried`);
    }
    const { run } = await runOne({ mode: "exit", code: 4 }, {}, { maxAttempts: 2 });
    assert.equal(run.error_code, "ANALYSIS_DEPENDENCY_FAILED");
    assert.equal(run.attempt, 2, "exit 4 is retried");
  });

  test("a failure the program explains (an error event, then exit 2–5) keeps its words after the code's message", async () => {
    const reason = 'column "Größe ✓" is not in the header';
    const explains = (code: number, lines = 1) =>
      program(
        `explains-${code}-${lines}`,
        `for (let i = 0; i < ${lines}; i++) say({ type: "error", message: i === ${lines} - 1 ? ${JSON.stringify(reason)} : "first" });
        process.exit(${code});`,
      );
    for (const [code, expected] of [
      [2, "the analysis rejected its parameters"],
      [3, "the input data cannot be analysed"],
      [5, "the analysis failed internally"],
    ] as const) {
      const { run } = await runOne({}, explains(code, code === 3 ? 2 : 1));
      assert.equal(run.error_message, `${expected}: ${reason}`, `exit ${code} (the last error event counts)`);
    }
    // Exit 0 with a result is a success whatever it said; another exit code is not a reported failure.
    const { run: crashed } = await runOne({}, explains(1));
    assert.equal(crashed.error_message, "the program exited with code 1");
    const { run: ok } = await runOne(
      {},
      program(
        "explains-then-succeeds",
        `say({ type: "error", message: "not really" });
        fs.writeFileSync(path.join(out, "out.json"), "{}");
        say({ type: "result", outputFileName: "out.json", metrics: {} });`,
      ),
    );
    assert.equal(ok.status, "succeeded");
    assert.equal(ok.error_message, null);
  });

  test("exit 0 without a result → ANALYSIS_OUTPUT_MISSING", async () => {
    const { run } = await runOne({ mode: "no-result" });
    assert.equal(run.error_code, "ANALYSIS_OUTPUT_MISSING");
  });

  test("a stdout line that is not UTF-8 → ANALYSIS_OUTPUT_INVALID", async () => {
    const { run } = await runOne(
      {},
      program(
        "not-utf8",
        `process.stdout.write(Buffer.concat([
          Buffer.from('{"type":"progress","percent":5,"message":"'),
          Buffer.from([0xff, 0xfe]),
          Buffer.from('"}\\n'),
        ]));
        fs.writeFileSync(path.join(out, "out.json"), "{}");
        say({ type: "result", outputFileName: "out.json", metrics: {} });`,
      ),
    );
    assert.equal(run.error_code, "ANALYSIS_OUTPUT_INVALID");
    assert.match(run.error_message ?? "", /not valid UTF-8/);
    await noStrayOutputs();
  });

  test("an output nobody may read (chmod 000) → ANALYSIS_OUTPUT_INVALID, nothing published", async () => {
    const { run } = await runOne(
      {},
      program(
        "unreadable",
        `fs.writeFileSync(path.join(out, "out.json"), "{}");
        fs.chmodSync(path.join(out, "out.json"), 0);
        say({ type: "result", outputFileName: "out.json", metrics: {} });`,
      ),
    );
    assert.equal(run.error_code, "ANALYSIS_OUTPUT_INVALID");
    assert.equal(run.error_message, "an output file cannot be read");
    await noStrayOutputs();
  });

  test("an output that is a hard link (to the input it did not write) → ANALYSIS_OUTPUT_INVALID, nothing published", async () => {
    const content = "a,b\nsecret,2\n";
    const fileId = await env.file(content);
    const { run } = await runOne(
      {},
      program(
        "hard-link",
        `fs.writeFileSync(path.join(out, "out.json"), "{}");
        fs.linkSync(arg("--input"), path.join(out, "input.csv"));
        say({ type: "result", outputFileName: "out.json", metrics: {} });`,
      ),
      { fileId },
    );
    assert.equal(run.status, "failed");
    assert.equal(run.error_code, "ANALYSIS_OUTPUT_INVALID");
    assert.equal(run.error_message, "outputs must be regular files (no links or folders)");
    await noStrayOutputs();
    const stored = env.storage.localPath?.(`files/${fileId}`) as string;
    assert.equal(fs.readFileSync(stored, "utf8"), content, "the input is untouched");
    assert.equal(fs.statSync(stored).nlink, 1, "and has its own name only again");
  });

  test("a result path outside the output dir, or a missing file → ANALYSIS_OUTPUT_INVALID, nothing published", async () => {
    const escaped = await runOne({ mode: "escape-result" });
    assert.equal(escaped.run.error_code, "ANALYSIS_OUTPUT_INVALID");
    assert.ok(!fs.existsSync(path.join(env.outputsRoot, escaped.taskId, String(escaped.run.id))));
    const missing = await runOne({ mode: "missing-file" });
    assert.equal(missing.run.error_code, "ANALYSIS_OUTPUT_INVALID");
  });
});

describe("ending early", () => {
  test("timeout → timed_out / ANALYSIS_PROCESS_TIMEOUT, the process is gone", async () => {
    const type = `fx-${++typeSeq}`;
    const w = env.worker([{ ...fixtureProgram(type), timeoutMs: 2000 }]);
    const taskId = await env.task(type, [input], { mode: "sleep", ms: 60_000 });
    await w.start();
    const pid = await reportedPid(taskId, "pid");
    assert.ok(alive(pid));
    const task = await waitForTerminal(env.db.sql, taskId);
    await w.stop();
    assert.equal(task.status, "timed_out");
    const [run] = await env.db.sql`select error_code from runs where task_id = ${taskId}`;
    assert.equal(run?.error_code, "ANALYSIS_PROCESS_TIMEOUT");
    assert.equal(alive(pid), false);
    await noStrayOutputs();
  });

  test("user cancel (run marked cancelling) → group killed, tmp removed, run cancelled", async () => {
    const type = `fx-${++typeSeq}`;
    const w = env.worker([fixtureProgram(type)]);
    const taskId = await env.task(type, [input], { mode: "grandchild" });
    await w.start();
    const grandchild = await reportedPid(taskId, "grandchild");
    assert.ok(alive(grandchild));
    // What the cancel endpoint does to a live run; the worker notices at its next heartbeat.
    await env.db.sql`update tasks set status = 'cancelling' where id = ${taskId}`;
    await env.db.sql`update runs set status = 'cancelling' where task_id = ${taskId}`;
    await w.heartbeat();
    const task = await waitForTerminal(env.db.sql, taskId);
    await w.stop();
    assert.equal(task.status, "cancelled");
    const [run] = await env.db.sql`select status, error_code from runs where task_id = ${taskId}`;
    assert.deepEqual({ ...run }, { status: "cancelled", error_code: "ANALYSIS_PROCESS_CANCELLED" });
    await waitFor(async () => !alive(grandchild), 5000, "the grandchild to die");
    await noStrayOutputs();
  });

  test("TMPDIR is the attempt's own: a cancelled program's temporary files go with its folder, none in the system's tmp", async () => {
    const tag = `assay-tmp-test-${process.pid}-${Date.now()}`;
    const systemTmps = [...new Set(["/tmp", os.tmpdir()])];
    const leftInSystemTmp = () =>
      systemTmps.flatMap((d) =>
        fs
          .readdirSync(d)
          .filter((n) => n.startsWith(tag))
          .map((n) => path.join(d, n)),
      );
    const type = `fx-${++typeSeq}`;
    // Like R's session folder (RtmpXXXX) or Python's tempfile: made in TMPDIR, never removed when killed.
    const w = env.worker([
      {
        ...fixtureProgram(type),
        ...program(
          "tmp",
          `const dir = fs.mkdtempSync(path.join(os.tmpdir(), ${JSON.stringify(tag)}));
          fs.writeFileSync(path.join(dir, "scratch"), "x");
          say({ type: "progress", percent: 10, message: "tmp " + dir });
          setInterval(() => {}, 1000);`,
        ),
      },
    ]);
    const taskId = await env.task(type, [input], {});
    await w.start();
    try {
      const [event] = await waitFor(async () => {
        const rows = await env.db
          .sql`select data from task_events where task_id = ${taskId} and type = 'run.progress'`;
        return rows.length > 0 ? rows : undefined;
      });
      const tmp = String(event?.data.message).replace(/^tmp /, "");
      const [running] = await env.db.sql`select id::float8 from runs where task_id = ${taskId}`;
      // <workDir>/<runId>.<attempt>.<leaseToken>/home/<tag>XXXXXX: TMPDIR is the attempt's HOME.
      assert.match(
        path.relative(path.join(env.dataDir, "work"), tmp),
        new RegExp(`^${running?.id}\\.1\\.[^/]+/home/${tag}[^/]+$`),
        `the program's tmp folder is in its attempt's folder: ${tmp}`,
      );
      assert.ok(fs.existsSync(path.join(tmp, "scratch")));
      await env.db.sql`update tasks set status = 'cancelling' where id = ${taskId}`;
      await env.db.sql`update runs set status = 'cancelling' where task_id = ${taskId}`;
      await w.heartbeat();
      const task = await waitForTerminal(env.db.sql, taskId);
      assert.equal(task.status, "cancelled");
      assert.equal(fs.existsSync(tmp), false, "removed with the attempt's folder");
      assert.deepEqual(leftInSystemTmp(), [], "nothing left in the system's tmp");
    } finally {
      await w.stop();
      for (const left of leftInSystemTmp()) fs.rmSync(left, { recursive: true, force: true });
    }
  });

  test("a script that ignores SIGTERM is killed after the grace period", async () => {
    const type = `fx-${++typeSeq}`;
    // The timeout leaves the script time to start and install its handler, even on a loaded machine.
    const w = env.worker([{ ...fixtureProgram(type), timeoutMs: 1500 }], { killGraceMs: 700 });
    const taskId = await env.task(type, [input], { mode: "ignore-term" });
    const t0 = Date.now();
    await w.start();
    const pid = await reportedPid(taskId, "pid");
    const task = await waitForTerminal(env.db.sql, taskId);
    await w.stop();
    assert.equal(task.status, "timed_out");
    assert.ok(
      Date.now() - t0 >= 1500 + 700,
      "SIGTERM was ignored, so it took the timeout plus the grace period",
    );
    assert.equal(alive(pid), false);
  });

  test("a grandchild dies with its group on timeout", async () => {
    const type = `fx-${++typeSeq}`;
    const w = env.worker([{ ...fixtureProgram(type), timeoutMs: 2500 }]);
    const taskId = await env.task(type, [input], { mode: "grandchild" });
    await w.start();
    const grandchild = await reportedPid(taskId, "grandchild");
    const task = await waitForTerminal(env.db.sql, taskId);
    await w.stop();
    assert.equal(task.status, "timed_out");
    await waitFor(async () => !alive(grandchild), 5000, "the grandchild to die");
  });

  test("two workers claiming at once: every run executed once", async () => {
    const type = `fx-${++typeSeq}`;
    const files = await Promise.all(Array.from({ length: 8 }, (_, i) => env.file(`a\n${i}\n`)));
    const taskId = await env.task(type, files, { mode: "sleep", ms: 50 });
    const w1 = env.worker([fixtureProgram(type)], { concurrency: 3 });
    const w2 = env.worker([fixtureProgram(type)], { concurrency: 3 });
    await Promise.all([w1.start(), w2.start()]);
    const task = await waitForTerminal(env.db.sql, taskId);
    await Promise.all([w1.stop(), w2.stop()]);
    assert.deepEqual(task, {
      status: "succeeded",
      total: 8,
      succeeded: 8,
      failed: 0,
      timedOut: 0,
      cancelled: 0,
    });
    const runs = await env.db.sql`select attempt, lease_owner from runs where task_id = ${taskId}`;
    assert.ok(runs.every((r) => r.attempt === 1));
    const outputs = outputTree(path.join(env.outputsRoot, taskId)).filter((p) => p.endsWith("out.json"));
    assert.equal(outputs.length, 8);
  });

  test("shutdown mid-run: the run goes back to the queue unspent and another worker finishes it", async () => {
    const type = `fx-${++typeSeq}`;
    // The first process would sleep a minute (only the shutdown can end it); the next one 100 ms.
    const once = path.join(env.dataDir, "shutdown-once");
    const taskId = await env.task(type, [input], { mode: "sleep", ms: 60_000, thenMs: 100, once }, 1);
    const first = env.worker([fixtureProgram(type)]);
    await first.start();
    await waitFor(
      async () =>
        (await env.db.sql`select 1 from runs where task_id = ${taskId} and status = 'running'`).length > 0,
    );
    await first.stop(0);
    const [mid] = await env.db.sql`select status, attempt from runs where task_id = ${taskId}`;
    assert.deepEqual({ ...mid }, { status: "queued", attempt: 0 });
    const second = env.worker([fixtureProgram(type)]);
    await second.start();
    const task = await waitForTerminal(env.db.sql, taskId);
    await second.stop();
    assert.equal(task.status, "succeeded", "max_attempts is 1, so a spent attempt would have failed it");
    await noStrayOutputs();
  });
  test("a program a supervisor's signal kills while the worker stops goes back to the queue, not failed", async () => {
    // systemd's default KillMode=control-group (or PM2's treekill) sends the stop signal to every
    // process of the service at once: the program dies of it during the worker's grace. It failed
    // for good ("killed by SIGTERM") though the worker's own abort would have put it back.
    const type = `fx-${++typeSeq}`;
    const once = path.join(env.dataDir, "supervisor-once");
    const taskId = await env.task(type, [input], { mode: "sleep", ms: 60_000, thenMs: 100, once }, 1);
    const first = env.worker([fixtureProgram(type)]);
    await first.start();
    await waitFor(
      async () =>
        fs.existsSync(once) &&
        (await env.db.sql`select 1 from runs where task_id = ${taskId} and status = 'running'`).length > 0,
    );
    const pid = Number(fs.readFileSync(once, "utf8"));
    const stopped = first.stop(60_000);
    process.kill(-pid, "SIGTERM");
    await stopped;
    const [mid] = await env.db.sql`select status, attempt, error_code from runs where task_id = ${taskId}`;
    assert.deepEqual({ ...mid }, { status: "queued", attempt: 0, error_code: null });
    const second = env.worker([fixtureProgram(type)]);
    await second.start();
    const task = await waitForTerminal(env.db.sql, taskId);
    await second.stop();
    assert.equal(task.status, "succeeded", "max_attempts is 1, so a spent attempt would have failed it");
    // Outside a shutdown the same death is the program's own failure.
    const other = `fx-${++typeSeq}`;
    const again = path.join(env.dataDir, "supervisor-again");
    const failing = await env.task(
      other,
      [input],
      { mode: "sleep", ms: 60_000, thenMs: 100, once: again },
      1,
    );
    const third = env.worker([fixtureProgram(other)]);
    await third.start();
    await waitFor(async () => fs.existsSync(again));
    process.kill(-Number(fs.readFileSync(again, "utf8")), "SIGTERM");
    const failed = await waitForTerminal(env.db.sql, failing);
    await third.stop();
    assert.equal(failed.status, "failed");
    const [run] = await env.db.sql`select error_code, error_message from runs where task_id = ${failing}`;
    assert.deepEqual(
      { ...run },
      {
        error_code: "ANALYSIS_PROCESS_FAILED",
        error_message: "the program was killed by SIGTERM",
      },
    );
    await noStrayOutputs();
  });
});

describe("publication is decided by the fence", () => {
  const claim = async (type: string) => {
    const [run] = await runClaim(env.db.sql, {
      workerId: "fence-test",
      analysisType: type,
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
    assert.ok(run, "claimed");
    return run;
  };
  const ctx = (): HandlerContext => ({
    signal: new AbortController().signal,
    reportProgress: () => {},
    releaseSlot: () => {},
    finishing: () => {},
  });

  test("a stale attempt that finishes after the winner neither replaces nor deletes its outputs", async () => {
    const type = `fx-${++typeSeq}`;
    const program = fixtureProgram(type);
    const handler = processHandler(program, {
      store: env.storage,
      workDir: path.join(env.dataDir, "work"),
      killGraceMs: 500,
    });
    const discard = discardAttempt(env.storage);
    const taskId = await env.task(type, [input], { mode: "ok" }, 3);
    // Attempt 1 is claimed, then loses its lease to the reaper while its process still runs.
    const stale = await claim(type);
    await env.db.sql`update runs set lease_expires_at = now() - interval '1 second' where id = ${stale.id}`;
    const reaped = await runReapExpired(env.db.sql, { batchSize: 10, retryBaseMs: 0, workerWaitMs: 60_000 });
    assert.equal(reaped.requeued, 1);
    await env.db.sql`update runs set run_after = now() where id = ${stale.id}`;
    // Attempt 2 runs, succeeds and is recorded.
    const winner = await claim(type);
    const won = await handler(winner, ctx());
    assert.equal(won.status, "succeeded");
    const recorded = await runComplete(env.db.sql, [
      { ...outcomeFields(won), id: winner.id, token: winner.leaseToken },
    ]);
    assert.deepEqual(recorded.completed, [winner.id]);
    // Then the stale attempt finishes too: its completion is fenced off and its outputs discarded.
    const late = await handler(stale, ctx());
    assert.equal(late.status, "succeeded");
    const fenced = await runComplete(env.db.sql, [
      { ...outcomeFields(late), id: stale.id, token: stale.leaseToken },
    ]);
    assert.deepEqual(fenced.completed, []);
    await discard(stale);
    // The winner's output is still the run's output, and downloadable.
    const app = await env.app();
    const token = (await tokenCreate(env.db.sql, "runner")).token;
    const res = await app.inject({ url: `/api/analysis-tasks/${taskId}/download`, headers: bearer(token) });
    assert.equal(res.statusCode, 200);
    assert.deepEqual(res.json(), { input: 8 });
    const left = outputTree(path.join(env.outputsRoot, taskId)).filter((p) => p.endsWith("out.json"));
    assert.equal(left.length, 1, `one attempt's outputs remain: ${left.join(", ")}`);
  });
});

/** The fields of a handler's outcome that a completion records. */
function outcomeFields(o: HandlerOutcome): Omit<Outcome, "id" | "token"> {
  const decided = decide(
    { id: 0, leaseToken: "", attempt: 1, maxAttempts: 1 } as ClaimedRun,
    undefined,
    o,
    0,
  );
  assert.equal(decided.kind, "complete");
  if (decided.kind !== "complete") throw new Error("not a completion");
  const { id: _id, token: _token, ...rest } = decided.outcome;
  return rest;
}
