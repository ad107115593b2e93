// The worker under failure injection against a real PostgreSQL: its connections terminated over and
// over (claims, buffered runs, completions held by the completion delay, heartbeats), a claim that
// committed but whose answer was lost (a TCP proxy cuts the connection in its place), a reaper taking
// an attempt back while its outcome waits to be written, and a cancel during a retry's backoff. Each
// test checks the invariants: every run ends once, counters exact, no run live without a live lease.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createDatabase, type Database } from "../../src/db/client.ts";
import { createLogger } from "../../src/log.ts";
import { Reaper } from "../../src/queue/reaper.ts";
import { type Handler, Worker, type WorkerOptions } from "../../src/queue/worker.ts";
import { taskCancel } from "../../src/tasks/cancel.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import {
  createTask,
  idsCrossPowerOfTen,
  seedUser,
  taskRow,
  waitFor,
  waitForTerminal,
} from "../helpers/queue.ts";
import { startTcpProxy } from "../helpers/tcp-proxy.ts";

let db: TestDatabase;
let owner: Principal;
/** The worker's own pool, so that its connections (and only those) can be terminated. */
let pool: Database;
const APP = "assay-faults-worker";

before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "fäults «x»'; drop table runs; --");
  pool = createDatabase(db.url, { max: 5, applicationName: APP });
});
after(async () => {
  await pool.close();
  await db.drop();
});

function worker(types: Record<string, Handler>, extra: Partial<WorkerOptions> = {}): Worker {
  return new Worker({
    sql: pool.sql,
    logger: createLogger({ level: process.env.FAULTS_LOG ? "debug" : "silent" }),
    types: Object.fromEntries(Object.entries(types).map(([t, handler]) => [t, { handler }])),
    concurrency: 4,
    leaseTtlMs: 60_000,
    pollIntervalMs: 100,
    retryBaseMs: 20,
    ...extra,
  });
}

/** Terminates every backend of the worker's pool (its claim, completion, heartbeat connections). */
async function terminateWorkerBackends(): Promise<number> {
  const rows = await db.sql`
    select pg_terminate_backend(pid) from pg_stat_activity
    where datname = current_database() and application_name = ${APP} and pid <> pg_backend_pid()
      -- Not in its first moments: postgres.js reads the server's array types right after it connects,
      -- and does not catch that query's failure (an unhandled rejection: reported, not this file's).
      and backend_start < now() - interval '200 milliseconds'`;
  return rows.length;
}

/** The invariants every scenario ends with. */
async function assertSettled(taskIds: string[]): Promise<void> {
  for (const id of taskIds) {
    const t = await taskRow(db.sql, id);
    assert.equal(
      t.succeeded + t.failed + t.timedOut + t.cancelled,
      t.total,
      `task ${id}: counters ${JSON.stringify(t)} sum to its total`,
    );
    const [c] = await db.sql<{ s: number; f: number; x: number; k: number; live: number }[]>`
      select count(*) filter (where status = 'succeeded')::int as s,
             count(*) filter (where status = 'failed')::int as f,
             count(*) filter (where status = 'timed_out')::int as x,
             count(*) filter (where status = 'cancelled')::int as k,
             count(*) filter (where status in ('queued', 'starting', 'running', 'cancelling'))::int as live
      from runs where task_id = ${id}`;
    assert.deepEqual(
      { s: t.succeeded, f: t.failed, x: t.timedOut, k: t.cancelled, live: 0 },
      { ...c },
      `task ${id}: counters match its runs`,
    );
    // Each run's ending recorded once.
    const twice = await db.sql`
      select run_id, count(*)::int as n from task_events
      where task_id = ${id} and type in ('run.succeeded', 'run.failed', 'run.timed_out', 'run.cancelled')
      group by run_id having count(*) <> 1`;
    assert.deepEqual([...twice], [], `task ${id}: one ending event per run`);
  }
  const stuck = await db.sql`
    select id, status, lease_expires_at from runs
    where status in ('starting', 'running', 'cancelling') and (lease_expires_at is null or lease_expires_at < now())`;
  assert.deepEqual([...stuck], [], "no run live without a live lease");
}

test("connections terminated over and over while runs are claimed, buffered, running and completing: every run ends once", async () => {
  await idsCrossPowerOfTen(db.sql, "runs", 30);
  const executions = new Map<number, number>();
  const w = worker(
    {
      quick: async (run) => {
        executions.set(run.id, (executions.get(run.id) ?? 0) + 1);
        await new Promise((r) => setTimeout(r, 2 + (run.id % 7) * 3));
        return { status: "succeeded", result: { n: run.id } };
      },
    },
    { prefetch: 6, completionDelayMs: 200, concurrency: 3 },
  );
  await w.start();
  const tasks: string[] = [];
  let killing = true;
  let kills = 0;
  const killer = (async () => {
    while (killing) {
      kills += await terminateWorkerBackends();
      await new Promise((r) => setTimeout(r, 15 + Math.random() * 40));
    }
  })();
  try {
    for (let i = 0; i < 4; i++) tasks.push(await createTask(db.sql, owner, "quick", 40, { maxAttempts: 1 }));
    for (const t of tasks) await waitForTerminal(db.sql, t, 120_000);
  } finally {
    killing = false;
    await killer;
    await w.stop();
  }
  assert.ok(kills > 0, "backends were terminated");
  await assertSettled(tasks);
  for (const t of tasks) assert.equal((await taskRow(db.sql, t)).status, "succeeded");
});

/**
 * A TCP proxy in front of the database. `cutOnce(marker)`: the next answer from the server that
 * carries `marker` (not a notification) is never delivered — the connection is cut instead, after
 * the server has done the work (an answer lost to the network, or a backend that died between its
 * commit and its reply).
 */
async function lossyProxy(dbUrl: string) {
  let marker: Buffer | undefined;
  const proxy = await startTcpProxy(dbUrl, {
    fromServer: (chunk) => {
      // 'A': a NotificationResponse (the create's wake-ups carry the type too).
      if (!marker || chunk[0] === 0x41 || !chunk.includes(marker)) return "pass";
      marker = undefined;
      return "cut";
    },
  });
  return {
    ...proxy,
    cutOnce: (m: string) => {
      marker = Buffer.from(m);
    },
  };
}

for (const via of ["newcomer's claim", "claim loop's claim"] as const)
  test(`a ${via} that committed but whose answer was lost: its run is started here, not failed by the reaper after the lease`, async () => {
    const proxy = await lossyProxy(db.url);
    const lossy = createDatabase(proxy.url, { max: 3, applicationName: APP });
    const type = via === "newcomer's claim" ? "orphan-newcomer-ü" : "orphan-loop-ü";
    const executed: number[] = [];
    let release: () => void = () => {};
    const held = new Promise<void>((r) => {
      release = r;
    });
    let blocking = via === "claim loop's claim";
    const w = new Worker({
      sql: lossy.sql,
      logger: createLogger({ level: process.env.FAULTS_LOG ? "debug" : "silent" }),
      types: {
        [type]: {
          handler: async (run) => {
            if (blocking) {
              blocking = false;
              await held;
              return { status: "succeeded" };
            }
            executed.push(run.id);
            return { status: "succeeded" };
          },
        },
      },
      concurrency: 1,
      leaseTtlMs: 1500,
      pollIntervalMs: 100,
      retryBaseMs: 20,
    });
    const reaper = new Reaper({
      sql: db.sql,
      logger: createLogger({ level: "silent" }),
      intervalMs: 100,
      leaseTtlMs: 1500,
      retryBaseMs: 20,
      workerWaitMs: 60_000,
    });
    await w.start();
    reaper.start();
    try {
      const tasks: string[] = [];
      if (via === "claim loop's claim") {
        // The one slot is taken: the probe's run is not claimed by a newcomer's claim, but by the
        // loop's when the slot frees.
        tasks.push(await createTask(db.sql, owner, type, 1, { maxAttempts: 1 }));
        await waitFor(async () => !blocking, 10_000, "the slot to be taken");
      }
      // The claim's answer names the run's type; the create's notifications (which do too) pass.
      proxy.cutOnce(type);
      const probe = await createTask(db.sql, owner, type, 1, { maxAttempts: 1 });
      tasks.push(probe);
      release();
      const t = await waitForTerminal(db.sql, probe, 30_000);
      assert.equal(proxy.cuts(), 1, "a claim's answer was lost");
      const [run] = await db.sql<{ status: string; error_code: string | null; attempt: number }[]>`
      select status, error_code, attempt from runs where task_id = ${probe}`;
      assert.deepEqual(
        {
          task: t.status,
          run: run?.status,
          errorCode: run?.error_code,
          attempt: run?.attempt,
          executed: executed.length,
        },
        { task: "succeeded", run: "succeeded", errorCode: null, attempt: 1, executed: 1 },
      );
      for (const id of tasks) await waitForTerminal(db.sql, id);
      await assertSettled(tasks);
    } finally {
      release();
      await reaper.stop();
      await w.stop();
      await lossy.close();
      await proxy.close();
    }
  });

test("a cancel during a retry's backoff ends the task at once; the retry's wake-up claims nothing, counted once", async () => {
  let attempts = 0;
  const w = worker(
    {
      "backoff-cancel": async () => {
        attempts++;
        return {
          status: "failed",
          errorCode: "ANALYSIS_PROCESS_FAILED",
          errorMessage: "flaky",
          transient: true,
        };
      },
    },
    // A backoff long enough for the cancel to land inside it.
    { retryBaseMs: 3000 },
  );
  await w.start();
  try {
    const taskId = await createTask(db.sql, owner, "backoff-cancel", 2, { maxAttempts: 3 });
    await waitFor(
      async () => {
        const [r] = await db.sql<{ n: number }[]>`
          select count(*)::int as n from runs where task_id = ${taskId} and status = 'queued' and attempt = 1
            and run_after > now()`;
        return (r?.n ?? 0) === 2;
      },
      10_000,
      "both runs in their backoff",
    );
    const cancelled = await taskCancel(db.sql, owner, taskId);
    assert.equal(cancelled.kind, "cancelling", "the cancel went through");
    const t = await waitForTerminal(db.sql, taskId, 2_000);
    assert.deepEqual(
      { ...t },
      { status: "cancelled", total: 2, succeeded: 0, failed: 0, timedOut: 0, cancelled: 2 },
    );
    // Past the backoff: the worker's retry wake-up fires and finds nothing.
    await new Promise((r) => setTimeout(r, 3200));
    assert.equal(attempts, 2, "no attempt after the cancel");
    await assertSettled([taskId]);
  } finally {
    await w.stop();
  }
});

test("the reaper takes back an attempt whose outcome waits in the completion delay: the late completion is fenced off, the run counted once", async () => {
  let calls = 0;
  let release: () => void = () => {};
  const held = new Promise<void>((r) => {
    release = r;
  });
  let startedBoth: () => void = () => {};
  const bothStarted = new Promise<void>((r) => {
    startedBoth = r;
  });
  const w = worker(
    {
      "late-completion": async (run) => {
        calls++;
        // The second run keeps the worker busy, so the first's outcome waits for company (the first
        // ends only once the second has started: a newcomer's claim may have taken it alone).
        if (calls === 1) await bothStarted;
        if (calls === 2) {
          startedBoth();
          await held;
        }
        return { status: "succeeded", result: { run: run.id } };
      },
    },
    { completionDelayMs: 60_000, concurrency: 2 },
  );
  const reaper = new Reaper({
    sql: db.sql,
    logger: createLogger({ level: "silent" }),
    intervalMs: 60_000,
    leaseTtlMs: 60_000,
    retryBaseMs: 1,
    workerWaitMs: 60_000,
  });
  await w.start();
  try {
    const taskId = await createTask(db.sql, owner, "late-completion", 2, { maxAttempts: 3 });
    await waitFor(async () => calls >= 2, 10_000, "both runs started");
    // The first attempt ends now; its outcome waits for company (the completion delay).
    await new Promise((r) => setImmediate(r));
    // The first run's outcome waits (its lease heartbeated meanwhile); its lease runs out now.
    const [first] = await db.sql<{ id: string }[]>`
      update runs set lease_expires_at = now() - interval '1 second'
      where id = (select min(id) from runs where task_id = ${taskId}) returning id::text`;
    const pass = await reaper.runOnce();
    assert.equal(pass.requeued, 1, "the reaper put the attempt back");
    release();
    const t = await waitForTerminal(db.sql, taskId, 30_000);
    assert.equal(t.status, "succeeded");
    const [r] = await db.sql<
      { attempt: number }[]
    >`select attempt from runs where id = ${first?.id as string}`;
    assert.equal(r?.attempt, 2, "the run ran again after the reaper took it back");
    assert.equal(calls, 3);
    await assertSettled([taskId]);
  } finally {
    release();
    await w.stop();
  }
});

/**
 * A worker whose claims fail while `runs` is locked (`lockRuns`): each waits `lockTimeoutMs` on the
 * lock, then fails (nothing else the worker does touches runs while it holds nothing). `failed()`
 * counts the failed claims; `stopMs()` times its stop(); `close()` releases everything.
 */
async function lockedOutWorker(app: string, lockTimeoutMs: number) {
  const url = new URL(db.url);
  url.searchParams.set("lock_timeout", String(lockTimeoutMs));
  const locked = createDatabase(url.toString(), { max: 3, applicationName: app });
  let failedClaims = 0;
  const logger = createLogger({ level: "warn" });
  logger.warn = ((_obj: unknown, msg?: string) => {
    if (msg === "claim failed; retrying") failedClaims++;
  }) as typeof logger.warn;
  const w = new Worker({
    sql: locked.sql,
    logger,
    types: { [app]: { handler: async () => ({ status: "succeeded" }) } },
    concurrency: 2,
    leaseTtlMs: 60_000,
    pollIntervalMs: 50,
    retryBaseMs: 20,
  });
  const holder = await db.sql.reserve();
  await w.start();
  return {
    lockRuns: async () => {
      await holder`begin`;
      await holder`lock table runs in access exclusive mode`;
    },
    failed: () => failedClaims,
    stopMs: async () => {
      const began = performance.now();
      await w.stop();
      return performance.now() - began;
    },
    close: async () => {
      await holder`rollback`.catch(() => {});
      holder.release();
      await w.stop();
      await locked.close();
    },
  };
}

test("stop() after a run of failed claims does not wait out the claim loop's backoff", async () => {
  const x = await lockedOutWorker("assay-faults-locked", 1);
  try {
    await x.lockRuns();
    // The fourth failure's backoff is 3.2 s (200 ms × 2^4).
    await waitFor(async () => x.failed() >= 4, 20_000, "four failed claims");
    const ms = await x.stopMs();
    assert.ok(ms < 1_500, `stop() took ${Math.round(ms)} ms`);
  } finally {
    await x.close();
  }
});

test("stop() while a failing claim is in flight takes no backoff after it", async () => {
  // Each claim waits 600 ms on the lock, then fails: stop() lands while one waits.
  const app = "assay-faults-inflight";
  const x = await lockedOutWorker(app, 600);
  try {
    await x.lockRuns();
    // After the third failure the next backoff would be 3.2 s (200 ms × 2^4).
    await waitFor(async () => x.failed() >= 3, 20_000, "three failed claims");
    await waitFor(
      async () =>
        (
          await db.sql`
            select 1 from pg_stat_activity
            where application_name = ${app} and wait_event_type = 'Lock'`
        ).length > 0,
      10_000,
      "the fourth claim waiting on the lock",
    );
    const ms = await x.stopMs();
    assert.ok(ms < 2_000, `stop() took ${Math.round(ms)} ms`);
  } finally {
    await x.close();
  }
});
