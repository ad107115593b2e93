// PostgreSQL out of disk (SQLSTATE 53100, disk_full) when an upload's or a task's row is written: 507
// STORAGE_FULL, as for a full disk under the store — the server's lack of room, not a bug's 500 —
// with nothing left (no row, no stored bytes), the cause logged, and the same request succeeding
// once there is room. The disk is not filled: a trigger in this test's own database raises 53100.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";

let t: TestApp;
let alice: string;

before(async () => {
  t = await startTestApp();
  alice = await t.token("alice");
  await t.db.sql.unsafe(`
    create function test_disk_full() returns trigger language plpgsql as $$
    begin
      raise exception 'could not extend file "base/1/2": No space left on device' using errcode = '53100';
    end $$`);
});
after(() => t.close());

/** Every insert into `table` fails as on a full disk until the returned function is called. */
async function diskFullOn(table: "files" | "tasks") {
  await t.db.sql.unsafe(
    `create trigger disk_full before insert on ${table} for each row execute function test_disk_full()`,
  );
  return () => t.db.sql.unsafe(`drop trigger disk_full on ${table}`);
}

function upload(content: string, key?: string) {
  const { payload, headers } = multipart("file", content, "measurements.csv");
  return t.app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { ...headers, ...bearer(alice), ...(key === undefined ? {} : { "idempotency-key": key }) },
  });
}

const count = async (table: "files" | "tasks" | "runs") =>
  (await t.db.sql<{ n: number }[]>`select count(*)::int as n from ${t.db.sql(table)}`)[0]?.n;

const loggedDiskFull = (from: number) =>
  t.logs
    .slice(from)
    .some((l) => (l.level as number) >= 50 && /PostgresError: could not extend file/.test(JSON.stringify(l)));

test("an upload whose row the database has no disk for → 507 STORAGE_FULL, nothing kept; the retry succeeds", async () => {
  const restore = await diskFullOn("files");
  try {
    const logsBefore = t.logs.length;
    const full = await upload("a,b\n1,2\n", "upload-1");
    assert.equal(full.statusCode, 507, full.body);
    assert.deepEqual(full.json(), {
      code: "STORAGE_FULL",
      message: "The server has no room to store this file.",
    });
    assert.ok(loggedDiskFull(logsBefore), "the database's error is logged at error level");
    assert.equal(await count("files"), 0);
    assert.deepEqual(await t.storage.list("files/"), [], "the stored bytes are deleted");
  } finally {
    await restore();
  }
  const retry = await upload("a,b\n1,2\n", "upload-1");
  assert.equal(retry.statusCode, 201, retry.body);
  assert.equal(await count("files"), 1);
});

test("a task create the database has no disk for → 507 STORAGE_FULL, nothing created; the retry succeeds", async () => {
  const file = await upload("x,y\n3,4\n");
  assert.equal(file.statusCode, 201, file.body);
  const create = () =>
    t.app.inject({
      method: "POST",
      url: "/api/analysis-tasks",
      headers: { ...bearer(alice), "idempotency-key": "task-1" },
      payload: { analysisType: "summary", inputFileIds: [file.json().data.fileId] },
    });
  const restore = await diskFullOn("tasks");
  try {
    const logsBefore = t.logs.length;
    const full = await create();
    assert.equal(full.statusCode, 507, full.body);
    assert.deepEqual(full.json(), {
      code: "STORAGE_FULL",
      message: "The server has no room to store this task.",
    });
    assert.ok(loggedDiskFull(logsBefore), "the database's error is logged at error level");
    assert.equal(await count("tasks"), 0);
    assert.equal(await count("runs"), 0);
  } finally {
    await restore();
  }
  const retry = await create();
  assert.equal(retry.statusCode, 201, retry.body);
  assert.equal(await count("runs"), 1);
});

test("another database error stays a 500", async () => {
  await t.db.sql.unsafe(`
    create function test_out_of_memory() returns trigger language plpgsql as $$
    begin raise exception 'out of memory' using errcode = '53200'; end $$`);
  await t.db.sql.unsafe(
    `create trigger out_of_memory before insert on files for each row execute function test_out_of_memory()`,
  );
  try {
    const res = await upload("a\n");
    assert.equal(res.statusCode, 500, res.body);
    assert.equal(res.json().code, "INTERNAL_ERROR");
  } finally {
    await t.db.sql.unsafe(`drop trigger out_of_memory on files`);
  }
});
