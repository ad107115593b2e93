// A task over 100,000 files, end to end through a real `assay api` and two worker processes (the
// production worker with a handler that stores a small result.json and waits BENCH_BIG_HANDLER_MS):
// create (HTTP request → 201), the task and the task list read while it drains (p50/p99), cancel of the
// whole task once about a third has run (request → response, and → every run ended), then its event
// log and runs paged through to the end, and its zip streamed whole; the API's and workers' peak RSS
// throughout (sampled every 50 ms) and per phase (create, drain, cancel, logs, runs, zip). One JSON
// line per measure.
//
//   BENCH_BIG_N=100000 node --import tsx bench/big-task.ts
import { type ChildProcess, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import postgres from "postgres";
import { serverNodeFlags } from "../bin/node-flags.js";
import { tokenCreate } from "../src/auth/tokens.ts";
import { freePort } from "../src/db/embedded.ts";
import { benchDatabase, report } from "./lib/db.ts";

const N = Number(process.env.BENCH_BIG_N ?? 100_000);
const HANDLER_MS = Number(process.env.BENCH_BIG_HANDLER_MS ?? 2);
const SLOTS = 8;
/** The longest any wait of the run may take (the drain to a third, the cancel to end) before it fails. */
const WAIT_MS = Number(process.env.BENCH_BIG_WAIT_MS ?? 600_000);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN = path.join(HERE, "..", "bin", "assay.js");

const bench = await benchDatabase();
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bench-big-"));
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const env = {
  ...process.env,
  DATABASE_URL: bench.url,
  ASSAY_DATA_DIR: dataDir,
  HOST: "127.0.0.1",
  PORT: String(port),
  LOG_LEVEL: "warn",
};
const children: ChildProcess[] = [];
// The workers are bench/lib/sleep-worker.ts, not `assay worker`: they get the Node flags a server
// worker gets from bin/assay.js (ASSAY_NODE_FLAGS chooses them here too); the API gets its own by itself.
const nodeFlags = serverNodeFlags(process.env, "worker");

/**
 * Starts a process. Without `ready` (the API), its stdout — its log — goes to this process's stderr:
 * this stdout carries only JSON lines, and a pipe nobody read would block the API once its log
 * filled it. With `ready`, resolves when that appears on its stdout, which is read to the end.
 */
function start(args: string[], extra: Record<string, string>, ready?: RegExp): Promise<ChildProcess> {
  const flags = args[0] === BIN ? [] : nodeFlags;
  const child = spawn(process.execPath, [...flags, ...args], {
    env: { ...env, ...extra },
    stdio: ["ignore", ready ? "pipe" : process.stderr, "inherit"],
  });
  children.push(child);
  if (!ready) return Promise.resolve(child);
  return new Promise((resolve, reject) => {
    let out = "";
    child.stdout?.on("data", (c: Buffer) => {
      out += c.toString();
      if (ready.test(out)) resolve(child);
    });
    child.once("exit", (code) => reject(new Error(`${args.join(" ")} exited (${code})`)));
  });
}

/** Fails the run, naming `what`, when a process it started has exited or `deadline` has passed. */
function check(what: string, deadline: number): void {
  const gone = children.find((c) => c.exitCode !== null || c.signalCode !== null);
  if (gone)
    throw new Error(
      `waiting for ${what}: ${gone.spawnargs.slice(-2).join(" ")} exited (${gone.exitCode ?? gone.signalCode})`,
    );
  if (performance.now() > deadline) throw new Error(`waiting for ${what}: no end after ${WAIT_MS} ms`);
}

/** Resident set size of a process in MiB, from /proc. */
function rssMiB(pid: number | undefined): number {
  try {
    const status = fs.readFileSync(`/proc/${pid}/status`, "utf8");
    return Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0) / 1024;
  } catch {
    return 0;
  }
}

type Phase = "create" | "drain" | "cancel" | "logs" | "runs" | "zip";
const peaks = { api: 0, workers: 0 };
const phasePeaks: Partial<Record<Phase, { api: number; workers: number }>> = {};
let phase: Phase = "create";
let api: ChildProcess | undefined;
/** Samples both peaks, overall and of the current phase. */
const sample = () => {
  const a = rssMiB(api?.pid);
  let w = 0;
  for (const c of children.slice(1)) w = Math.max(w, rssMiB(c.pid));
  peaks.api = Math.max(peaks.api, a);
  peaks.workers = Math.max(peaks.workers, w);
  const p = phasePeaks[phase] ?? { api: 0, workers: 0 };
  phasePeaks[phase] = { api: Math.max(p.api, a), workers: Math.max(p.workers, w) };
};
const sampler = setInterval(sample, 50);
/** Ends the current phase with a last sample and starts the next. */
const enter = (next: Phase) => {
  sample();
  phase = next;
};

const sql = postgres(bench.url, { max: 4, onnotice: () => {} });
try {
  api = await start([BIN, "api"], {});
  await waitReady();
  const { token, userId } = await tokenCreate(sql, "big", "user");
  const auth = { authorization: `Bearer ${token}` };
  await sql`
    with next as (select nextval(pg_get_serial_sequence('files', 'id')) as id from generate_series(1, ${N}))
    insert into files (id, owner_id, name, content_type, size_bytes, sha256, storage_key)
    select id, ${userId}, 'f-' || id || '.csv', 'text/csv', 10, repeat('0', 64), 'files/' || id from next`;
  const fileIds = (
    await sql<{ id: string }[]>`select id::text from files where owner_id = ${userId} order by id`
  ).map((r) => r.id);
  await sql`vacuum analyze`;

  // create: one HTTP request with N file ids.
  let t0 = performance.now();
  const created = await fetch(`${base}/api/analysis-tasks`, {
    method: "POST",
    headers: { ...auth, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileIds: fileIds }),
  });
  const createMs = performance.now() - t0;
  const taskId = ((await created.json()) as { data: { taskId: string } }).data.taskId;
  report("big:create", N, 1, createMs / 1000, [createMs], created.status === 201, {
    target_ms: 3000,
    note: "POST with N file ids → 201",
  });

  // Drain with two worker processes while reading the task and the list, and sampling RSS.
  enter("drain");
  const workerEnv = {
    BENCH_TYPE: "summary",
    BENCH_OUTPUTS: "1",
    BENCH_HANDLER_MS: String(HANDLER_MS),
    BENCH_SLOTS: String(SLOTS),
  };
  const sleepWorker = path.join(HERE, "lib/sleep-worker.ts");
  await Promise.all([start([sleepWorker], workerEnv, /ready/), start([sleepWorker], workerEnv, /ready/)]);
  const taskReads: number[] = [];
  const listReads: number[] = [];
  let done = 0;
  t0 = performance.now();
  while (done < N / 3) {
    check(`a third of the runs to succeed (${done} so far)`, t0 + WAIT_MS);
    sample();
    let s = performance.now();
    const res = await fetch(`${base}/api/analysis-tasks/${taskId}`, { headers: auth });
    const task = ((await res.json()) as { data: { succeededCount: number } }).data;
    taskReads.push(performance.now() - s);
    done = task.succeededCount;
    s = performance.now();
    await (await fetch(`${base}/api/analysis-tasks?limit=20`, { headers: auth })).arrayBuffer();
    listReads.push(performance.now() - s);
  }
  const drainSeconds = (performance.now() - t0) / 1000;
  report("big:read-task", taskReads.length, 1, drainSeconds, taskReads, true, {
    target_p99_ms: 50,
    drained: done,
    drainRate: Math.round(done / drainSeconds),
    note: "GET /api/analysis-tasks/:id while the task drains",
  });
  report("big:read-list", listReads.length, 1, drainSeconds, listReads, true, {
    note: "GET /api/analysis-tasks?limit=20 meanwhile",
  });

  // cancel the whole task.
  enter("cancel");
  t0 = performance.now();
  const cancel = await fetch(`${base}/api/analysis-tasks/${taskId}/cancel`, {
    method: "POST",
    headers: auth,
  });
  const cancelMs = performance.now() - t0;
  for (;;) {
    check("the cancelled task to end", t0 + WAIT_MS);
    sample();
    const [t] = await sql<{ status: string }[]>`select status from tasks where id = ${taskId}`;
    if (t?.status === "cancelled") break;
    await new Promise((r) => setTimeout(r, 20));
  }
  const endedMs = performance.now() - t0;
  const [counts] = await sql<{ succeeded: number; cancelled: number; total: number; events: number }[]>`
    select t.succeeded_count as succeeded, t.cancelled_count as cancelled, t.total_count as total,
           (select count(*)::int from task_events e where e.task_id = t.id) as events
    from tasks t where t.id = ${taskId}`;
  const exact = counts !== undefined && counts.succeeded + counts.cancelled === counts.total;
  report("big:cancel", N, 1, cancelMs / 1000, [cancelMs, endedMs], cancel.ok && exact, {
    target_ms: 2000,
    endedMs: Math.round(endedMs),
    succeeded: counts?.succeeded,
    cancelled: counts?.cancelled,
    note: "POST …/cancel → response; endedMs: → the task is cancelled",
  });

  // The event log, every page.
  enter("logs");
  t0 = performance.now();
  let logged = 0;
  let after = "0";
  let ordered = true;
  for (;;) {
    sample();
    const page = (
      (await (
        await fetch(`${base}/api/analysis-tasks/${taskId}/logs?limit=1000&after=${after}`, { headers: auth })
      ).json()) as {
        data: { items: { id: string }[]; nextCursor: string | null };
      }
    ).data;
    for (const e of page.items) {
      if (BigInt(e.id) <= BigInt(after)) ordered = false;
      after = e.id;
    }
    logged += page.items.length;
    if (!page.nextCursor) break;
  }
  const logSeconds = (performance.now() - t0) / 1000;
  report("big:logs", logged, 1, logSeconds, [], ordered && logged === counts?.events, {
    events: counts?.events,
    note: "GET …/logs?limit=1000 to the end: every event once, in order",
  });

  // The runs, every page.
  enter("runs");
  t0 = performance.now();
  let runs = 0;
  let cursor: string | null = null;
  const runPages: number[] = [];
  do {
    sample();
    const s = performance.now();
    const page: { items: unknown[]; nextCursor: string | null } = (
      (await (
        await fetch(
          `${base}/api/analysis-tasks/${taskId}/runs?limit=100${cursor ? `&cursor=${cursor}` : ""}`,
          {
            headers: auth,
          },
        )
      ).json()) as { data: { items: unknown[]; nextCursor: string | null } }
    ).data;
    runPages.push(performance.now() - s);
    runs += page.items.length;
    cursor = page.nextCursor;
  } while (cursor);
  report("big:runs", runPages.length, 1, (performance.now() - t0) / 1000, runPages, runs === N, {
    runs,
    note: "GET …/runs?limit=100, every page",
  });

  // The zip, streamed whole.
  enter("zip");
  t0 = performance.now();
  const zip = await fetch(`${base}/api/analysis-tasks/${taskId}/download`, { headers: auth });
  let bytes = 0;
  for await (const chunk of zip.body as AsyncIterable<Uint8Array>) bytes += chunk.length;
  const zipSeconds = (performance.now() - t0) / 1000;
  report("big:zip", counts?.succeeded ?? 0, 1, zipSeconds, [], zip.ok && bytes > 0, {
    mib: Number((bytes / 1024 / 1024).toFixed(1)),
    runsPerSecond: Math.round((counts?.succeeded ?? 0) / zipSeconds),
    note: "the zip of every succeeded run's output, read to the end",
  });
  sample();
  clearInterval(sampler);
  const byPhase = Object.fromEntries(
    Object.entries(phasePeaks).map(([k, v]) => [
      k,
      { api: Math.round(v.api), workers: Math.round(v.workers) },
    ]),
  );
  report("big:rss", 1, 1, 0, [], peaks.api <= 200 && peaks.workers <= 200, {
    apiPeakMiB: Math.round(peaks.api),
    workerPeakMiB: Math.round(peaks.workers),
    target_mib: 200,
    nodeFlags: nodeFlags.join(" "),
    apiNodeFlags: serverNodeFlags(process.env, "api").join(" "),
    byPhase,
    note: "peak RSS (MiB) overall and per phase, sampled every 50 ms",
  });
} finally {
  clearInterval(sampler);
  // Each process ends by itself after SIGTERM, bounded; one that does not is killed, and said so.
  await Promise.all(
    children.map(async (c) => {
      if (c.exitCode !== null || c.signalCode !== null) return;
      const exited = new Promise((r) => c.once("exit", r));
      c.kill("SIGTERM");
      const timer = setTimeout(() => {
        process.stderr.write(`${c.spawnargs.slice(-2).join(" ")} did not exit 30 s after SIGTERM: killed\n`);
        c.kill("SIGKILL");
      }, 30_000);
      await exited;
      clearTimeout(timer);
    }),
  );
  await sql.end({ timeout: 5 });
  await bench.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
}

async function waitReady(): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const ok = await fetch(`${base}/readyz`, { signal: AbortSignal.timeout(2_000) }).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("the API is not ready");
}
