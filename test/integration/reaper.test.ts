import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { Reaper } from "../../src/queue/reaper.ts";
import { runClaim, workerRegister } from "../../src/queue/sql.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, runCounts, seedUser, taskRow, waitFor } from "../helpers/queue.ts";

let db: TestDatabase;
let owner: Principal;
const logger = createLogger({ level: "silent" });
before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "reaper");
});
after(() => db.drop());

const reaper = (workerWaitMs: number, leaseTtlMs = 1000) =>
  new Reaper({ sql: db.sql, logger, intervalMs: 1000, leaseTtlMs, retryBaseMs: 10, workerWaitMs });

test("a type no live worker supports: runs stay queued, then fail ANALYSIS_WORKER_UNAVAILABLE after the wait", async () => {
  await workerRegister(db.sql, { id: "w1", host: "h", pid: 1, analysisTypes: ["served"], concurrency: 1 });
  const orphan = await createTask(db.sql, owner, "unserved", 3);
  const served = await createTask(db.sql, owner, "served", 2);
  const r = reaper(1500);
  assert.equal((await r.runOnce()).failed, 0);
  assert.deepEqual(await runCounts(db.sql, orphan), { queued: 3 });
  await db.sql`update runs set created_at = now() - interval '2 seconds' where task_id in (${orphan}, ${served})`;
  // The served type was advertised just now: its runs keep waiting.
  await workerRegister(db.sql, { id: "w1", host: "h", pid: 1, analysisTypes: ["served"], concurrency: 1 });
  const pass = await r.runOnce();
  assert.equal(pass.failed, 3);
  assert.equal(pass.finishedTasks, 1);
  assert.deepEqual(await taskRow(db.sql, orphan), {
    status: "failed",
    total: 3,
    succeeded: 0,
    failed: 3,
    timedOut: 0,
    cancelled: 0,
  });
  const [run] = await db.sql`select error_code from runs where task_id = ${orphan} limit 1`;
  assert.equal(run?.error_code, "ANALYSIS_WORKER_UNAVAILABLE");
  assert.deepEqual(await runCounts(db.sql, served), { queued: 2 });
});

test("expired leases: re-queued with attempts left, failed when exhausted, cancelling → cancelled; counted once", async () => {
  const taskId = await createTask(db.sql, owner, "expiring", 3, { maxAttempts: 2 });
  const claimed = await runClaim(db.sql, {
    workerId: "dead",
    analysisType: "expiring",
    limit: 3,
    globalLimit: 0,
    leaseTtlMs: 1,
  });
  assert.equal(claimed.length, 3);
  const [a, b, c] = claimed.map((x) => x.id) as [number, number, number];
  await db.sql`update runs set attempt = 2 where id = ${b}`;
  await db.sql`update runs set status = 'cancelling' where id = ${c}`;
  await new Promise((res) => setTimeout(res, 5));
  // Two reapers at once: SKIP LOCKED splits the work, nothing is done twice.
  const [p1, p2] = await Promise.all([reaper(60_000).runOnce(), reaper(60_000).runOnce()]);
  assert.equal(p1.requeued + p2.requeued, 1);
  assert.equal(p1.failed + p2.failed, 1);
  assert.equal(p1.cancelled + p2.cancelled, 1);
  const runs =
    await db.sql`select id, status, error_code, lease_token from runs where task_id = ${taskId} order by id`;
  assert.deepEqual(
    runs.map((r) => [Number(r.id), r.status, r.error_code, r.lease_token]),
    [
      [a, "queued", "ANALYSIS_WORKER_UNAVAILABLE", null],
      [b, "failed", "ANALYSIS_WORKER_UNAVAILABLE", null],
      [c, "cancelled", "ANALYSIS_PROCESS_CANCELLED", null],
    ],
  );
  const row = await taskRow(db.sql, taskId);
  assert.deepEqual(row, { status: "running", total: 3, succeeded: 0, failed: 1, timedOut: 0, cancelled: 1 });
  assert.deepEqual(await reaper(60_000).runOnce(), {
    requeued: 0,
    failed: 0,
    cancelled: 0,
    finishedTasks: 0,
    staleWorkers: 0,
  });
});

test("stale worker rows are deleted", async () => {
  await workerRegister(db.sql, { id: "old", host: "h", pid: 2, analysisTypes: ["x"], concurrency: 1 });
  await db.sql`update workers set heartbeat_at = now() - interval '1 hour' where id = 'old'`;
  const pass = await reaper(60_000).runOnce();
  assert.ok(pass.staleWorkers >= 1);
  assert.equal((await db.sql`select 1 from workers where id = 'old'`).length, 0);
});

// A claim under a limit first waits for the claim locks (runClaim's transaction). Its lease used to be
// stamped from now(), the transaction's start: a claim that waited W handed out TTL − W, and the reaper
// took the fresh attempt back before its first heartbeat (TTL 3 s behind a lock held 2.5 s: 0.5 s left).
for (const limit of ["global", "per-user"] as const) {
  test(`a ${limit} limited claim that waited for the claim lock gets a whole lease, counted from when it wrote it`, async () => {
    const type = `lease-after-lock-${limit}`;
    const taskId = await createTask(db.sql, owner, type, 1);
    const TTL = 3000;
    // runClaim's advisory-lock keys (claim.ts: CLAIM_LOCK_NAMESPACE "clai" by type; OWNER_LOCK_NAMESPACE
    // "ownr" by owner).
    const lockKey =
      limit === "global"
        ? db.sql`select pg_advisory_xact_lock(${0x636c6169}, hashtext(${type}))`
        : db.sql`select pg_advisory_xact_lock(${0x6f776e72}, hashint8(${owner.userId}::bigint))`;
    let locked: () => void = () => {};
    const isLocked = new Promise<void>((r) => (locked = r));
    let claimWaits: () => void = () => {};
    const waiting = new Promise<void>((r) => (claimWaits = r));
    // Another worker's claim holding the lock (a slow commit, say) until well after this claim queued
    // behind it; it returns when it let go (its last statement, by the database's clock).
    const holder = db.sql.begin(async (tx) => {
      await tx`${lockKey}`;
      locked();
      await waiting;
      await tx`select pg_sleep(2)`;
      const [row] = await tx<{ at: Date }[]>`select clock_timestamp() as at`;
      return row?.at as Date;
    });
    await isLocked;
    const claiming = runClaim(db.sql, {
      workerId: "alive",
      analysisType: type,
      limit: 1,
      globalLimit: limit === "global" ? 2 : 0,
      userLimit: limit === "per-user" ? 5 : 0,
      leaseTtlMs: TTL,
    });
    await waitFor(
      async () =>
        (await db.sql`select 1 from pg_locks where locktype = 'advisory' and not granted`).length > 0,
      30_000,
      "the claim to wait for the claim lock",
    );
    claimWaits();
    const [released, claimed] = await Promise.all([holder, claiming]);
    assert.equal(claimed.length, 1);
    const [row] = await db.sql<{ expires: Date; heartbeat: Date; started: Date }[]>`
      select lease_expires_at as expires, heartbeat_at as heartbeat, started_at as started
      from runs where task_id = ${taskId}`;
    assert.ok(row);
    // Stamped after the lock was let go: the whole TTL from then on.
    assert.ok(
      row.expires.getTime() >= released.getTime() + TTL,
      `lease ends ${row.expires.getTime() - released.getTime()} ms after the lock was let go, TTL ${TTL}`,
    );
    assert.ok(row.heartbeat.getTime() >= released.getTime());
    assert.ok(row.started.getTime() >= released.getTime());
    // So the reaper leaves the attempt alone until its first heartbeat is due (TTL / 3).
    assert.equal((await reaper(600_000, TTL).runOnce()).requeued, 0);
    assert.deepEqual(await runCounts(db.sql, taskId), { starting: 1 });
  });
}
