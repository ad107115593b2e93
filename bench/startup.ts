// Start-up benchmark (issue 18, target 4): how soon a freshly exec'd process is useful, and what it
// weighs when idle. One JSON line per workload:
//   startup:worker  `assay worker` exec → its first claim of a run queued before it started (the run
//                   leaves `queued`; polled every 2 ms), target ≤ 400 ms; idle_rss_mib: a worker with
//                   nothing to do, 2 s after it registered (target ≤ 90)
//   startup:api     `assay api` exec → the first 200 from /readyz (polled every 5 ms), target ≤ 600 ms;
//                   rss_mib once ready
// `bundled`: whether bin/assay.js ran the bundle (ASSAY_BUNDLE=0: the sources). Each is started BENCH_STARTUP_N times (10) after two unreported starts (which fill Node's compile
// cache, as any second start of an installation finds it).
import { type ChildProcess, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { bundleEntry } from "../bin/bundle.js";
import { serverNodeFlags } from "../bin/node-flags.js";
import { createDatabase } from "../src/db/client.ts";
import { freePort } from "../src/db/embedded.ts";
import { taskCreate } from "../src/tasks/create.ts";
import { benchDatabase, report } from "./lib/db.ts";
import { seedOwnerAndFiles } from "./lib/drain.ts";

const N = Number(process.env.BENCH_STARTUP_N ?? 10);
const WARMUP = 2;
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const bin = path.join(root, "bin/assay.js");

const bench = await benchDatabase();
const { sql, close } = createDatabase(bench.url, { max: 2 });
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bench-startup-"));
const env = {
  PATH: process.env.PATH ?? "",
  DATABASE_URL: bench.url,
  ASSAY_DATA_DIR: dataDir,
  HOST: "127.0.0.1",
  LOG_LEVEL: "warn",
  // The reaper's first pass and the poll would otherwise be part of what is timed.
  ASSAY_POLL_INTERVAL_MS: "60000",
  // bin/assay.js re-executes server commands with Node flags (bin/node-flags.js): `0` measures without.
  ...(process.env.ASSAY_NODE_FLAGS === undefined ? {} : { ASSAY_NODE_FLAGS: process.env.ASSAY_NODE_FLAGS }),
  // bin/assay.js runs the bundle when it is current (bin/bundle.js): `ASSAY_BUNDLE=0` measures the sources.
  ...(process.env.ASSAY_BUNDLE === undefined ? {} : { ASSAY_BUNDLE: process.env.ASSAY_BUNDLE }),
  ...(process.env.ASSAY_BUNDLE_DIR === undefined ? {} : { ASSAY_BUNDLE_DIR: process.env.ASSAY_BUNDLE_DIR }),
};
const nodeFlags = {
  worker: serverNodeFlags(env, "worker").join(" "),
  api: serverNodeFlags(env, "api").join(" "),
};
const bundled = bundleEntry(env) !== undefined;

function rssMib(pid: number): number {
  const status = fs.readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1]);
  return Math.round((kb / 1024) * 10) / 10;
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const closed = new Promise((r) => child.once("close", r));
  child.kill("SIGTERM");
  await closed;
}

async function until(check: () => Promise<boolean>, everyMs: number, what: string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

try {
  const { owner, fileIds } = await seedOwnerAndFiles(sql, "bench-startup", WARMUP + N);

  // startup:worker — a run is queued, then the worker is exec'd.
  const claims: number[] = [];
  for (let i = 0; i < WARMUP + N; i++) {
    const created = await taskCreate(sql, owner, {
      analysisType: "summary",
      fileIds: [fileIds[i] as string],
      parameters: {},
      maxAttempts: 1,
    });
    if (created.kind !== "created") throw new Error("create failed");
    const t0 = performance.now();
    const worker = spawn(process.execPath, [bin, "worker"], { env, stdio: ["ignore", "ignore", "inherit"] });
    try {
      await until(
        async () =>
          (await sql`select 1 from runs where task_id = ${created.taskId} and status <> 'queued'`).length > 0,
        2,
        "the first claim",
      );
      if (i >= WARMUP) claims.push(performance.now() - t0);
    } finally {
      await stop(worker);
    }
  }
  // Idle: nothing queued; registered, then 2 s of nothing.
  await sql`delete from workers`;
  const idle = spawn(process.execPath, [bin, "worker"], { env, stdio: ["ignore", "ignore", "inherit"] });
  let idleRss = Number.NaN;
  try {
    await until(async () => (await sql`select 1 from workers`).length > 0, 20, "the worker's registration");
    await new Promise((r) => setTimeout(r, 2000));
    idleRss = rssMib(idle.pid as number);
  } finally {
    await stop(idle);
  }
  const claimP50 = [...claims].sort((a, b) => a - b)[Math.floor(claims.length / 2)] as number;
  report("startup:worker", N, 1, claims.reduce((a, b) => a + b, 0) / 1000, claims, true, {
    idle_rss_mib: idleRss,
    target_first_claim_400ms: claimP50 <= 400,
    target_idle_rss_90mib: idleRss <= 90,
    nodeFlags: nodeFlags.worker,
    bundled,
    note: "latencies: exec → first claim",
  });

  // startup:api — exec → /readyz 200.
  const ready: number[] = [];
  let apiRss = Number.NaN;
  for (let i = 0; i < WARMUP + N; i++) {
    const port = await freePort();
    const t0 = performance.now();
    const api = spawn(process.execPath, [bin, "api"], {
      env: { ...env, PORT: String(port) },
      stdio: ["ignore", "ignore", "inherit"],
    });
    try {
      await until(
        () =>
          fetch(`http://127.0.0.1:${port}/readyz`).then(
            (r) => r.ok,
            () => false,
          ),
        5,
        "the API's readiness",
      );
      if (i >= WARMUP) ready.push(performance.now() - t0);
      if (i === WARMUP + N - 1) apiRss = rssMib(api.pid as number);
    } finally {
      await stop(api);
    }
  }
  const readyP50 = [...ready].sort((a, b) => a - b)[Math.floor(ready.length / 2)] as number;
  report("startup:api", N, 1, ready.reduce((a, b) => a + b, 0) / 1000, ready, true, {
    rss_mib: apiRss,
    target_ready_600ms: readyP50 <= 600,
    nodeFlags: nodeFlags.api,
    bundled,
    note: "latencies: exec → /readyz 200",
  });
} finally {
  await close();
  await bench.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
}
