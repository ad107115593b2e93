// SSE benchmark (issue 5): 1,000 concurrent subscribers on one API process to one task while events
// are committed at 10/s; latency from commit to client receipt, and the API process's RSS.
import { type ChildProcess, spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { tokenCreate } from "../src/auth/tokens.ts";
import { createDatabase } from "../src/db/client.ts";
import { notifyEvents } from "../src/queue/sql.ts";
import { benchDatabase, report } from "./lib/db.ts";

const SUBSCRIBERS = Number(process.env.BENCH_SSE_N ?? 1000);
const RATE = 10;
const SECONDS = Number(process.env.BENCH_SSE_SECONDS ?? 10);
const CLIENT_PROCESSES = Number(process.env.BENCH_SSE_CLIENT_PROCESSES ?? 1);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

const bench = await benchDatabase();
const { sql, close } = createDatabase(bench.url);
const api = spawn(process.execPath, [path.join(root, "bin/assay.js"), "api"], {
  env: {
    ...process.env,
    DATABASE_URL: bench.url,
    PORT: "0",
    LOG_LEVEL: "warn",
    ASSAY_SSE_HEARTBEAT_MS: "15000",
    // Every subscriber is the one bench user's.
    ASSAY_SSE_MAX_STREAMS_PER_USER: "0",
  },
  // Its stdout unread would fill the pipe and stall the server: the port comes from /proc instead.
  stdio: ["ignore", "ignore", "inherit"],
});
/** The client processes, ended in the finally below whatever happened. */
const clientProcesses: ChildProcess[] = [];
// Listened for from the start: an API that exits early (before the finally below) must not leave
// the benchmark waiting for a close that has already happened.
const apiClosed = new Promise((r) => api.on("close", r));
try {
  // LOG_LEVEL=warn hides "listening": find the port from the process's sockets instead.
  const port = await new Promise<number>((resolve, reject) => {
    const deadline = Date.now() + 30_000;
    const poll = () => {
      const tcp = fs.readFileSync("/proc/net/tcp", "utf8").split("\n");
      const inodes = new Set(
        fs.readdirSync(`/proc/${api.pid}/fd`).map((fd) => {
          try {
            return /socket:\[(\d+)\]/.exec(fs.readlinkSync(`/proc/${api.pid}/fd/${fd}`))?.[1];
          } catch {
            return undefined;
          }
        }),
      );
      for (const line of tcp) {
        const f = line.trim().split(/\s+/);
        if (f[3] === "0A" && inodes.has(f[9]))
          return resolve(Number.parseInt(f[1]?.split(":")[1] ?? "0", 16));
      }
      if (Date.now() > deadline) reject(new Error("api did not listen"));
      else setTimeout(poll, 200);
    };
    poll();
  });
  const base = `http://127.0.0.1:${port}`;
  const [user] = await sql<
    { id: number }[]
  >`insert into users (name, role) values ('sse-bench', 'admin') returning id::float8`;
  const { token } = await tokenCreate(sql, "sse-bench");
  const [task] = await sql<{ id: string }[]>`
    insert into tasks (owner_id, analysis_type, total_count) values (${user?.id as number}, 'sse-bench', 1) returning id::text`;
  const taskId = task?.id as string;

  // Clients in their own processes (as real clients are): one process parsing a thousand streams
  // would measure its own event loop more than the server.
  const received = new Map<string, number[]>(); // event id → receipt times (epoch ms)
  const clients = Array.from({ length: CLIENT_PROCESSES }, (_, i) => {
    const n = Math.floor(SUBSCRIBERS / CLIENT_PROCESSES) + (i < SUBSCRIBERS % CLIENT_PROCESSES ? 1 : 0);
    const child = spawn(
      process.execPath,
      [
        "--import",
        "tsx",
        path.join(root, "bench/lib/sse-clients.ts"),
        `${base}/api/analysis-tasks/${taskId}/events`,
        token,
        String(n),
      ],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    clientProcesses.push(child);
    let out = "";
    child.stdout.on("data", (c: Buffer) => (out += c.toString()));
    const ready = new Promise<void>((resolve, reject) => {
      const check = () => {
        if (out.includes("ready\n")) resolve();
        // It ended without connecting (its error is on stderr): fail rather than wait forever.
        else if (child.exitCode !== null || child.signalCode !== null)
          reject(new Error(`an SSE client process exited before its streams were open`));
        else setTimeout(check, 50);
      };
      check();
    });
    const results = new Promise<void>((resolve) =>
      child.on("close", () => {
        const line = out.split("\n").find((l) => l.startsWith("{"));
        const parsed = line ? (JSON.parse(line) as { received: Record<string, number[]> }) : { received: {} };
        for (const [id, times] of Object.entries(parsed.received))
          received.set(id, [...(received.get(id) ?? []), ...times]);
        resolve();
      }),
    );
    return { child, ready, results, n };
  });
  await Promise.all(clients.map((c) => c.ready));
  const connected = clients.reduce((a, c) => a + c.n, 0);
  const epochNow = () => performance.timeOrigin + performance.now();

  const committed = new Map<string, number>();
  const interval = 1000 / RATE;
  for (let i = 0; i < RATE * SECONDS; i++) {
    const started = performance.now();
    const [row] = await sql<{ id: string }[]>`
      with events as (
        insert into task_events (task_id, type, data)
        values (${taskId}, 'run.progress', jsonb_build_object('percent', ${i % 100}::int, 'message', 'bench'))
        returning id, task_id, run_id, type, data, created_at
      ),
      ${notifyEvents(sql)}
      select (select id::text from events) as id, (select count(*) from notified) as n`;
    committed.set(row?.id as string, epochNow());
    await new Promise((r) => setTimeout(r, Math.max(0, interval - (performance.now() - started))));
  }
  await new Promise((r) => setTimeout(r, 1000));
  for (const c of clients) c.child.kill("SIGTERM");
  // A client process prints its results and exits on SIGTERM; one that has not within 10 s is killed,
  // and the benchmark fails saying so.
  const stuck = setTimeout(() => {
    for (const c of clients)
      if (c.child.exitCode === null && c.child.signalCode === null) {
        process.stderr.write("an SSE client process did not exit within 10 s of SIGTERM; killed\n");
        process.exitCode = 1;
        c.child.kill("SIGKILL");
      }
  }, 10_000);
  await Promise.all(clients.map((c) => c.results));
  clearTimeout(stuck);
  const rssKb = Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${api.pid}/status`, "utf8"))?.[1] ?? 0);
  const latencies: number[] = [];
  let delivered = 0;
  for (const [id, at] of committed) {
    for (const t of received.get(id) ?? []) {
      latencies.push(t - at);
      delivered++;
    }
  }
  const expected = committed.size * SUBSCRIBERS;
  report("sse", SUBSCRIBERS, RATE, SECONDS, latencies, delivered === expected && connected === SUBSCRIBERS, {
    note: "N subscribers, C events/s; latencies: commit → client receipt",
    clientProcesses: CLIENT_PROCESSES,
    delivered,
    expected,
    apiRssMiB: Math.round(rssKb / 1024),
  });
} finally {
  for (const c of clientProcesses) c.kill("SIGKILL");
  api.kill("SIGTERM");
  // The API bounds its own shutdown (its grace period and 15 s more: src/cli/serve.ts); one still
  // running after 60 s is killed, and the benchmark fails saying so.
  const kill = setTimeout(() => {
    process.stderr.write("the API did not exit within 60 s of SIGTERM; killed\n");
    process.exitCode = 1;
    api.kill("SIGKILL");
  }, 60_000);
  await apiClosed;
  clearTimeout(kill);
  await close();
  await bench.stop();
}
