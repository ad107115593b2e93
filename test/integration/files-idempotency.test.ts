// POST /api/files with an Idempotency-Key: a retried upload (its first answer lost) answers the first
// try's file instead of making a second row, and stores nothing (its body is only hashed); the bytes a
// concurrent repeat stored are deleted; the same key with other bytes is a 409 that leaves nothing;
// keys are per user; bad keys get the task create's error.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import type { TransactionSql } from "postgres";
import { createDatabase } from "../../src/db/client.ts";
import { fileCreate, fileDelete, fileKey } from "../../src/files/files.ts";
import { PayloadTooLargeError, SourceError } from "../../src/storage/store.ts";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";
import { tcpRelay } from "../helpers/client.ts";
import { idsCrossPowerOfTen, seedUser, waitFor } from "../helpers/queue.ts";

let t: TestApp;
let alice: string;
let bob: string;
/** The store's puts so far: the app's own store, its put counted (the bytes still go to disk). */
let puts = 0;

before(async () => {
  t = await startTestApp();
  const put = t.storage.put.bind(t.storage);
  t.storage.put = (...args) => {
    puts++;
    return put(...args);
  };
  [alice, bob] = await Promise.all([t.token("zoë «alice»"), t.token("bob 🚀")]);
  // Ids past a digit boundary: a replay must answer the first id, not a text-sorted neighbour.
  await idsCrossPowerOfTen(t.db.sql, "files", 1);
});
after(() => t.close());

function upload(token: string, content: string, key: string | undefined, filename = "relevé «1».csv") {
  const { payload, headers } = multipart("file", content, filename);
  return t.app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { ...headers, ...bearer(token), ...(key === undefined ? {} : { "Idempotency-Key": key }) },
  });
}

const objects = () => {
  const dir = path.join(t.config.dataDir, "files");
  return fs.existsSync(dir) ? fs.readdirSync(dir).sort() : [];
};
const rowsOfKey = async (key: string) =>
  (await t.db.sql<{ id: string }[]>`select id::text from files where idempotency_key = ${key}`).map(
    (r) => r.id,
  );
const rowIds = async () =>
  (await t.db.sql<{ id: string }[]>`select id::text from files order by id`).map((r) => r.id);

/**
 * Runs `insert` in a transaction that stays open until `release()`: resolves once the insert has run,
 * with the transaction's end (`committed`, the insert's result).
 */
async function uncommitted<T>(insert: (tx: TransactionSql) => Promise<T>) {
  let release!: () => void;
  const released = new Promise<void>((r) => {
    release = r;
  });
  let inserted!: () => void;
  const insertedFirst = new Promise<void>((r) => {
    inserted = r;
  });
  const committed = t.db.sql.begin(async (tx) => {
    const result = await insert(tx);
    inserted();
    await released;
    return result;
  }) as Promise<T>;
  await Promise.race([insertedFirst, committed]);
  return { committed, release };
}

/** Until an insert into files waits on a row lock in this file's database (a replay behind a first try). */
const insertWaitsOnLock = () =>
  waitFor(
    async () =>
      (
        await t.db.sql`select 1 from pg_stat_activity
                      where datname = current_database() and wait_event_type = 'Lock'
                        and query like '%insert into files%'`
      ).length > 0 || undefined,
    10_000,
  );

test("the same key twice with the same bytes: one row, one object, the first file answered 200", async () => {
  const key = "c2f1e7d0-9b1a-4c3e-8f00-~!{}";
  const content = "a,b\n1,2\n";
  const first = await upload(alice, content, key);
  assert.equal(first.statusCode, 201, first.body);
  assert.equal(first.json().message, "File uploaded");
  const [before, putsBefore] = [objects(), puts];
  // The retry names the file differently (a renamed local file): the first file still answers.
  const again = await upload(alice, content, key, "other name.csv");
  assert.equal(again.statusCode, 200, again.body);
  assert.equal(again.json().message, "File already uploaded");
  assert.deepEqual(again.json().data, first.json().data);
  assert.deepEqual(await rowsOfKey(key), [first.json().data.fileId]);
  assert.equal(puts, putsBefore, "the repeat's bytes are not stored");
  assert.deepEqual(objects(), before);
  assert.equal(first.json().data.sha256, createHash("sha256").update(content).digest("hex"));
});

test("the same key with other bytes: 409 IDEMPOTENCY_KEY_REUSED, no row and no object left", async () => {
  const key = "k-conflict";
  const first = await upload(alice, "x\n1\n", key);
  assert.equal(first.statusCode, 201);
  const [rows, objs, putsBefore] = [await rowIds(), objects(), puts];
  for (const other of ["x\n2\n", "x\n1\n1"]) {
    const res = await upload(alice, other, key);
    assert.equal(res.statusCode, 409, res.body);
    assert.equal(res.json().code, "IDEMPOTENCY_KEY_REUSED");
  }
  assert.deepEqual(await rowIds(), rows);
  assert.deepEqual(objects(), objs);
  assert.equal(puts, putsBefore, "nothing stored");
});

test("a replay is read to its end and checked as a first upload is: past the limit 413, cut short 400", async () => {
  const owner = await seedUser(t.db.sql, "zoë limit «✓»");
  const key = "replay-limits";
  const content = Buffer.alloc(1000, "é");
  const meta = { name: "big «1».csv", contentType: "text/csv", maxBytes: 1000, idempotencyKey: key };
  const first = await fileCreate(t.db.sql, t.storage, owner, Readable.from([content]), meta);
  assert.equal(first.kind, "created");
  const putsBefore = puts;
  // One byte past the limit: too large, as a first upload would be (413 PAYLOAD_TOO_LARGE).
  await assert.rejects(
    fileCreate(t.db.sql, t.storage, owner, Readable.from([content, Buffer.from("x")]), meta),
    PayloadTooLargeError,
  );
  // A body that fails by itself is the sender's fault (400 INVALID_MULTIPART), not a conflict.
  let reads = 0;
  const failing = new Readable({
    read() {
      if (reads++ === 0) this.push(content.subarray(0, 10));
      else this.destroy(new Error("client went away"));
    },
  });
  await assert.rejects(fileCreate(t.db.sql, t.storage, owner, failing, meta), SourceError);
  assert.equal(puts, putsBefore, "nothing stored");
  const again = await fileCreate(t.db.sql, t.storage, owner, Readable.from([content]), meta);
  assert.deepEqual(again, { kind: "existing", file: first.kind === "created" ? first.file : undefined });

  // Over HTTP: a replay whose body ends before its closing boundary.
  const key2 = "replay-cut-«2»".replace(/[^\x21-\x7e]/g, "_");
  assert.equal((await upload(alice, "c\n1\n", key2)).statusCode, 201);
  const { payload, headers } = multipart("file", "c\n1\n");
  const cut = await t.app.inject({
    method: "POST",
    url: "/api/files",
    payload: payload.subarray(0, payload.length - 12),
    headers: { ...headers, ...bearer(alice), "idempotency-key": key2 },
  });
  assert.equal(cut.statusCode, 400, cut.body);
  assert.equal(cut.json().code, "INVALID_MULTIPART");
  assert.equal(puts, putsBefore + 1, "only the first upload stored");
});

test("another user's key does not collide; an upload without a key is never a replay", async () => {
  const key = "shared-key";
  const a = await upload(alice, "s\n1\n", key);
  const b = await upload(bob, "s\n1\n", key);
  assert.equal(a.statusCode, 201);
  assert.equal(b.statusCode, 201);
  assert.notEqual(a.json().data.fileId, b.json().data.fileId);
  assert.equal(b.json().data.owner, "bob 🚀");
  const n1 = await upload(alice, "s\n1\n", undefined);
  const n2 = await upload(alice, "s\n1\n", undefined);
  assert.equal(n1.statusCode, 201);
  assert.equal(n2.statusCode, 201);
  assert.notEqual(n1.json().data.fileId, n2.json().data.fileId);
});

test("concurrent uploads with one key: one row, the others answered with it and their objects removed", async () => {
  const key = "race-key";
  const objs = objects();
  const answers = await Promise.all(Array.from({ length: 6 }, () => upload(alice, "r\n1\n2\n", key)));
  assert.deepEqual(answers.map((r) => r.statusCode).sort(), [200, 200, 200, 200, 200, 201]);
  const ids = new Set(answers.map((r) => r.json().data.fileId));
  assert.equal(ids.size, 1);
  assert.deepEqual(await rowsOfKey(key), [...ids]);
  assert.deepEqual(objects(), [...objs, ...ids].sort());
});

test("an upload that waits on an uncommitted first try with its key answers that try once it commits", async () => {
  const key = "in-flight-key";
  const content = "w\n1\n";
  const sha256 = createHash("sha256").update(content).digest("hex");
  const [owner] = await t.db.sql<{ id: string }[]>`select id::text from users where name = 'zoë «alice»'`;
  const objs = objects();
  // The first try, inserted and not committed yet: the upload's look-up does not see it, and its
  // insert waits on the unique index.
  const { committed: first, release } = await uncommitted(async (tx) => {
    const [row] = await tx<{ id: string }[]>`
      insert into files (owner_id, name, content_type, size_bytes, sha256, storage_key, idempotency_key)
      values (${owner?.id as string}, 'first.csv', 'text/csv', ${content.length}, ${sha256},
              'files/in-flight', ${key})
      returning id::text`;
    return row?.id as string;
  });
  const retry = upload(alice, content, key);
  await insertWaitsOnLock();
  release();
  const firstId = await first;
  const res = await retry;
  assert.equal(res.statusCode, 200, res.body);
  assert.equal(res.json().data.fileId, firstId);
  assert.equal(res.json().data.name, "first.csv");
  assert.deepEqual(objects(), objs, "the waiting upload's object is deleted");
});

test("a bad key is 400 VALIDATION_FAILED before anything is stored", async () => {
  const [rows, objs] = [await rowIds(), objects()];
  for (const key of ["", "has space", "x".repeat(201), "tab\tkey", "clé"]) {
    const { payload, headers } = multipart("file", "b\n1\n");
    const res = await t.app.inject({
      method: "POST",
      url: "/api/files",
      payload,
      headers: { ...headers, ...bearer(alice), "idempotency-key": key },
    });
    assert.equal(res.statusCode, 400, JSON.stringify(key));
    assert.equal(res.json().code, "VALIDATION_FAILED");
    assert.match(res.json().message + JSON.stringify(res.json()), /Idempotency-Key/);
  }
  assert.equal((await upload(alice, "b\n1\n", "x".repeat(200))).statusCode, 201);
  assert.equal((await rowIds()).length, rows.length + 1);
  assert.equal(objects().length, objs.length + 1);
});

/**
 * A relay to PostgreSQL that holds back the server's answer naming `marker` until `meanwhile()` has
 * run: what another client does between that statement's answer and the next one.
 */
async function holdAnswer(target: URL, marker: string, meanwhile: () => Promise<void>) {
  let held = 0;
  const relay = await tcpRelay(target, (client, upstream) => {
    client.pipe(upstream);
    // In order: a chunk after a held one waits for it.
    let queue = Promise.resolve();
    upstream.on("data", (chunk: Buffer) => {
      const hold = chunk.includes(marker);
      if (hold) held++;
      queue = queue.then(async () => {
        if (hold) await meanwhile();
        client.write(chunk);
      });
    });
  });
  const url = new URL(target);
  url.hostname = "127.0.0.1";
  url.port = String(relay.port);
  return { url: url.toString(), held: () => held, close: relay.close };
}

test("a replay whose first file commits after its look-up and is deleted before its conflict's look-up is stored: a new file, not a 500", async () => {
  const owner = await seedUser(t.db.sql, "zoë \u202ereplay");
  const key = "replay-after-delete-«1»".replace(/[^\x21-\x7e]/g, "_");
  const content = "naïve,ü\n1,2\n";
  const sha256 = createHash("sha256").update(content).digest("hex");
  const meta = { name: "relevé ✓.csv", contentType: "text/csv", maxBytes: 1024, idempotencyKey: key };
  // The first try, stored and inserted but not committed yet: the replay's look-up does not see it,
  // so the replay stores its bytes and its insert waits on the key.
  const [next] = await t.db.sql<{ id: string }[]>`
    select nextval(pg_get_serial_sequence('files', 'id'))::text as id`;
  const firstId = next?.id as string;
  await t.storage.put(fileKey(firstId), Readable.from([Buffer.from(content)]));
  // Inserted before the replay starts: else the replay's row could commit first, and the first try fail.
  const { committed: first, release } = await uncommitted(async (tx) => {
    await tx`
      insert into files (id, owner_id, name, content_type, size_bytes, sha256, storage_key, idempotency_key)
      values (${firstId}, ${owner.userId}, 'first.csv', 'text/csv', ${Buffer.byteLength(content)},
              ${sha256}, ${fileKey(firstId)}, ${key})`;
  });
  // The user deletes the first file just as the replay's insert is refused on its key.
  const relay = await holdAnswer(new URL(t.db.url), "files_owner_idempotency_key", async () => {
    assert.equal(await fileDelete(t.db.sql, t.storage, owner, firstId, () => {}), true);
  });
  const replaying = createDatabase(relay.url, { max: 1 });
  try {
    const again = fileCreate(replaying.sql, t.storage, owner, Readable.from([Buffer.from(content)]), meta);
    await insertWaitsOnLock();
    release();
    await first;
    const result = await again;
    assert.equal(relay.held(), 1, "the replay's insert was refused on the key once");
    assert.equal(result.kind, "created");
    const file = result.kind === "created" ? result.file : undefined;
    assert.ok(file && file.fileId !== firstId);
    assert.equal(file.name, "relevé ✓.csv");
    assert.deepEqual(await rowsOfKey(key), [file.fileId], "the key names the new file");
    // Its bytes are stored under its key: the row names an object that is there.
    assert.equal((await t.storage.stat(fileKey(file.fileId))).size, Buffer.byteLength(content));
    await assert.rejects(t.storage.stat(fileKey(firstId)));
  } finally {
    release();
    await replaying.sql.end({ timeout: 0 }).catch(() => {});
    relay.close();
  }
});
