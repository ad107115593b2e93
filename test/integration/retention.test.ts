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
import { runClaim, runComplete } from "../../src/queue/sql.ts";
import { LocalStore } from "../../src/storage/local.ts";
import type { ObjectStore } from "../../src/storage/store.ts";
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
