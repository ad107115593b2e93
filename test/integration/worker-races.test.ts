// Races between an attempt's ending and what happens to its run meanwhile (issue 14): a cancel that the
// worker has not heard of yet, a cancel or timeout that lands after the program has finished, a
// shutdown during a cancel, and the worker's retry wake-ups.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { runComplete } from "../../src/queue/sql.ts";
import { type Handler, Worker, type WorkerOptions } from "../../src/queue/worker.ts";
import { taskCancel } from "../../src/tasks/cancel.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser, taskRow, waitFor, waitForTerminal } from "../helpers/queue.ts";

let db: TestDatabase;
let owner: Principal;

before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "race-tests");
});
after(() => db.drop());

/** Long leases: anything that ends within a few seconds here did not wait for the reaper. */
function worker(types: Record<string, Handler>, extra: Partial<WorkerOptions> = {}): Worker {
  return new Worker({
    sql: db.sql,
    logger: createLogger({ level: "silent" }),
    types: Object.fromEntries(Object.entries(types).map(([t, handler]) => [t, { handler }])),
    concurrency: 2,
    leaseTtlMs: 60_000,
    pollIntervalMs: 100,
    retryBaseMs: 50,
    ...extra,
  });
}

/** Marks a task and its live runs cancelling the way a cancel does, but sends no NOTIFY (one missed). */
async function cancelSilently(taskId: string): Promise<void> {
  await db.sql.begin(async (tx) => {
    await tx`update runs set status = 'cancelling' where task_id = ${taskId} and status in ('starting', 'running')`;
    await tx`update tasks set status = 'cancelling' where id = ${taskId}`;
  });
}

const runStatus = async (taskId: string) =>
  (await db.sql<{ status: string }[]>`select status from runs where task_id = ${taskId}`).map(
    (r) => r.status,
  );

const runningRun = (taskId: string) =>
  waitFor(
    async () =>
      (await db.sql`select 1 from runs where task_id = ${taskId} and status in ('starting', 'running')`)
        .length > 0,
    10_000,
    "the run to be claimed",
  );

test("a transient failure of a run being cancelled ends it cancelled at once, not after the lease", async () => {
  let release: () => void = () => {};
  const gate = new Promise<void>((r) => {
    release = r;
  });
  const taskId = await createTask(db.sql, owner, "r-cancel-transient", 1, { maxAttempts: 3 });
  const w = worker({
    "r-cancel-transient": async () => {
      await gate;
      return { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true };
    },
  });
  await w.start();
  await runningRun(taskId);
  await cancelSilently(taskId);
  release();
  const task = await waitForTerminal(db.sql, taskId, 5_000);
  await w.stop();
  assert.equal(task.status, "cancelled");
  assert.equal(task.cancelled, 1);
  assert.deepEqual(await runStatus(taskId), ["cancelled"]);
});

test("a shutdown during a cancel ends the run cancelled at once", async () => {
  const taskId = await createTask(db.sql, owner, "r-cancel-shutdown", 1);
  const w = worker({
    "r-cancel-shutdown": async (_run, { signal }) => {
      await new Promise((r) => signal.addEventListener("abort", r));
      return { status: "failed", errorCode: "ANALYSIS_PROCESS_FAILED" };
    },
  });
  await w.start();
  await runningRun(taskId);
  await cancelSilently(taskId);
  await w.stop(0);
  const row = await taskRow(db.sql, taskId);
  assert.equal(row.status, "cancelled");
  assert.deepEqual(await runStatus(taskId), ["cancelled"]);
});

test("a cancel that lands after the program finished does not undo its success", async () => {
  const taskId = await createTask(db.sql, owner, "r-late-cancel", 1);
  const w = worker({
    "r-late-cancel": async (_run, { signal }) => {
      // The process has exited with its result; outputs are being checked when the cancel lands.
      const aborted = new Promise((r) => signal.addEventListener("abort", r));
      const cancelled = await taskCancel(db.sql, owner, taskId);
      assert.equal(cancelled.kind, "cancelling");
      await aborted;
      assert.equal(signal.reason, "cancel");
      return { status: "succeeded", result: { metrics: { rows: 1 } } };
    },
  });
  await w.start();
  const task = await waitForTerminal(db.sql, taskId, 10_000);
  await w.stop();
  assert.deepEqual(await runStatus(taskId), ["succeeded"]);
  assert.equal(task.succeeded, 1);
  // The task was cancelling, so it ends cancelled, but the run's result stands and is counted.
  assert.equal(task.status, "cancelled");
});

test("a timeout that fires after the program finished does not undo its success", async () => {
  const taskId = await createTask(db.sql, owner, "r-late-timeout", 1);
  const w = new Worker({
    sql: db.sql,
    logger: createLogger({ level: "silent" }),
    types: {
      "r-late-timeout": {
        timeoutMs: 100,
        handler: async (_run, { signal }) => {
          await new Promise((r) => signal.addEventListener("abort", r));
          assert.equal(signal.reason, "timeout");
          return { status: "succeeded" };
        },
      },
    },
    concurrency: 1,
    leaseTtlMs: 60_000,
    pollIntervalMs: 100,
    retryBaseMs: 50,
  });
  await w.start();
  const task = await waitForTerminal(db.sql, taskId, 10_000);
  await w.stop();
  assert.equal(task.status, "succeeded");
});

test("retry wake-ups do not accumulate: one timer, however many retries", async () => {
  const taskId = await createTask(db.sql, owner, "r-wakeups", 20, { maxAttempts: 6 });
  const w = worker(
    {
      "r-wakeups": async (run) =>
        run.attempt < 6
          ? { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true }
          : { status: "succeeded" },
    },
    { retryBaseMs: 1, concurrency: 4 },
  );
  await w.start();
  const task = await waitForTerminal(db.sql, taskId, 30_000);
  const timers = (w as unknown as { timers: unknown[] }).timers.length;
  await w.stop();
  assert.equal(task.succeeded, 20);
  const [retries] = await db.sql<{ n: number }[]>`
    select count(*)::int as n from task_events where task_id = ${taskId} and type = 'run.retry'`;
  assert.equal(retries?.n, 100);
  assert.ok(timers <= 3, `the worker holds ${timers} timers after 100 retries`);
});

test("a completion that committed but whose answer was lost is recognised, not discarded as fenced off", async () => {
  const taskId = await createTask(db.sql, owner, "r-lost-answer", 1);
  const discarded: number[] = [];
  const w = worker(
    {
      "r-lost-answer": async (run) => {
        const outputKey = `${run.taskId}/${run.id}.${run.attempt}.${run.leaseToken}`;
        // The worker's first try at this completion committed; its answer never arrived.
        await runComplete(db.sql, [{ id: run.id, token: run.leaseToken, status: "succeeded", outputKey }]);
        return { status: "succeeded", outputKey };
      },
    },
    { onDiscard: async (run) => void discarded.push(run.id) },
  );
  await w.start();
  const task = await waitForTerminal(db.sql, taskId, 10_000);
  await w.stop();
  assert.equal(task.status, "succeeded");
  assert.deepEqual(discarded, [], "the run's own outputs were not discarded");
});

test("a retry that fails beside a completion that committed does not replay the completion", async () => {
  // The first re-queue of a run fails once (as a dropped connection would fail that statement).
  await db.sql`create sequence requeue_failures`;
  await db.sql.unsafe(`
    create function fail_first_requeue() returns trigger language plpgsql as $$
    begin
      if new.status = 'queued' and old.status <> 'queued' and nextval('requeue_failures') = 1 then
        raise exception 'injected: the re-queue failed';
      end if;
      return new;
    end $$`);
  await db.sql.unsafe(
    "create trigger fail_first_requeue before update on runs for each row execute function fail_first_requeue()",
  );
  // Whatever fails below, the held row is released and the worker stopped before the trigger is
  // dropped: DROP TRIGGER waits for every lock on runs, so a failure here would otherwise hang.
  let unlock: () => void = () => {};
  let lock: Promise<unknown> = Promise.resolve();
  let w: Worker | undefined;
  try {
    const taskId = await createTask(db.sql, owner, "r-split-flush", 3, { maxAttempts: 3 });
    const [blocker, winner, flaky] = (
      await db.sql<{ id: number }[]>`
        select r.id::float8 as id from runs r where r.task_id = ${taskId} order by r.id`
    ).map((r) => r.id) as [number, number, number];
    const gates = new Map<number, () => void>();
    const gate = (id: number) => new Promise<void>((resolve) => gates.set(id, resolve));
    const returned = new Set<number>();
    const discarded: number[] = [];
    w = worker(
      {
        "r-split-flush": async (run) => {
          if (run.attempt === 1) await gate(run.id);
          returned.add(run.id);
          if (run.id === flaky && run.attempt === 1)
            return { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true };
          return {
            status: "succeeded",
            outputKey: `${run.taskId}/${run.id}.${run.attempt}.${run.leaseToken}`,
          };
        },
      },
      { concurrency: 3, onDiscard: async (run) => void discarded.push(run.id) },
    );
    await w.start();
    await waitFor(async () => gates.size === 3, 10_000, "three attempts running");
    // Hold the blocker's row: its completion waits, and the next two endings form one batch.
    const held = new Promise<void>((resolve) => {
      unlock = resolve;
    });
    let locked: () => void = () => {};
    const isLocked = new Promise<void>((resolve) => {
      locked = resolve;
    });
    lock = db.sql.begin(async (tx) => {
      await tx`select 1 from runs where id = ${blocker} for update`;
      locked();
      await held;
    });
    await isLocked;
    gates.get(blocker)?.();
    await waitFor(
      async () =>
        (
          await db.sql`select 1 from pg_stat_activity
                       where datname = current_database() and wait_event_type = 'Lock'`
        ).length > 0,
      10_000,
      "the blocker's completion to wait for the row",
    );
    gates.get(winner)?.();
    gates.get(flaky)?.();
    await waitFor(async () => returned.has(winner) && returned.has(flaky));
    unlock();
    await lock;
    const task = await waitForTerminal(db.sql, taskId, 10_000);
    await w.stop();
    assert.equal(task.succeeded, 3);
    const [failures] = await db.sql<{ n: string }[]>`select last_value::text as n from requeue_failures`;
    assert.ok(Number(failures?.n) >= 1, "the injected failure happened");
    assert.deepEqual(discarded, [], "no recorded success was discarded");
  } finally {
    unlock();
    await lock.catch(() => {});
    await w?.stop(0);
    await db.sql`drop trigger fail_first_requeue on runs`;
  }
});

test("each retry of this worker's wakes it when due, not at the next poll", async () => {
  const taskId = await createTask(db.sql, owner, "r-due", 4, { maxAttempts: 2 });
  const w = worker(
    {
      "r-due": async (run) =>
        run.attempt === 1
          ? { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true }
          : { status: "succeeded" },
    },
    // Retries are due 0.5–1 s after they fail, at four different times; the poll is a minute away.
    { retryBaseMs: 1000, pollIntervalMs: 60_000, concurrency: 4 },
  );
  await w.start();
  const task = await waitForTerminal(db.sql, taskId, 10_000);
  await w.stop();
  assert.equal(task.succeeded, 4);
});

test("retries wake the worker when due though the wall clock steps back an hour meanwhile (NTP)", async () => {
  const taskId = await createTask(db.sql, owner, "r-step", 4, { maxAttempts: 2 });
  const realNow = Date.now;
  let failed = 0;
  const w = worker(
    {
      "r-step": async (run) => {
        if (run.attempt > 1) return { status: "succeeded" };
        // Once all four have failed and armed their wake-ups, the host's clock is stepped back.
        if (++failed === 4) setTimeout(() => (Date.now = () => realNow() - 3_600_000), 100);
        return { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true };
      },
    },
    // Retries are due 0.5–1 s after they fail, at four different times; the poll is a minute away.
    { retryBaseMs: 1000, pollIntervalMs: 60_000, concurrency: 4 },
  );
  try {
    await w.start();
    const task = await waitForTerminal(db.sql, taskId, 10_000);
    assert.equal(task.succeeded, 4);
  } finally {
    Date.now = realNow;
    await w.stop();
  }
});

test("a retry already due when its slow re-queue commits is claimed at once, not at the next poll", async () => {
  // The re-queue outlasts the backoff (a lock wait, a busy database): the run is due by the time it
  // is queued again, and no timer of the worker's is still ahead of it.
  await db.sql.unsafe(`
    create function slow_requeue() returns trigger language plpgsql as $$
    begin
      if new.status = 'queued' and old.status <> 'queued' then perform pg_sleep(0.2); end if;
      return new;
    end $$`);
  await db.sql.unsafe(
    "create trigger slow_requeue before update on runs for each row execute function slow_requeue()",
  );
  const w = worker(
    {
      "r-slow-requeue": async (run) =>
        run.attempt === 1
          ? { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true }
          : { status: "succeeded" },
    },
    { retryBaseMs: 1, pollIntervalMs: 60_000, concurrency: 1 },
  );
  try {
    const taskId = await createTask(db.sql, owner, "r-slow-requeue", 1, { maxAttempts: 2 });
    await w.start();
    const task = await waitForTerminal(db.sql, taskId, 10_000);
    assert.equal(task.succeeded, 1);
  } finally {
    await w.stop(0);
    await db.sql`drop trigger slow_requeue on runs`;
  }
});
