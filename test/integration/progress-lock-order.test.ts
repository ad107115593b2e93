// Lock order between a progress flush and a completion (the deadlock seen once, 2026-12-02): every
// statement locks run rows first, then task rows. A progress flush whose plan read only the first row
// of its `moved` CTE to lock the task (a nested-loop semi-join stops at the first match) held the task
// row while it went on updating the rest of its batch; a completion of one of those runs, holding that
// run's row and waiting for the task, closed the cycle and PostgreSQL aborted one of them.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createDatabase, type Database, type Sql } from "../../src/db/client.ts";
import { runClaim, runComplete, runProgress } from "../../src/queue/sql.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import {
  createTask,
  progressFlushesWaiting,
  seedUser,
  tableEvents,
  taskRow,
  waitFor,
} from "../helpers/queue.ts";

/**
 * A database of its own per case, holding only that case's task: with several tasks in `tasks`, the
 * semi-join has to read the whole batch to rule the other tasks out, which hides the wrong order.
 */
async function withDatabase(
  body: (db: TestDatabase, owner: Principal, holder: Database, flusher: Database) => Promise<void>,
): Promise<void> {
  const db = await createTestDatabase();
  // The completion's connection (it holds a run row in an open transaction) and the flush's.
  const holder = createDatabase(db.url, { max: 1 });
  const flusher = createDatabase(db.url, { max: 1 });
  try {
    await body(db, await seedUser(db.sql, "lock-order"), holder, flusher);
  } finally {
    await holder.close();
    await flusher.close();
    await db.drop();
  }
}

/**
 * Two runs of a fresh task claimed; a completion of the second has its run row and is about to lock
 * the task when a progress flush of both runs starts. Checks that the flush, while it waits for that
 * run row, does not hold the task row, and that both statements finish (no deadlock).
 */
function flushAgainstCompletion(type: string, runs: number, analyze: boolean): Promise<void> {
  return withDatabase(async (db, owner, holder, flusher) => {
    const taskId = await createTask(db.sql, owner, type, runs);
    // The plan that locked the task first is chosen once `runs` has statistics and a few thousand rows.
    if (analyze) await db.sql`analyze runs, tasks`;
    const claimed = await runClaim(db.sql, {
      workerId: "w",
      analysisType: type,
      limit: 2,
      globalLimit: 0,
      leaseTtlMs: 60_000,
    });
    assert.equal(claimed.length, 2);
    const [first, second] = claimed.sort((a, b) => a.id - b.id) as [(typeof claimed)[0], (typeof claimed)[0]];

    let rowHeld!: () => void;
    const heldRow = new Promise<void>((resolve) => (rowHeld = resolve));
    let go!: () => void;
    const proceed = new Promise<void>((resolve) => (go = resolve));
    // The completion's transaction: the run row first (as its `done` CTE does), the task later.
    const completion = holder.sql.begin(async (tx) => {
      await tx`select id from runs where id = ${second.id} for update`;
      rowHeld();
      await proceed;
      return runComplete(tx as unknown as Sql, [
        { id: second.id, token: second.leaseToken, status: "succeeded" },
      ]);
    });
    completion.catch(() => {});
    try {
      await heldRow;
      const flush = runProgress(flusher.sql, [
        { id: first.id, token: first.leaseToken, progress: null },
        { id: second.id, token: second.leaseToken, progress: null },
      ]);
      flush.catch(() => {});
      await waitFor(
        async () => ((await progressFlushesWaiting(db.sql)) > 0 ? true : undefined),
        10_000,
        "the progress flush to wait for the run row",
      );
      // One statement, its own transaction: the task row is free unless the waiting flush holds it.
      let taskLockedByFlush = false;
      try {
        await db.sql`select id from tasks where id = ${taskId} for update nowait`;
      } catch (err) {
        if ((err as { code?: string }).code !== "55P03") throw err;
        taskLockedByFlush = true;
      }
      go();
      const [completed, flushed] = await Promise.allSettled([completion, flush]);
      const failure = (r: PromiseSettledResult<unknown>) =>
        r.status === "rejected" ? String((r.reason as Error).message ?? r.reason) : null;
      assert.deepEqual(
        {
          taskLockedByFlush,
          flushFailure: failure(flushed),
          completionFailure: failure(completed),
        },
        { taskLockedByFlush: false, flushFailure: null, completionFailure: null },
        "the progress flush must lock its runs before their task (it held the task row while waiting for a run row)",
      );
      assert(flushed.status === "fulfilled" && completed.status === "fulfilled");
      // The completion won the second run: the flush finds its lease gone and records the first only.
      assert.deepEqual(
        flushed.value.map((r) => r.id),
        [first.id],
      );
      assert.deepEqual(completed.value.completed, [second.id]);
      const task = await taskRow(db.sql, taskId);
      assert.equal(task.status, "running");
      assert.equal(task.succeeded, 1);
    } finally {
      go();
      await completion.catch(() => {});
    }
  });
}

test("a progress flush does not lock the task before its runs (young tables, no statistics)", async () => {
  await flushAgainstCompletion("lock-order-young", 4, false);
});

test("a progress flush does not lock the task before its runs (a big task, analyzed)", async () => {
  await flushAgainstCompletion("lock-order-big", 5000, true);
});

test("a progress flush that waited for a run a cancel moved to cancelling records no run.running", async () => {
  await withDatabase(async (db, owner, holder, flusher) => {
    const taskId = await createTask(db.sql, owner, "cancel-race", 1);
    const [run] = await runClaim(db.sql, {
      workerId: "w",
      analysisType: "cancel-race",
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 60_000,
    });
    assert.ok(run);
    let moved!: () => void;
    const runMoved = new Promise<void>((resolve) => (moved = resolve));
    let go!: () => void;
    const proceed = new Promise<void>((resolve) => (go = resolve));
    // What taskCancel writes for a claimed run (the run, then the task, then their events), its
    // commit held back.
    const cancel = holder.sql.begin(async (tx) => {
      await tx`update runs set status = 'cancelling' where id = ${run.id} and status = 'starting'`;
      await tx`update tasks set status = 'cancelling' where id = ${taskId}`;
      await tx`
        insert into task_events (task_id, run_id, type, data)
        values (${taskId}, ${run.id}, 'run.cancelling', '{"status":"cancelling","attempt":1}'),
               (${taskId}, null, 'task.cancelling', '{"status":"cancelling","cancelledQueued":0}')`;
      moved();
      await proceed;
    });
    cancel.catch(() => {});
    try {
      await runMoved;
      // The flush reads the run as `starting` (the move is not committed) and waits for its row.
      const flush = runProgress(flusher.sql, [{ id: run.id, token: run.leaseToken, progress: 5 }]);
      flush.catch(() => {});
      await waitFor(
        async () => ((await progressFlushesWaiting(db.sql)) > 0 ? true : undefined),
        10_000,
        "the progress flush to wait for the run row",
      );
      go();
      await cancel;
      // It records the progress of the cancelling run and tells the worker; the run never ran.
      assert.deepEqual(
        (await flush).map((r) => ({ id: r.id, status: r.status })),
        [{ id: run.id, status: "cancelling" }],
      );
      const types = (await tableEvents(db.sql, taskId)).map(([, type]) => type);
      assert.deepEqual(types, ["task.queued", "run.cancelling", "task.cancelling", "run.progress"]);
      assert.equal((await taskRow(db.sql, taskId)).status, "cancelling");
    } finally {
      go();
      await cancel.catch(() => {});
    }
  });
});
