// Retention: old finished tasks go with their runs, events and output objects — in a local store and in
// an S3-compatible one alike.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { Retention } from "../../src/queue/retention.ts";
import { taskDeleteExpired } from "../../src/queue/sql/retention.ts";
import { runClaim, runComplete } from "../../src/queue/sql.ts";
import { LocalStore } from "../../src/storage/local.ts";
import type { ObjectStore } from "../../src/storage/store.ts";
import { taskCancel } from "../../src/tasks/cancel.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser } from "../helpers/queue.ts";
import { createTestBucket, type TestBucket } from "../helpers/s3.ts";

let db: TestDatabase;
let owner: Principal;
let bucket: TestBucket;
const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-retention-"));
before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "retention");
  bucket = await createTestBucket();
});
after(async () => {
  await db.drop();
  await bucket.drop();
  fs.rmSync(root, { recursive: true, force: true });
});

/** A task of 3 runs, finished `daysAgo`, each run with two output objects in `store`. */
async function finished(store: ObjectStore, type: string, daysAgo: number): Promise<string> {
  const taskId = await createTask(db.sql, owner, type, 3);
  const runs = await runClaim(db.sql, {
    workerId: "w",
    analysisType: type,
    limit: 3,
    globalLimit: 0,
    leaseTtlMs: 30_000,
  });
  const outcomes = runs.map((r) => ({
    id: r.id,
    token: r.leaseToken,
    status: "succeeded" as const,
    outputKey: `${taskId}/${r.id}.${r.attempt}.${r.leaseToken}`,
  }));
  for (const o of outcomes) {
    for (const name of ["out.json", "out.csv"]) {
      await store.put(`outputs/${o.outputKey}/${name}`, Readable.from([Buffer.from(name)]));
    }
  }
  await runComplete(db.sql, outcomes);
  await db.sql`update tasks set finished_at = now() - ${daysAgo} * interval '1 day' where id = ${taskId}`;
  return taskId;
}

const objectsOf = async (store: ObjectStore, taskId: string) =>
  (await store.list(`outputs/${taskId}/`)).length;

for (const [kind, makeStore] of [
  ["local", () => new LocalStore(root)],
  ["s3", () => bucket.store("retention/")],
] as const) {
  test(`${kind}: retention deletes only old finished tasks, with their runs, events and output objects`, async () => {
    const store = makeStore();
    const old1 = await finished(store, `ret-a-${kind}`, 40);
    const old2 = await finished(store, `ret-b-${kind}`, 31);
    const recent = await finished(store, `ret-c-${kind}`, 5);
    const unfinished = await createTask(db.sql, owner, `ret-d-${kind}`, 1);
    await db.sql`update tasks set created_at = now() - interval '90 days' where id = ${unfinished}`;

    const retention = new Retention({
      sql: db.sql,
      logger: createLogger({ level: "silent" }),
      store,
      retentionDays: 30,
      intervalMs: 60_000,
      batchSize: 1,
    });
    assert.equal(await retention.runOnce(), 2);
    const left = (
      await db.sql`select t.id::text as id from tasks t where t.analysis_type like ${`ret-%-${kind}`} order by t.id`
    ).map((r) => r.id);
    assert.deepEqual(left, [recent, unfinished]);
    for (const gone of [old1, old2]) {
      assert.equal((await db.sql`select 1 from runs where task_id = ${gone}`).length, 0);
      assert.equal((await db.sql`select 1 from task_events where task_id = ${gone}`).length, 0);
      assert.equal(await objectsOf(store, gone), 0);
    }
    assert.equal(await objectsOf(store, recent), 6);
    assert.equal(await retention.runOnce(), 0);
  });
}

test("deleting tasks deletes exactly their runs and events, in the same statement (tasks_delete_children)", async () => {
  const doomed = [await createTask(db.sql, owner, "del-a", 3), await createTask(db.sql, owner, "del-b", 2)];
  const kept = await createTask(db.sql, owner, "del-c", 4);
  const counts = async (ids: string[]) => {
    const [row] = await db.sql<{ runs: number; events: number }[]>`
      select (select count(*)::int from runs where task_id = any(${ids}::bigint[])) as runs,
             (select count(*)::int from task_events where task_id = any(${ids}::bigint[])) as events`;
    return row;
  };
  assert.deepEqual(await counts(doomed), { runs: 5, events: 2 });
  const keptBefore = await counts([kept]);
  assert.equal(keptBefore?.runs, 4);
  const deleted = await db.sql`delete from tasks where id = any(${doomed}::bigint[]) returning id`;
  assert.equal(deleted.length, 2);
  assert.deepEqual(await counts(doomed), { runs: 0, events: 0 });
  assert.deepEqual(await counts([kept]), keptBefore);
  // A delete that is rolled back takes nothing with it.
  await assert.rejects(
    db.sql.begin(async (tx) => {
      await tx`delete from tasks where id = ${kept}`;
      throw new Error("roll back");
    }),
    /roll back/,
  );
  assert.deepEqual(await counts([kept]), keptBefore);
});

/** A task of `runs` runs, cancelled (every run queued, so it ends at once) and finished `daysAgo`. */
async function cancelledTask(type: string, runs: number, daysAgo: number): Promise<string> {
  const taskId = await createTask(db.sql, owner, type, runs);
  const cancel = await taskCancel(db.sql, owner, taskId);
  assert.ok(cancel.kind === "cancelling" && cancel.status === "cancelled", JSON.stringify(cancel));
  await db.sql`update tasks set finished_at = now() - ${daysAgo} * interval '1 day' where id = ${taskId}`;
  return taskId;
}

test("a statement deletes tasks while their runs fit its budget, the oldest whatever its size, and a pass goes on to the end", async () => {
  // Oldest first: a big task, then three small ones, then a big one again.
  const big1 = await cancelledTask("bud-a", 1_200, 50);
  const small = [
    await cancelledTask("bud-b", 30, 49),
    await cancelledTask("bud-c", 30, 48),
    await cancelledTask("bud-d", 30, 47),
  ];
  const big2 = await cancelledTask("bud-e", 150, 46);
  const runsOf = async (ids: string[]) =>
    (
      await db.sql<{ n: number }[]>`select count(*)::int as n from runs where task_id = any(${ids}::bigint[])`
    )[0]?.n;
  assert.equal(await runsOf([big1, ...small, big2]), 1_440);

  // One statement at a time: the big one alone though it is over the budget; then the small ones
  // together (90 runs), stopping before the next big one (240 would be over 100).
  assert.deepEqual(await taskDeleteExpired(db.sql, 30, 20, 100), [big1]);
  assert.equal(await runsOf([big1]), 0);
  assert.deepEqual((await taskDeleteExpired(db.sql, 30, 20, 100)).sort(), [...small].sort());
  assert.equal(await runsOf(small), 0);
  assert.equal(await runsOf([big2]), 150);

  // A pass goes on past a statement that deleted fewer tasks than its batch (the budget cut it).
  const more = [await cancelledTask("bud-f", 120, 45), await cancelledTask("bud-g", 120, 44)];
  const retention = new Retention({
    sql: db.sql,
    logger: createLogger({ level: "silent" }),
    store: new LocalStore(root),
    retentionDays: 30,
    intervalMs: 60_000,
    runBudget: 100,
  });
  assert.equal(await retention.runOnce(), 3);
  assert.equal(await runsOf([big2, ...more]), 0);
  assert.equal((await db.sql`select 1 from tasks where id = any(${[big2, ...more]}::bigint[])`).length, 0);
});
