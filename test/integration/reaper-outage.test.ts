// The reaper after a database outage: while nobody could reach the database, no worker could heartbeat
// its leases or advertise its types, so what expired meanwhile says nothing about the workers. A real
// outage of this file's own database (connections refused and cut), not a stub.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import postgres from "postgres";
import type { Principal } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { NO_OBSERVER } from "../../src/queue/observer.ts";
import { Reaper, type ReapPass } from "../../src/queue/reaper.ts";
import { runClaim, runHeartbeat, workerHeartbeat, workerRegister } from "../../src/queue/sql.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, runCounts, seedUser, waitFor } from "../helpers/queue.ts";

let db: TestDatabase;
let admin: postgres.Sql;
let owner: Principal;
const logger = createLogger({ level: "silent" });
before(async () => {
  db = await createTestDatabase();
  admin = postgres(process.env.ASSAY_TEST_ADMIN_URL as string, { max: 1, onnotice: () => {} });
  owner = await seedUser(db.sql, "réaper «outage»");
});
after(async () => {
  await admin`alter database ${admin(dbName())} allow_connections true`;
  await admin.end({ timeout: 5 });
  await db.drop();
});

const dbName = () => new URL(db.url).pathname.slice(1);

/** Refuses new connections to the test database and cuts the open ones, until `end()`. */
async function outage() {
  await admin`alter database ${admin(dbName())} allow_connections false`;
  await admin`select pg_terminate_backend(pid) from pg_stat_activity
              where datname = ${dbName()} and pid <> pg_backend_pid()`;
  return { end: () => admin`alter database ${admin(dbName())} allow_connections true` };
}

/** Waits, by the database server's clock, until `at` has passed. */
const serverPast = (at: Date) =>
  waitFor(async () => (await admin<{ past: boolean }[]>`select now() > ${at} as past`)[0]?.past, 10_000);

const worker = (types: string[]) => ({
  id: "w-outage",
  host: "h",
  pid: 1,
  analysisTypes: types,
  concurrency: 1,
});

/** A reaper's options here: a lease of 1 s, passes only when the test runs one. */
const reaperOptions = () => ({
  sql: db.sql,
  logger,
  intervalMs: 60_000,
  leaseTtlMs: 1000,
  retryBaseMs: 10,
  workerWaitMs: 60_000,
});

/** A one-run task of `type`, its run claimed by a registered worker with a lease of 1 s. */
async function claimedRun(type: string) {
  const taskId = await createTask(db.sql, owner, type, 1);
  await workerRegister(db.sql, worker([type]));
  const [run] = await runClaim(db.sql, {
    workerId: "w-outage",
    analysisType: type,
    limit: 1,
    globalLimit: 0,
    leaseTtlMs: 1000,
  });
  assert.ok(run);
  return { taskId, run };
}

test("after an outage longer than a lease, the reaper leaves a lease that expired during it a lease's time to be heartbeated", async () => {
  const type = "outage-lease";
  const { taskId, run } = await claimedRun(type);
  const [lease] = await db.sql<
    { expires: Date }[]
  >`select lease_expires_at as expires from runs where id = ${run.id}`;
  const reaper = new Reaper(reaperOptions());

  const down = await outage();
  // The reaper's pass during the outage fails; so would the worker's heartbeats.
  await assert.rejects(reaper.runOnce());
  await serverPast(lease?.expires as Date);
  await down.end();

  // Back: the reaper's first pass leaves the lease alone (it expired while it could not be renewed)…
  assert.equal((await reaper.runOnce()).requeued, 0);
  // …and the worker's heartbeat, the next moment, finds it still its own.
  await workerHeartbeat(db.sql, worker([type]));
  const beat = await runHeartbeat(db.sql, [{ id: run.id, token: run.leaseToken }], 1000);
  assert.deepEqual(
    beat.map((r) => ({ ...r })),
    [{ id: run.id, status: "starting" }],
  );
  assert.deepEqual(await runCounts(db.sql, taskId), { starting: 1 });

  // A worker that does not come back is still recovered, a lease after the database did.
  const [renewed] = await db.sql<
    { expires: Date }[]
  >`select lease_expires_at as expires from runs where id = ${run.id}`;
  await serverPast(renewed?.expires as Date);
  await waitFor(
    async () => (await reaper.runOnce()).requeued === 1,
    10_000,
    "the reaper to re-queue the run",
  );
  assert.deepEqual(await runCounts(db.sql, taskId), { queued: 1 });
});

test("after an outage longer than ASSAY_WORKER_WAIT_MS, queued runs do not fail ANALYSIS_WORKER_UNAVAILABLE before their workers can say they are there", async () => {
  const type = "outage-seen";
  await workerRegister(db.sql, worker([type]));
  const taskId = await createTask(db.sql, owner, type, 2);
  const [seen] = await db.sql<{ at: Date }[]>`
    select last_seen_at + interval '1 second' as at from analysis_type_seen where analysis_type = ${type}`;
  const reaper = new Reaper({
    sql: db.sql,
    logger,
    intervalMs: 60_000,
    leaseTtlMs: 1000,
    retryBaseMs: 10,
    workerWaitMs: 1000,
  });

  const down = await outage();
  await assert.rejects(reaper.runOnce());
  await serverPast(seen?.at as Date);
  await down.end();

  await reaper.runOnce();
  assert.deepEqual(await runCounts(db.sql, taskId), { queued: 2 });
  // The worker's heartbeat comes: its type is served, and its runs keep waiting for it.
  await workerHeartbeat(db.sql, worker([type]));
  assert.deepEqual(await runCounts(db.sql, taskId), { queued: 2 });
  // Once the type has gone unseen for the wait with the database up, its runs do fail.
  const [again] = await db.sql<{ at: Date }[]>`
    select last_seen_at + interval '1 second' as at from analysis_type_seen where analysis_type = ${type}`;
  await serverPast(again?.at as Date);
  await waitFor(
    async () => {
      await reaper.runOnce();
      return (await runCounts(db.sql, taskId)).failed === 2;
    },
    10_000,
    "the reaper to fail the runs",
  );
});

test("runs a pass took back before one of its later statements failed are still reported (metrics, log)", async () => {
  const type = "partial-pass";
  const taskId = await createTask(db.sql, owner, type, 2);
  await runClaim(db.sql, {
    workerId: "w-outage",
    analysisType: type,
    limit: 2,
    globalLimit: 0,
    leaseTtlMs: 1000,
  });
  await db.sql`update runs set lease_expires_at = now() - interval '1 second' where task_id = ${taskId}`;
  const told: ReapPass[] = [];
  const reaper = new Reaper({
    sql: db.sql,
    logger,
    intervalMs: 60_000,
    leaseTtlMs: 1000,
    retryBaseMs: 10,
    workerWaitMs: 1000,
    observer: { ...NO_OBSERVER, reaped: (pass) => told.push({ ...pass }) },
  });
  // The pass's second statement fails (a table it reads is gone); the first one's re-queues committed.
  await db.sql`alter table analysis_type_seen rename to analysis_type_seen_away`;
  try {
    await assert.rejects(reaper.runOnce(), /analysis_type_seen/);
  } finally {
    await db.sql`alter table analysis_type_seen_away rename to analysis_type_seen`;
  }
  assert.deepEqual(await runCounts(db.sql, taskId), { queued: 2 });
  assert.equal(told.length, 1);
  assert.equal(told[0]?.requeued, 2);
});

test("a pass whose first statement the database answers with an error (a missing table) is no outage: the next pass reaps at once", async () => {
  const type = "answered-error";
  const taskId = await createTask(db.sql, owner, type, 1);
  await runClaim(db.sql, {
    workerId: "w-outage",
    analysisType: type,
    limit: 1,
    globalLimit: 0,
    leaseTtlMs: 1000,
  });
  await db.sql`update runs set lease_expires_at = now() - interval '1 second' where task_id = ${taskId}`;
  const reaper = new Reaper({
    sql: db.sql,
    logger,
    intervalMs: 60_000,
    // A lease far longer than the test: an outage's grace would hold the reaping off for it.
    leaseTtlMs: 600_000,
    retryBaseMs: 10,
    workerWaitMs: 600_000,
  });
  await db.sql`alter table runs rename to runs_away`;
  try {
    await assert.rejects(reaper.runOnce(), /runs/);
  } finally {
    await db.sql`alter table runs_away rename to runs`;
  }
  assert.equal((await reaper.runOnce()).requeued, 1, "reaped at once");
  assert.deepEqual(await runCounts(db.sql, taskId), { queued: 1 });
});

test("a reaper started during or just after an outage (it saw none) leaves a lease that expired meanwhile a lease's time to be heartbeated", async () => {
  const type = "outage-restarted";
  const { taskId, run } = await claimedRun(type);
  // The healthy worker's lease ran out while the database was away (nothing could renew it)…
  await db.sql`update runs set lease_expires_at = now() - interval '5 s' where id = ${run.id}`;
  // …and a worker restarted meanwhile starts its reaper as the database comes back.
  const restarted = new Reaper({ ...reaperOptions(), graceAtStart: true });
  const started = performance.now();
  assert.equal((await restarted.runOnce()).requeued, 0, "its first pass takes back nothing");
  // The healthy worker's heartbeat, within the lease's time, finds the lease still its own.
  const beat = await runHeartbeat(db.sql, [{ id: run.id, token: run.leaseToken }], 1000);
  assert.deepEqual(
    beat.map((r) => ({ ...r })),
    [{ id: run.id, status: "starting" }],
  );
  // Expired again, and no heartbeat comes this time: taken back, but not before a lease's time after
  // the reaper's first answer.
  await db.sql`update runs set lease_expires_at = now() - interval '5 s' where id = ${run.id}`;
  if (performance.now() - started < 1000) {
    assert.equal((await restarted.runOnce()).requeued, 0, "still within the grace");
  }
  await waitFor(async () => (await restarted.runOnce()).requeued === 1, 10_000, "the reap after the grace");
  assert.ok(performance.now() - started >= 1000, "not before a lease's time after its first answer");
  assert.deepEqual(await runCounts(db.sql, taskId), { queued: 1 });
});
