// POST /api/files when the local store's disk fills up mid-upload: 507 STORAGE_FULL (the server has
// no room — neither a bug nor the request's fault), the cause logged as an error, nothing left (no
// partial file, no object, no row), and the same upload — its Idempotency-Key too — succeeds once
// there is room. The disk is a real one: a tmpfs mounted over the data directory (root only, as in CI).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";
import { idsCrossPowerOfTen } from "../helpers/queue.ts";
import { mountTmpfs, type Tmpfs, tmpfsSkip } from "../helpers/tmpfs.ts";

let t: TestApp;
let alice: string;
let disk: Tmpfs | undefined;

before(async () => {
  t = await startTestApp({ ASSAY_MAX_UPLOAD_BYTES: String(16 * 1024 * 1024) });
  alice = await t.token("zoë «alice» 🚀");
  // Ids past a digit boundary.
  await idsCrossPowerOfTen(t.db.sql, "files", 1);
});
after(async () => {
  disk?.unmount();
  await t.close();
});

function upload(content: Buffer, key?: string) {
  const { payload, headers } = multipart("file", content, "relevé «T1» ✓.csv");
  return t.app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { ...headers, ...bearer(alice), ...(key === undefined ? {} : { "Idempotency-Key": key }) },
  });
}

const rows = async () =>
  (await t.db.sql<{ id: string }[]>`select id::text from files order by id`).map((r) => r.id);
const left = (dir: string) => {
  const full = path.join(t.config.dataDir, dir);
  return fs.existsSync(full) ? fs.readdirSync(full) : [];
};

test("a disk that fills up mid-upload → 507 STORAGE_FULL, nothing left; the retry succeeds once there is room", {
  skip: tmpfsSkip,
}, async () => {
  disk = mountTmpfs(t.config.dataDir, "1m");
  const body = Buffer.alloc(3 * 1024 * 1024, "4,2\n");
  const key = "upload-7f3a9c-1";
  const before = t.logs.length;

  const full = await upload(body, key);
  assert.equal(full.statusCode, 507, full.body);
  assert.deepEqual(full.json(), {
    code: "STORAGE_FULL",
    message: "The server has no room to store this file.",
  });
  const logged = t.logs.slice(before);
  assert.ok(
    logged.some((l) => (l.level as number) >= 50 && /ENOSPC/.test(JSON.stringify(l))),
    "the disk's error is logged at error level",
  );
  assert.deepEqual(await rows(), []);
  assert.deepEqual(left(".partial"), [], "the partial file is removed");
  assert.deepEqual(left("files"), []);

  // The room it took is free again: an upload that fits is stored.
  const small = await upload(Buffer.from("a,b\n1,2\n"));
  assert.equal(small.statusCode, 201, small.body);

  // Room is made: the client's retry of the same upload, with the same key, makes the file once.
  disk.resize("8m");
  const retry = await upload(body, key);
  assert.equal(retry.statusCode, 201, retry.body);
  const file = retry.json().data;
  assert.equal(file.sizeBytes, body.length);
  assert.equal(file.sha256, createHash("sha256").update(body).digest("hex"));
  const again = await upload(body, key);
  assert.equal(again.statusCode, 200, again.body);
  assert.equal(again.json().data.fileId, file.fileId);
  assert.deepEqual(await rows(), [small.json().data.fileId, file.fileId]);
  assert.deepEqual(left(".partial"), []);
});
