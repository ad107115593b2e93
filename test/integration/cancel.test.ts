// Cancelling through the API: queued, starting and running runs; a second cancel; a finished task;
// cancel racing completion.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { runClaim, runComplete } from "../../src/queue/sql.ts";
import { bearer } from "../helpers/app.ts";
import { runCounts, taskRow, waitFor, waitForTerminal } from "../helpers/queue.ts";
import { alive, fixtureProgram, outputTree, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";

let env: RunnerEnv;
let app: FastifyInstance;
let token: string;
let stranger: string;

before(async () => {
  env = await runnerEnv();
  app = await env.app();
  token = (await tokenCreate(env.db.sql, "runner")).token;
  stranger = (await tokenCreate(env.db.sql, "stranger")).token;
});
after(() => env.close());

const cancel = (taskId: string, t = token) =>
  app.inject({ method: "POST", url: `/api/analysis-tasks/${taskId}/cancel`, headers: bearer(t) });

test("queued runs are cancelled at once and counted; the task ends cancelled", async () => {
  const files = await Promise.all([1, 2, 3].map((i) => env.file(`a\n${i}\n`)));
  const taskId = await env.task("never-claimed", files, { mode: "ok" });
  const res = await cancel(taskId);
  assert.equal(res.statusCode, 202);
  assert.deepEqual(res.json().data, { taskId, status: "cancelled" });
  assert.deepEqual(await taskRow(env.db.sql, taskId), {
    status: "cancelled",
    total: 3,
    succeeded: 0,
    failed: 0,
    timedOut: 0,
    cancelled: 3,
  });
  const again = await cancel(taskId);
  assert.equal(again.statusCode, 409);
  assert.equal(again.json().code, "ANALYSIS_TASK_ALREADY_FINISHED");
  assert.equal((await cancel(taskId, stranger)).statusCode, 404);
  assert.equal((await cancel("abc")).statusCode, 404);
});

test("running processes: group killed, tmp dirs gone, counters right; a second cancel is 202 with the state", async () => {
  const files = await Promise.all([1, 2, 3].map((i) => env.file(`b\n${i}\n`)));
  const taskId = await env.task("cancel-live", files, { mode: "grandchild" });
  const w = env.worker([fixtureProgram("cancel-live")], { concurrency: 2 });
  await w.start();
  const events = await waitFor(async () => {
    const rows = await env.db
      .sql`select data from task_events where task_id = ${taskId} and type = 'run.progress'`;
    return rows.length >= 2 ? rows : undefined;
  });
  const grandchildren = events.map((e) => Number(/grandchild (\d+)/.exec(e.data.message)?.[1]));
  assert.ok(grandchildren.every(alive));
  const res = await cancel(taskId);
  assert.equal(res.statusCode, 202);
  assert.equal(res.json().data.status, "cancelling");
  const second = await cancel(taskId);
  assert.ok([202, 409].includes(second.statusCode));
  const row = await waitForTerminal(env.db.sql, taskId);
  await w.stop();
  assert.deepEqual(row, {
    status: "cancelled",
    total: 3,
    succeeded: 0,
    failed: 0,
    timedOut: 0,
    cancelled: 3,
  });
  for (const pid of grandchildren) await waitFor(async () => !alive(pid), 5000, `grandchild ${pid} to die`);
  assert.deepEqual(outputTree(`${env.outputsRoot}/${taskId}`), []);
  const log = await env.db.sql<{ type: string; data: { cancelledQueued?: number } }[]>`
    select type, data from task_events where task_id = ${taskId} order by id`;
  const types = log.map((r) => r.type);
  // The live runs' run.cancelling events come before task.cancelling (a reader applying the log in
  // order takes the runs it still has queued then for the ones the number counts).
  assert.deepEqual(
    types.filter((x) => x === "run.cancelling" || x === "task.cancelling"),
    ["run.cancelling", "run.cancelling", "task.cancelling"],
  );
  // Two slots: two runs were live (cancelled by their worker, an event each), the third was queued
  // (ended by the cancel itself, counted in its task.cancelling event).
  assert.equal(types.filter((x) => x === "run.cancelled").length, 2);
  assert.equal(log.find((r) => r.type === "task.cancelling")?.data.cancelledQueued, 1);
  assert.equal(types.at(-1), "task.cancelled");
});

test("a starting run (claimed, not yet running) becomes cancelling and ends cancelled when its worker reports", async () => {
  const file = await env.file("c\n1\n");
  const taskId = await env.task("cancel-starting", [file], {});
  const [claimed] = await runClaim(env.db.sql, {
    workerId: "w",
    analysisType: "cancel-starting",
    limit: 1,
    globalLimit: 0,
    leaseTtlMs: 30_000,
  });
  assert.ok(claimed);
  assert.equal((await cancel(taskId)).json().data.status, "cancelling");
  assert.deepEqual(await runCounts(env.db.sql, taskId), { cancelling: 1 });
  // The worker that owns it reports the outcome of the abort.
  const done = await runComplete(env.db.sql, [
    { id: claimed.id, token: claimed.leaseToken, status: "cancelled" },
  ]);
  assert.deepEqual(done.finishedTasks, [{ taskId: Number(taskId), status: "cancelled" }]);
});

test("cancel racing completion: exactly one outcome is counted", async () => {
  for (let i = 0; i < 20; i++) {
    const file = await env.file(`d\n${i}\n`);
    const taskId = await env.task("race-cancel", [file], {});
    const [run] = await runClaim(env.db.sql, {
      workerId: "w",
      analysisType: "race-cancel",
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
    assert.ok(run);
    const [c, d] = await Promise.all([
      cancel(taskId),
      runComplete(env.db.sql, [{ id: run.id, token: run.leaseToken, status: "succeeded" }]),
    ]);
    assert.ok([202, 409].includes(c.statusCode));
    if (d.completed.length === 0) {
      await runComplete(env.db.sql, [{ id: run.id, token: run.leaseToken, status: "cancelled" }]);
    }
    const row = await taskRow(env.db.sql, taskId);
    assert.equal(row.succeeded + row.cancelled, 1, JSON.stringify(row));
    assert.ok(["succeeded", "cancelled"].includes(row.status));
  }
});

test("concurrent cancels racing claims: every answer 202, one task.cancelling, each run counted once", async () => {
  const claim = () =>
    runClaim(env.db.sql, {
      workerId: "w",
      analysisType: "cancel-many",
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
  for (let i = 0; i < 5; i++) {
    const files = await Promise.all([1, 2, 3, 4, 5].map((j) => env.file(`e\n${i}${j}\n`)));
    const taskId = await env.task("cancel-many", files, {});
    // One run live, so the task stays cancelling and every cancel sees it unfinished.
    const live = await claim();
    const results = await Promise.all([cancel(taskId), cancel(taskId), claim(), cancel(taskId), claim()]);
    const answers = results.filter((r) => !Array.isArray(r)) as Awaited<ReturnType<typeof cancel>>[];
    assert.deepEqual(
      answers.map((r) => [r.statusCode, r.json().data.status]),
      [
        [202, "cancelling"],
        [202, "cancelling"],
        [202, "cancelling"],
      ],
    );
    const claimed = [...live, ...(results.filter(Array.isArray).flat() as typeof live)];
    const [log] = await env.db.sql<{ n: number; queued: number }[]>`
      select count(*)::int as n, sum((data ->> 'cancelledQueued')::int)::int as queued
      from task_events where task_id = ${taskId} and type = 'task.cancelling'`;
    assert.deepEqual({ ...log }, { n: 1, queued: 5 - claimed.length });
    assert.deepEqual(await runCounts(env.db.sql, taskId), {
      cancelled: 5 - claimed.length,
      cancelling: claimed.length,
    });
    await runComplete(
      env.db.sql,
      claimed.map((r) => ({ id: r.id, token: r.leaseToken, status: "cancelled" as const })),
    );
    assert.deepEqual(await taskRow(env.db.sql, taskId), {
      status: "cancelled",
      total: 5,
      succeeded: 0,
      failed: 0,
      timedOut: 0,
      cancelled: 5,
    });
  }
});
