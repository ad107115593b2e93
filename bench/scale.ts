// Capacity: 1, 2, 4 and 8 worker processes (4 slots each) on one PostgreSQL drain N runs whose handler
// waits 20 ms without using the CPU, so what grows with the fleet is the queue's own cost. One JSON line
// per shape: runs/s, PostgreSQL CPU milliseconds per run (all its processes, from /proc), connections
// in use at the end; then a line with the ratio of PostgreSQL CPU per run between 8 processes and 1
// (target ≤ 1.2).
//
//   BENCH_SCALE_N=20000 BENCH_SCALE_WORKERS=1,2,4,8 node --import tsx bench/scale.ts
import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import postgres from "postgres";
import { taskCreate } from "../src/tasks/create.ts";
import { benchDatabase } from "./lib/db.ts";
import { seedOwnerAndFiles } from "./lib/drain.ts";

const N = Number(process.env.BENCH_SCALE_N ?? 20_000);
const SHAPES = (process.env.BENCH_SCALE_WORKERS ?? "1,2,4,8").split(",").map(Number);
const SLOTS = 4;
const HERE = path.dirname(fileURLToPath(import.meta.url));

function startWorker(url: string): Promise<ChildProcess> {
  const child = spawn(process.execPath, ["--import", "tsx", path.join(HERE, "lib/sleep-worker.ts")], {
    env: { ...process.env, DATABASE_URL: url, BENCH_SLOTS: String(SLOTS) },
    stdio: ["ignore", "pipe", "inherit"],
  });
  return new Promise((resolve, reject) => {
    child.stdout?.on("data", (chunk: Buffer) => {
      if (chunk.toString().includes("ready")) resolve(child);
    });
    child.once("exit", (code) => reject(new Error(`a bench worker exited (${code})`)));
  });
}

async function stopAll(children: ChildProcess[]): Promise<void> {
  await Promise.all(
    children.map(
      (c) =>
        new Promise<void>((resolve) => {
          c.removeAllListeners("exit");
          c.once("exit", () => resolve());
          c.kill("SIGTERM");
        }),
    ),
  );
}

const db = await benchDatabase();
const sql = postgres(db.url, { max: 2, onnotice: () => {} });
const results: { workers: number; pgCpuMsPerRun: number }[] = [];
try {
  const { owner, fileIds } = await seedOwnerAndFiles(sql, "bench-scale", N);
  for (const workers of SHAPES) {
    const children = await Promise.all(Array.from({ length: workers }, () => startWorker(db.url)));
    // Everyone is idle and listening: measure from the moment the work arrives.
    const cpu0 = db.serverCpuMs();
    const t0 = performance.now();
    const created = await taskCreate(sql, owner, {
      analysisType: "sleep",
      fileIds,
      parameters: {},
      maxAttempts: 3,
    });
    if (created.kind !== "created") throw new Error(`create failed: ${created.kind}`);
    for (;;) {
      const [t] = await sql<{ status: string }[]>`select status from tasks where id = ${created.taskId}`;
      if (t?.status === "succeeded") break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const seconds = (performance.now() - t0) / 1000;
    const cpu1 = db.serverCpuMs();
    const [conn] = await sql<{ n: number }[]>`
      select count(*)::int as n from pg_stat_activity where datname = current_database()`;
    const [check] = await sql<{ counted: number; actual: number }[]>`
      select t.succeeded_count as counted,
             (select count(*)::int from runs r where r.task_id = t.id and r.status = 'succeeded') as actual
      from tasks t where t.id = ${created.taskId}`;
    await stopAll(children);
    const pgCpuMsPerRun =
      cpu0 === undefined || cpu1 === undefined ? Number.NaN : Math.round(((cpu1 - cpu0) / N) * 1000) / 1000;
    results.push({ workers, pgCpuMsPerRun });
    console.log(
      JSON.stringify({
        workload: "scale",
        workers,
        slots: workers * SLOTS,
        N,
        handlerMs: 20,
        seconds: Math.round(seconds * 100) / 100,
        rate: Math.round(N / seconds),
        ceiling: Math.round((workers * SLOTS * 1000) / 20),
        pgCpuMsPerRun,
        connections: conn?.n,
        ok: check?.counted === N && check?.actual === N,
      }),
    );
    // The next shape starts from an empty queue: drop this task's rows (and their dead tuples' cost).
    await sql`delete from tasks where id = ${created.taskId}`;
    await sql`vacuum analyze runs`;
    await sql`vacuum analyze tasks`;
    await sql`vacuum analyze task_events`;
  }
  const first = results[0];
  const last = results.at(-1);
  if (first && last && first !== last) {
    console.log(
      JSON.stringify({
        workload: "scale:ratio",
        from: first.workers,
        to: last.workers,
        pgCpuPerRunRatio: Math.round((last.pgCpuMsPerRun / first.pgCpuMsPerRun) * 100) / 100,
        target: 1.2,
      }),
    );
  }
} finally {
  await sql.end({ timeout: 5 });
  await db.stop();
}
