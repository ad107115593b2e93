// Several worker *processes* over one database: exactly-once execution, crash recovery, exact limits.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, runCounts, seedUser, taskRow, waitFor, waitForTerminal } from "../helpers/queue.ts";
import {
  createExecutionsTable,
  maxOverlap,
  startWorkerProcess,
  type WorkerProcess,
} from "../helpers/workers.ts";

let db: TestDatabase;
let owner: Principal;
const procs: WorkerProcess[] = [];

before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "procs");
  await createExecutionsTable(db.sql);
});
after(async () => {
  for (const p of procs) p.child.kill("SIGKILL");
  await Promise.all(procs.map((p) => p.exited));
  await db.drop();
});

async function start(spec: Parameters<typeof startWorkerProcess>[1]) {
  const p = await startWorkerProcess(db.url, spec);
  procs.push(p);
  return p;
}

async function stop(p: WorkerProcess) {
  p.child.kill("SIGTERM");
  assert.equal(await p.exited, 0);
}

test("3 worker processes race over 1,000 runs: each executed once, counters exact, terminal once", async () => {
  const spec = { types: { race: { sleepMs: 1 } }, concurrency: 4, leaseTtlMs: 30_000, reapIntervalMs: 1000 };
  const workers = await Promise.all([start(spec), start(spec), start(spec)]);
  const taskId = await createTask(db.sql, owner, "race", 1000);
  const row = await waitForTerminal(db.sql, taskId, 120_000);
  await Promise.all(workers.map(stop));

  assert.deepEqual(row, {
    status: "succeeded",
    total: 1000,
    succeeded: 1000,
    failed: 0,
    timedOut: 0,
    cancelled: 0,
  });
  assert.deepEqual(await runCounts(db.sql, taskId), { succeeded: 1000 });
  const [exec] = await db.sql`
    select count(*)::int as total, count(distinct run_id)::int as runs, count(distinct worker_id)::int as workers
    from test_executions e join runs r on r.id = e.run_id where r.task_id = ${taskId}`;
  assert.deepEqual({ ...exec }, { total: 1000, runs: 1000, workers: 3 });
  const finished =
    await db.sql`select count(*)::int as n from task_events where task_id = ${taskId} and type like 'task.succeeded'`;
  assert.equal(finished[0]?.n, 1, "the task turned terminal exactly once");
});

test("a worker SIGKILLed mid-run: its runs are re-queued after the lease expires, finished elsewhere, counted once; its slots are freed", async () => {
  const types = { crash: { sleepMs: 60_000, globalLimit: 2 } };
  // Leases short enough for a quick recovery, long enough that a loaded machine's pause of the
  // victim before the kill cannot expire them (a run reaped then took a third attempt).
  const victim = await start({ types, concurrency: 2, leaseTtlMs: 3000, reapIntervalMs: 200 });
  const taskId = await createTask(db.sql, owner, "crash", 4);
  await waitFor(
    async () => (await runCounts(db.sql, taskId)).running === 2,
    20_000,
    "two runs running on the victim",
  );
  victim.child.kill("SIGKILL");
  await victim.exited;

  // The survivor finishes quickly; it can only start once the reaper freed the victim's two slots.
  // Its own leases long: only the victim's should ever expire here.
  const survivor = await start({
    types: { crash: { sleepMs: 10, globalLimit: 2 } },
    concurrency: 4,
    leaseTtlMs: 30_000,
    reapIntervalMs: 200,
  });
  const row = await waitForTerminal(db.sql, taskId, 30_000);
  await stop(survivor);

  assert.deepEqual(row, {
    status: "succeeded",
    total: 4,
    succeeded: 4,
    failed: 0,
    timedOut: 0,
    cancelled: 0,
  });
  const runs = await db.sql`select id, attempt, lease_owner from runs where task_id = ${taskId} order by id`;
  const retried = runs.filter((r) => r.attempt === 2);
  assert.equal(retried.length, 2, "the victim's two runs took a second attempt");
  const done = await db.sql`
    select e.run_id, e.worker_id from test_executions e join runs r on r.id = e.run_id
    where r.task_id = ${taskId} and e.ended_at is not null`;
  assert.equal(done.length, 4, "every run finished exactly once");
  assert.ok(done.every((e) => e.worker_id === survivor.id));
  const events =
    await db.sql`select type from task_events where task_id = ${taskId} and run_id is not null order by id`;
  assert.equal(events.filter((e) => e.type === "run.retry").length, 2);
});

test("global limit 2 with 3 workers × concurrency 4: never more than 2 live, sampled continuously", async () => {
  const spec = {
    types: { limited: { sleepMs: 30, globalLimit: 2 } },
    concurrency: 4,
    leaseTtlMs: 30_000,
    reapIntervalMs: 1000,
  };
  const workers = await Promise.all([start(spec), start(spec), start(spec)]);
  const taskId = await createTask(db.sql, owner, "limited", 60);
  let maxLive = 0;
  let samples = 0;
  for (;;) {
    const [s] = await db.sql`
      select count(*) filter (where status in ('starting','running','cancelling'))::int as live,
             (select status from tasks where id = ${taskId}) as task
      from runs where task_id = ${taskId}`;
    samples++;
    maxLive = Math.max(maxLive, s?.live ?? 0);
    if (s?.task === "succeeded") break;
  }
  await Promise.all(workers.map(stop));
  const runIds = (await db.sql`select id from runs where task_id = ${taskId}`).map((r) => Number(r.id));
  assert.ok(samples > 50, `sampled ${samples} times`);
  assert.equal(maxLive, 2, `at most 2 live runs (saw ${maxLive})`);
  assert.ok((await maxOverlap(db.sql, runIds)) <= 2, "handler executions never overlapped more than 2");
  assert.equal((await taskRow(db.sql, taskId)).succeeded, 60);
});

test("per-user limit 3 with 3 workers × concurrency 4 and a SIGKILL: never more than 3 live per user", async () => {
  const spec = {
    types: { peruser: { sleepMs: 40 } },
    concurrency: 4,
    userLimit: 3,
    leaseTtlMs: 1000,
    reapIntervalMs: 200,
  };
  // Only the victim's leases are short (recovered in seconds); the others' cannot expire while a loaded
  // machine pauses them, which would run a run twice and overlap more than the limit.
  const [victim, ...others] = await Promise.all([
    start({ ...spec, leaseTtlMs: 3000 }),
    start({ ...spec, leaseTtlMs: 30_000 }),
    start({ ...spec, leaseTtlMs: 30_000 }),
  ]);
  const users = await Promise.all(["limited-u1", "limited-u2"].map((n) => seedUser(db.sql, n)));
  const tasks = await Promise.all(users.map((u) => createTask(db.sql, u, "peruser", 40)));
  const maxLive = new Map<string, number>();
  let samples = 0;
  let killed = false;
  for (;;) {
    const rows = await db.sql<{ owner: string; live: number; done: number }[]>`
      select r.owner_id::text as owner,
             count(*) filter (where r.status in ('starting', 'running', 'cancelling'))::int as live,
             count(*) filter (where r.status = 'succeeded')::int as done
      from runs r where r.task_id in (${tasks[0] as string}, ${tasks[1] as string}) group by r.owner_id`;
    samples++;
    for (const r of rows) maxLive.set(r.owner, Math.max(maxLive.get(r.owner) ?? 0, r.live));
    const done = rows.reduce((n, r) => n + r.done, 0);
    if (!killed && done >= 20) {
      // Mid-drain: the victim's leases count until the reaper recovers them, so the limit still holds.
      victim?.child.kill("SIGKILL");
      await victim?.exited;
      killed = true;
    }
    if (done === 80) break;
  }
  await Promise.all(others.map(stop));
  assert.ok(killed && samples > 50, `sampled ${samples} times`);
  for (const u of users) {
    assert.equal(
      maxLive.get(String(u.userId)),
      3,
      `user ${u.name}: at most 3 live (saw ${maxLive.get(String(u.userId))})`,
    );
  }
  for (const taskId of tasks) {
    const runIds = (await db.sql`select id from runs where task_id = ${taskId}`).map((r) => Number(r.id));
    assert.ok(
      (await maxOverlap(db.sql, runIds, true)) <= 3,
      "finished executions of one user never overlapped more than 3",
    );
    assert.deepEqual(await taskRow(db.sql, taskId), {
      status: "succeeded",
      total: 40,
      succeeded: 40,
      failed: 0,
      timedOut: 0,
      cancelled: 0,
    });
  }
});
