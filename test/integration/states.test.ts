// Walks every pair of states: the database's guards allow exactly the moves of src/tasks/states.ts.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import {
  canMoveRun,
  canMoveTask,
  RUN_STATUSES,
  TASK_STATUSES,
  taskTerminalStatus,
} from "../../src/tasks/states.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser } from "../helpers/queue.ts";

let db: TestDatabase;
let owner: Principal;
before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "states");
});
after(() => db.drop());

async function attempt(fn: () => Promise<unknown>): Promise<boolean> {
  try {
    await fn();
    return true;
  } catch (err) {
    if ((err as { code?: string }).code === "23514") return false;
    throw err;
  }
}

test("run moves: the trigger allows exactly RUN_TRANSITIONS, for every pair", async () => {
  const taskId = await createTask(db.sql, owner, "states-run", 1);
  const [run] = await db.sql`select id from runs where task_id = ${taskId}`;
  for (const from of RUN_STATUSES) {
    for (const to of RUN_STATUSES) {
      if (from === to) continue;
      // Put the run in `from` without the guard, then try the move with it.
      await db.sql.begin(async (tx) => {
        await tx`alter table runs disable trigger runs_transition_guard`;
        await tx`update runs set status = ${from} where id = ${run?.id}`;
        await tx`alter table runs enable trigger runs_transition_guard`;
      });
      const moved = await attempt(() => db.sql`update runs set status = ${to} where id = ${run?.id}`);
      assert.equal(moved, canMoveRun(from, to), `run ${from} → ${to}`);
    }
  }
});

test("task moves: the trigger allows exactly TASK_TRANSITIONS, for every pair", async () => {
  const taskId = await createTask(db.sql, owner, "states-task", 1);
  for (const from of TASK_STATUSES) {
    for (const to of TASK_STATUSES) {
      if (from === to) continue;
      await db.sql.begin(async (tx) => {
        await tx`alter table tasks disable trigger tasks_transition_guard`;
        await tx`update tasks set status = ${from} where id = ${taskId}`;
        await tx`alter table tasks enable trigger tasks_transition_guard`;
      });
      const moved = await attempt(() => db.sql`update tasks set status = ${to} where id = ${taskId}`);
      assert.equal(moved, canMoveTask(from, to), `task ${from} → ${to}`);
    }
  }
});

test("statuses outside the machines are refused", async () => {
  const taskId = await createTask(db.sql, owner, "states-bad", 1);
  assert.equal(await attempt(() => db.sql`update runs set status = 'done' where task_id = ${taskId}`), false);
  assert.equal(await attempt(() => db.sql`update tasks set status = 'done' where id = ${taskId}`), false);
});

test("terminal status of a task (DESIGN §3)", () => {
  const c = (succeeded: number, failed: number, timedOut: number, cancelled: number) => ({
    total: succeeded + failed + timedOut + cancelled,
    succeeded,
    failed,
    timedOut,
    cancelled,
  });
  assert.equal(taskTerminalStatus(c(3, 0, 0, 0), false), "succeeded");
  assert.equal(taskTerminalStatus(c(0, 3, 0, 0), false), "failed");
  assert.equal(taskTerminalStatus(c(0, 0, 3, 0), false), "timed_out");
  assert.equal(taskTerminalStatus(c(0, 0, 0, 3), false), "cancelled");
  assert.equal(taskTerminalStatus(c(1, 1, 1, 0), false), "partially_succeeded");
  assert.equal(taskTerminalStatus(c(0, 1, 1, 1), false), "failed");
  assert.equal(taskTerminalStatus(c(2, 0, 0, 1), true), "cancelled");
  assert.equal(taskTerminalStatus(c(1, 0, 0, 0), false), "succeeded", "a one-file task mirrors its run");
});
