// POST /api/files with an Idempotency-Key: a retried upload (its first answer lost) answers the first
// try's file instead of making a second row; the bytes a repeat stored are deleted; the same key with
// other bytes is a 409 that leaves nothing; keys are per user; bad keys get the task create's error.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import { createDatabase } from "../../src/db/client.ts";
import { fileCreate, fileDelete } from "../../src/files/files.ts";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";
import { tcpRelay } from "../helpers/client.ts";
import { idsCrossPowerOfTen, seedUser, waitFor } from "../helpers/queue.ts";

let t: TestApp;
let alice: string;
let bob: string;

before(async () => {
  t = await startTestApp();
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

test("the same key twice with the same bytes: one row, one object, the first file answered 200", async () => {
  const key = "c2f1e7d0-9b1a-4c3e-8f00-~!{}";
  const content = "a,b\n1,2\n";
  const first = await upload(alice, content, key);
  assert.equal(first.statusCode, 201, first.body);
  assert.equal(first.json().message, "File uploaded");
  const before = objects();
  // The retry names the file differently (a renamed local file): the first file still answers.
  const again = await upload(alice, content, key, "other name.csv");
  assert.equal(again.statusCode, 200, again.body);
  assert.equal(again.json().message, "File already uploaded");
  assert.deepEqual(again.json().data, first.json().data);
  assert.deepEqual(await rowsOfKey(key), [first.json().data.fileId]);
  assert.deepEqual(objects(), before, "the repeat's object is deleted");
  assert.equal(first.json().data.sha256, createHash("sha256").update(content).digest("hex"));
});

test("the same key with other bytes: 409 IDEMPOTENCY_KEY_REUSED, no row and no object left", async () => {
  const key = "k-conflict";
  const first = await upload(alice, "x\n1\n", key);
  assert.equal(first.statusCode, 201);
  const [rows, objs] = [await rowIds(), objects()];
  for (const other of ["x\n2\n", "x\n1\n1"]) {
    const res = await upload(alice, other, key);
    assert.equal(res.statusCode, 409, res.body);
    assert.equal(res.json().code, "IDEMPOTENCY_KEY_REUSED");
  }
  assert.deepEqual(await rowIds(), rows);
  assert.deepEqual(objects(), objs);
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
  let release!: () => void;
  const released = new Promise<void>((r) => {
    release = r;
  });
  // The first try, inserted and not committed yet: the upload's insert waits on the unique index.
  const first = t.db.sql.begin(async (tx) => {
    const [row] = await tx<{ id: string }[]>`
      insert into files (owner_id, name, content_type, size_bytes, sha256, storage_key, idempotency_key)
      values (${owner?.id as string}, 'first.csv', 'text/csv', ${content.length}, ${sha256},
              'files/in-flight', ${key})
      returning id::text`;
    await released;
    return row?.id as string;
  });
  const retry = upload(alice, content, key);
  await waitFor(
    async () =>
      (
        await t.db.sql`select 1 from pg_stat_activity
                      where wait_event_type = 'Lock' and query like '%insert into files%'`
      ).length > 0 || undefined,
    10_000,
  );
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

test("a replay whose first file is deleted between its conflict and its look-up is stored: a new file, not a 500", async () => {
  const owner = await seedUser(t.db.sql, "zoë ‮replay");
  const key = "replay-after-delete-«1»".replace(/[^\x21-\x7e]/g, "_");
  const content = "naïve,ü\n1,2\n";
  const meta = { name: "relevé ✓.csv", contentType: "text/csv", maxBytes: 1024, idempotencyKey: key };
  const first = await fileCreate(t.db.sql, t.storage, owner, Readable.from([Buffer.from(content)]), meta);
  assert.equal(first.kind, "created");
  const firstId = first.kind === "created" ? first.file.fileId : "";
  // The user deletes the first file just as the replay's insert is refused on its key.
  const relay = await holdAnswer(new URL(t.db.url), "files_owner_idempotency_key", async () => {
    assert.equal(await fileDelete(t.db.sql, t.storage, owner, firstId, () => {}), true);
  });
  const replaying = createDatabase(relay.url, { max: 1 });
  try {
    const again = await fileCreate(
      replaying.sql,
      t.storage,
      owner,
      Readable.from([Buffer.from(content)]),
      meta,
    );
    assert.equal(relay.held(), 1, "the replay's insert was refused on the key once");
    assert.equal(again.kind, "created");
    const file = again.kind === "created" ? again.file : undefined;
    assert.ok(file && file.fileId !== firstId);
    assert.equal(file.name, "relevé ✓.csv");
    assert.deepEqual(await rowsOfKey(key), [file.fileId], "the key names the new file");
    // Its bytes are stored under its key: the row names an object that is there.
    assert.equal((await t.storage.stat(`files/${file.fileId}`)).size, Buffer.byteLength(content));
    await assert.rejects(t.storage.stat(`files/${firstId}`));
  } finally {
    await replaying.sql.end({ timeout: 0 }).catch(() => {});
    relay.close();
  }
});
