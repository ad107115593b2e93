// Queue benchmark (issue 3): create, drain and pickup latency of Assay's queue with a no-op handler,
// next to graphile-worker 0.18 (localQueue + batched completion, each job incrementing a parent
// counter) on the same PostgreSQL in the same run. One JSON line per workload.
//
//   npx tsx bench/queue.ts              # throwaway embedded PostgreSQL (fsync on)
//   DATABASE_URL=postgres://… npx tsx bench/queue.ts   # an empty database; it is migrated
import { fork } from "node:child_process";
import { once } from "node:events";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { run as graphileRun, Logger, makeWorkerUtils } from "graphile-worker";
import { loadConfig } from "../src/config.ts";
import { createDatabase } from "../src/db/client.ts";
import { createLogger } from "../src/log.ts";
import { Worker } from "../src/queue/worker.ts";
import { taskCancel } from "../src/tasks/cancel.ts";
import { taskCreate } from "../src/tasks/create.ts";
import { benchDatabase, checkpoint, percentile, report } from "./lib/db.ts";
import { createNoopTask, drainTask, drainTasks, seedOwnerAndFiles, seedUsersAndFiles } from "./lib/drain.ts";

const N = Number(process.env.BENCH_N ?? 10_000);
const C = 10;
/**
 * The fixed prefetch of `drain:prefetch` (the Worker's `prefetch`; ASSAY_PREFETCH for `assay worker`),
 * the setting's maximum: the queue's ceiling with in-process handlers under a millisecond, not a
 * setting for analysis programs. The drain's claims are serial (a claim of k runs takes ~0.5 ms + ~20
 * µs per run in PostgreSQL, and the worker starts them in a fraction of that), so runs/s grow with k;
 * 1,000 keeps claims of ~500 (docs/architecture.md, Capacity).
 */
const DOCUMENTED_PREFETCH = 1000;
const LATENCY_TASKS = Number(process.env.BENCH_LATENCY_N ?? 200);
/** Runs (jobs) drained before measuring, unreported, by Assay and graphile-worker alike. */
const WARMUP = Number(process.env.BENCH_WARMUP ?? 1000);
const logger = createLogger({ level: "warn", destination: process.stderr });
/**
 * Runs are claimed and outcomes recorded as `assay worker` does: with the configured automatic
 * prefetch and completion delay.
 */
const { completionDelayMs, prefetchWindowMs } = loadConfig();
/** drain:fair: users, one task each, N runs in all. */
const FAIR_USERS = 100;
/**
 * drain:fair: pairs of a single-task drain and a fair drain, which goes first alternating. Six, three
 * of each order (one pair's ratio moved between 0.77 and 1.2 within a run, 2026-12-04, and with five
 * the order the median fell on was the slower one's); `vsDrain` is the lower of the middle two.
 */
const FAIR_PAIRS = Number(process.env.BENCH_FAIR_PAIRS ?? 6);
/** pickup:fair: A's task, and B's samples taken while it drains. */
const FAIR_BIG = Number(process.env.BENCH_FAIR_BIG ?? 20_000);
const FAIR_SAMPLES = 100;
/** The `p`th percentile of `xs` (unsorted). */
const pct = (xs: number[], p: number) =>
  percentile(
    [...xs].sort((a, b) => a - b),
    p,
  );
/** Now on the system's monotonic clock, in ms: the pickup worker's process reads the same clock. */
const hrMs = () => Number(process.hrtime.bigint()) / 1e6;
const HERE = path.dirname(fileURLToPath(import.meta.url));

/** Until `n` runs of the task are done (the drain has reached its steady state). */
async function waitForRunsDone(sql: typeof db.sql, taskId: string, n: number): Promise<void> {
  for (;;) {
    const [t] = await sql<
      { done: number }[]
    >`select succeeded_count::int as done from tasks where id = ${taskId}`;
    if ((t?.done ?? 0) >= n) return;
    await new Promise((res) => setTimeout(res, 5));
  }
}

const bench = await benchDatabase();
const db = createDatabase(bench.url, { max: 10 });
const sql = db.sql;

try {
  const { owner, fileIds } = await seedOwnerAndFiles(sql, "bench", N);
  await sql`vacuum analyze`;

  // Warm-up: the first runs pay for JIT compilation and cold caches in both systems.
  if (WARMUP > 0) {
    const warm = fileIds.slice(0, WARMUP);
    await drainTask(sql, await createNoopTask(sql, owner, warm), warm.length, C);
    await sql`vacuum analyze`;
  }

  // create: one task of N runs.
  let t0 = performance.now();
  const first = await createNoopTask(sql, owner, fileIds);
  const createSeconds = (performance.now() - t0) / 1000;
  report("create", N, 1, createSeconds, [createSeconds * 1000], true);

  // drain: one worker, concurrency C, no-op handler, until the task is terminal; then the same with
  // a fixed prefetch of DOCUMENTED_PREFETCH (the queue's ceiling), and with 50 (DESIGN §4's figure,
  // the workload's setting before 2026-12-05).
  for (const [workload, prefetch] of [
    ["drain", 0],
    ["drain:prefetch", DOCUMENTED_PREFETCH],
    ["drain:prefetch:50", 50],
  ] as const) {
    const taskId = workload === "drain" ? first : await createNoopTask(sql, owner, fileIds);
    const d = await drainTask(sql, taskId, N, C, prefetch);
    report(workload, N, C, d.seconds, d.latencies, d.ok, {
      prefetch,
      // The automatic prefetch is on in both (as in `assay worker`); `prefetch` is ASSAY_PREFETCH.
      prefetchWindowMs,
      note: "latencies: claim → completion per run (finished_at: when the attempt ended)",
    });
  }
  // drain:fair — the same N runs spread over 100 users' tasks (fair share serves them in turn), against
  // the single-task drain (target ≥ 0.9×). In pairs, a single-task drain and a fair one back to back,
  // which goes first alternating (ABBA): this machine's speed drifts between workloads, and one pair's
  // ratio moved between 0.64 and 0.90 over a session, so the ratio reported is the median pair's.
  {
    const users = await seedUsersAndFiles(sql, "fair", FAIR_USERS, Math.ceil(N / FAIR_USERS));
    await sql`vacuum analyze`;
    const total = users.reduce((n, u) => n + u.fileIds.length, 0);
    // Each drain from a vacuumed table (as pgbench starts each run): the drain before it left 10,000
    // dead run versions and their index entries, and whichever went second in a pair paid for them —
    // pairs alternated 0.83 / 0.94 / 0.84 / 0.98 / 0.83 with the order (2026-12-05).
    const fairDrain = async () => {
      const tasks: string[] = [];
      for (const u of users) tasks.push(await createNoopTask(sql, u.owner, u.fileIds));
      await sql`vacuum analyze`;
      return drainTasks(sql, tasks, total, C);
    };
    const singleDrain = async () => {
      const task = await createNoopTask(sql, owner, fileIds);
      await sql`vacuum analyze`;
      return drainTask(sql, task, N, C);
    };
    const pairs: {
      fair: Awaited<ReturnType<typeof drainTasks>>;
      single: Awaited<ReturnType<typeof drainTask>>;
    }[] = [];
    for (let i = 0; i < FAIR_PAIRS; i++) {
      if (i % 2 === 0) {
        const single = await singleDrain();
        pairs.push({ single, fair: await fairDrain() });
      } else {
        const fair = await fairDrain();
        pairs.push({ fair, single: await singleDrain() });
      }
    }
    const ratios = pairs.map((p) => total / p.fair.seconds / (N / p.single.seconds));
    const fairSeconds = pairs.reduce((a, p) => a + p.fair.seconds, 0);
    report(
      "drain:fair",
      total * pairs.length,
      C,
      fairSeconds,
      pairs.flatMap((p) => p.fair.latencies),
      pairs.every((p) => p.fair.ok && p.single.ok),
      {
        users: FAIR_USERS,
        pairs: pairs.length,
        vsDrain: Number(pct(ratios, 50).toFixed(2)),
        perPair: ratios.map((r) => Number(r.toFixed(2))),
        singleRates: pairs.map((p) => Math.round(N / p.single.seconds)),
        note: "one task per user; vsDrain: the median pair's ratio to a single-task drain run beside it",
      },
    );
  }
  // pickup:fair — B's one-run tasks, one at a time, while A's FAIR_BIG-run task drains: create → B's
  // handler start. Without fair share B waits for A's whole backlog. The worker is its own process
  // (bench/lib/pickup-worker.ts) and this one creates, as `assay worker` and `assay api` are: in one
  // process the drain's claims and completions held the create's replies up in the event loop.
  // Twice: with A's runs as no-ops (the queue saturated: thousands of claims and completions a
  // second on two cores, the worst case for B's create commit) and with A's runs taking 20 ms on
  // average, as the shortest real analysis process would: 10–30 ms, since real runs vary (runs of one
  // exact length free their slots in lockstep once a prefetch refills them at once, and a B that
  // arrives right after a wave, as each sample does, would wait for the next whole wave). Beside
  // them, pickup:idle: the same samples with nothing else queued, the p99 the fair ones are set
  // against (target ≤ 2×). A's rest is cancelled after each, so no later workload drains it.
  let idleP99 = Number.NaN;
  for (const [workload, aMs] of [
    ["pickup:idle", -1],
    ["pickup:fair", 0],
    ["pickup:fair:20ms", 20],
  ] as const) {
    const [a] = aMs >= 0 ? await seedUsersAndFiles(sql, `${workload}-a`, 1, FAIR_BIG) : [];
    const [b] = await seedUsersAndFiles(sql, `${workload}-b`, 1, FAIR_SAMPLES);
    if ((aMs >= 0 && !a) || !b) throw new Error("seed failed");
    await sql`vacuum analyze`;
    const child = fork(path.join(HERE, "lib/pickup-worker.ts"), {
      execArgv: ["--import", "tsx"],
      env: { ...process.env, DATABASE_URL: bench.url, BENCH_SLOTS: String(C), BENCH_RUN_MS: String(aMs) },
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    const exited = once(child, "exit");
    let stopping = false;
    // Every wait on the worker is raced against this: a worker that dies fails the run, not hangs it.
    const died = exited.then(([code, signal]) => {
      if (!stopping) throw new Error(`the pickup worker exited (${code ?? signal}) during ${workload}`);
    });
    died.catch(() => {});
    const orDied = <T>(p: Promise<T>) => Promise.race([p, died.then(() => p)]);
    // Keyed by input file: B's handler may start before its create call has returned.
    const bFiles = new Map<string, (at: number) => void>();
    const ready = new Promise<void>((resolve) => {
      child.on("message", (m: { ready?: true; started?: string; at?: number }) => {
        if (m.ready) resolve();
        if (m.started !== undefined) bFiles.get(m.started)?.(m.at as number);
      });
    });
    try {
      child.send({ watch: b.fileIds });
      const big = a ? await createNoopTask(sql, a.owner, a.fileIds) : undefined;
      await checkpoint(sql);
      await orDied(ready);
      // (A quarter of A's task at most: at small BENCH_FAIR_BIG sizes the drain ends sooner.)
      if (big)
        await orDied(waitForRunsDone(sql, big, Math.min(aMs > 0 ? 200 : 1000, Math.floor(FAIR_BIG / 4))));
      const samples: number[] = [];
      const creates: number[] = [];
      for (const fileId of b.fileIds) {
        const started = new Promise<number>((resolve) => bFiles.set(fileId, resolve));
        const s0 = hrMs();
        const r = await taskCreate(sql, b.owner, {
          analysisType: "noop",
          fileIds: [fileId],
          parameters: {},
          maxAttempts: 3,
        });
        if (r.kind !== "created") throw new Error("create failed");
        creates.push(hrMs() - s0);
        samples.push((await orDied(started)) - s0);
        bFiles.delete(fileId);
        // Idle: the next sample once this one's outcome is recorded, as `latency` does.
        if (!big) await orDied(waitForRunsDone(sql, r.taskId, 1));
      }
      const [left] = big
        ? await sql<{ done: number }[]>`
          select (succeeded_count + failed_count)::int as done from tasks where id = ${big}`
        : [];
      stopping = true;
      child.send({ stop: true });
      // Bounded: a worker that does not stop within 30 s is killed, and the run fails.
      const late = setTimeout(() => child.kill("SIGKILL"), 30_000);
      const [code, signal] = await exited;
      clearTimeout(late);
      if (code !== 0) throw new Error(`the pickup worker did not stop cleanly (${code ?? signal})`);
      if (big && a) await taskCancel(sql, a.owner, big);
      const line = report(
        workload,
        samples.length,
        C,
        samples.reduce((x, y) => x + y, 0) / 1000,
        samples,
        !big || (left?.done ?? FAIR_BIG) < FAIR_BIG,
        {
          ...(big ? { bigTask: FAIR_BIG, bigRunMs: aMs, bigRunRangeMs: [aMs / 2, (aMs * 3) / 2] } : {}),
          ...(big ? { bigDoneAtEnd: left?.done } : {}),
          createP50Ms: Number(pct(creates, 50).toFixed(2)),
          createP99Ms: Number(pct(creates, 99).toFixed(2)),
          ...(big ? { vsIdleP99: Math.round((pct(samples, 99) / idleP99) * 100) / 100 } : {}),
          note: big
            ? "create → handler start of B's one-run tasks while A's task drains, the worker in its own process; vsIdleP99: this p99 over pickup:idle's (target ≤ 2); ok = A still draining at the end"
            : "create → handler start of one-run tasks with nothing else queued, the worker in its own process",
        },
      );
      if (!big) idleP99 = line.p99_ms;
    } finally {
      // On any failure above: the worker goes too (its IPC channel would keep this process alive).
      if (child.exitCode === null && child.signalCode === null) {
        stopping = true;
        child.kill("SIGKILL");
        await exited;
      }
    }
  }
  // graphile-worker 0.18 on the same database, jobs incrementing a parent counter.
  await sql`create table if not exists bench_parent (id int primary key, n int not null)`;
  await sql`insert into bench_parent values (1, 0) on conflict (id) do update set n = 0`;
  const utils = await makeWorkerUtils({ connectionString: bench.url, logger: new Logger(() => () => {}) });
  await utils.migrate();
  const graphileRunner = (onJob: () => void) =>
    graphileRun({
      connectionString: bench.url,
      concurrency: C,
      noHandleSignals: true,
      pollInterval: 2000,
      logger: new Logger(() => () => {}),
      taskList: {
        inc: async (_payload, helpers) => {
          onJob();
          await helpers.query("update bench_parent set n = n + 1 where id = 1");
        },
      },
      preset: { worker: { localQueue: { size: C + 1 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
    });
  if (WARMUP > 0) {
    const warm = await graphileRunner(() => {});
    await utils.addJobs(Array.from({ length: WARMUP }, () => ({ identifier: "inc", payload: {} })));
    for (;;) {
      const [left] = await sql`select count(*)::int as n from graphile_worker._private_jobs`;
      if (left?.n === 0) break;
      await new Promise((res) => setTimeout(res, 5));
    }
    await warm.stop();
    await sql`update bench_parent set n = 0 where id = 1`;
    await sql`vacuum analyze`;
  }
  t0 = performance.now();
  await utils.addJobs(Array.from({ length: N }, () => ({ identifier: "inc", payload: {} })));
  report("graphile:create", N, 1, (performance.now() - t0) / 1000, [performance.now() - t0], true);
  // As before each of Assay's drains (drainTasks).
  await checkpoint(sql);
  let onJob: (() => void) | undefined;
  const runner = await graphileRunner(() => onJob?.());
  t0 = performance.now();
  for (;;) {
    const [p] = await sql`select n from bench_parent where id = 1`;
    const [left] = await sql`select count(*)::int as n from graphile_worker._private_jobs`;
    if (p?.n === N && left?.n === 0) break;
    await new Promise((res) => setTimeout(res, 5));
  }
  const gDrain = (performance.now() - t0) / 1000;
  report("graphile:drain", N, C, gDrain, [], true);
  // latency, both systems at once: each idle worker LISTENs, and single-run tasks (jobs) are created
  // one at a time, alternating between the systems (ABBA), so both are measured under the same
  // conditions — sequential phases had put graphile-worker's after more autovacuum work had settled.
  await sql`vacuum analyze`;
  await checkpoint(sql);
  let handlerStarted: (() => void) | undefined;
  const worker = new Worker({
    sql,
    logger,
    types: {
      noop: {
        handler: async () => {
          handlerStarted?.();
          return { status: "succeeded" };
        },
      },
    },
    concurrency: C,
    leaseTtlMs: 30_000,
    pollIntervalMs: 2000,
    retryBaseMs: 1000,
    prefetchWindowMs,
    completionDelayMs,
  });
  await worker.start();
  const latencies: number[] = [];
  const gLatencies: number[] = [];
  const ours = async (i: number) => {
    const [f] = await sql<{ id: string }[]>`
      insert into files (owner_id, name, content_type, size_bytes, sha256, storage_key)
      values (${owner.userId}, 'l.csv', 'text/csv', 1, ${"0".repeat(64)}, ${`files/lat-${i}`}) returning id::text`;
    const started = new Promise<number>((resolve) => {
      handlerStarted = () => resolve(performance.now());
    });
    const s = performance.now();
    const r = await taskCreate(sql, owner, {
      analysisType: "noop",
      fileIds: [f?.id as string],
      parameters: {},
      maxAttempts: 3,
    });
    if (r.kind !== "created") throw new Error("create failed");
    latencies.push((await started) - s);
    handlerStarted = undefined;
    // Let the completion land so the worker is idle again before the next create.
    for (;;) {
      const [t] = await sql`select status from tasks where id = ${r.taskId}`;
      if (t?.status === "succeeded") break;
      await new Promise((res) => setTimeout(res, 1));
    }
  };
  const theirs = async () => {
    const started = new Promise<number>((resolve) => {
      onJob = () => resolve(performance.now());
    });
    const s = performance.now();
    await utils.addJob("inc", {});
    gLatencies.push((await started) - s);
    onJob = undefined;
    for (;;) {
      const [left] = await sql`select count(*)::int as n from graphile_worker._private_jobs`;
      if (left?.n === 0) break;
      await new Promise((res) => setTimeout(res, 1));
    }
  };
  for (let i = 0; i < LATENCY_TASKS; i++) {
    if (i % 2 === 0) {
      await ours(i);
      await theirs();
    } else {
      await theirs();
      await ours(i);
    }
  }
  report("latency", LATENCY_TASKS, 1, latencies.reduce((a, b) => a + b, 0) / 1000, latencies, true, {
    note: "create call start → handler start, the worker in this process; rate is meaningless here",
  });
  report(
    "graphile:latency",
    LATENCY_TASKS,
    1,
    gLatencies.reduce((a, b) => a + b, 0) / 1000,
    gLatencies,
    true,
  );
  await worker.stop();
  await runner.stop();
  await utils.release();
} finally {
  await db.close();
  await bench.stop();
}
