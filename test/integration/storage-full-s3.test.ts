// A bucket whose server has no room (MinIO's XMinioStorageFull, HTTP 507) or whose quota is reached
// (Ceph RGW's 403 QuotaExceeded, MinIO's 400 XMinioAdminBucketQuotaExceeded, Huawei OBS's 403
// InsufficientStorageSpace) when an upload is stored: 507 STORAGE_FULL, as for a full local disk, not a
// bug's 500. s3rver never answers so, so the bucket here is a tiny HTTP server that answers every
// request with the error set in `answer`.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import type net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { S3Store } from "../../src/storage/s3.ts";
import { isNoSpace } from "../../src/storage/store.ts";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";

let server: http.Server;
let endpoint: string;
/** What the server answers next: MinIO's "storage full", or another error. */
let answer: { status: number; code: string } = { status: 507, code: "XMinioStorageFull" };
const requests: string[] = [];
let t: TestApp;
let alice: string;

before(async () => {
  server = http.createServer((req, res) => {
    requests.push(`${req.method} ${req.url}`);
    // The body is read whole before the answer, as a server that checks its room at the end does.
    req.resume();
    req.on("end", () => {
      const xml =
        `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${answer.code}</Code>` +
        "<Message>Storage backend has reached its minimum free drive threshold. Please delete a few objects to proceed.</Message>" +
        `<Resource>${req.url}</Resource><RequestId>17A0000000000000</RequestId><HostId>dd9025bab4ad464b049177c95eb6ebf374d3b3fd1af9251148b658df7ac2e3e8</HostId></Error>`;
      res.writeHead(answer.status, {
        "content-type": "application/xml",
        "content-length": Buffer.byteLength(xml),
      });
      res.end(xml);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  endpoint = `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
  t = await startTestApp({
    ASSAY_STORAGE: "s3",
    ASSAY_S3_BUCKET: "full-bucket",
    ASSAY_S3_ENDPOINT: endpoint,
    ASSAY_S3_FORCE_PATH_STYLE: "true",
  });
  alice = await t.token("alice");
});
after(async () => {
  await t.close();
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

function upload(content: Buffer) {
  const { payload, headers } = multipart("file", content, "big.csv");
  return t.app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { ...headers, ...bearer(alice) },
  });
}

test("an upload the bucket has no room for → 507 STORAGE_FULL, no file recorded", async () => {
  answer = { status: 507, code: "XMinioStorageFull" };
  // One PutObject, and a multipart upload (over lib-storage's 5 MiB part).
  for (const size of [1024, 6 * 1024 * 1024]) {
    requests.length = 0;
    const logsBefore = t.logs.length;
    const res = await upload(Buffer.alloc(size, "1,2\n"));
    assert.equal(res.statusCode, 507, res.body);
    assert.deepEqual(res.json(), {
      code: "STORAGE_FULL",
      message: "The server has no room to store this file.",
    });
    assert.ok(requests.length > 0, "the bucket was asked");
    assert.ok(
      t.logs
        .slice(logsBefore)
        .some((l) => (l.level as number) >= 50 && /XMinioStorageFull/.test(JSON.stringify(l))),
      "the bucket's answer is logged at error level",
    );
  }
  const [row] = await t.db.sql<{ n: number }[]>`select count(*)::int as n from files`;
  assert.equal(row?.n, 0);
});

/** Every refusal for want of room, as its server sends it (see NO_ROOM_CODES in storage/s3.ts). */
const NO_ROOM = [
  { status: 507, code: "XMinioStorageFull" },
  { status: 403, code: "QuotaExceeded" },
  { status: 400, code: "XMinioAdminBucketQuotaExceeded" },
  { status: 403, code: "InsufficientStorageSpace" },
];

test("an upload over the bucket's quota (Ceph's 403 QuotaExceeded, MinIO's bucket quota) → 507 STORAGE_FULL", async () => {
  for (const refusal of NO_ROOM.slice(1)) {
    answer = refusal;
    // One PutObject, and a multipart upload (over lib-storage's 5 MiB part).
    for (const size of [1024, 6 * 1024 * 1024]) {
      const logsBefore = t.logs.length;
      const res = await upload(Buffer.alloc(size, "1,2\n"));
      assert.equal(res.statusCode, 507, `${refusal.code} ${size}: ${res.body}`);
      assert.equal(res.json().code, "STORAGE_FULL");
      assert.ok(
        t.logs
          .slice(logsBefore)
          .some((l) => (l.level as number) >= 50 && JSON.stringify(l).includes(refusal.code)),
        `${refusal.code}: the bucket's answer is logged at error level`,
      );
    }
  }
  const [row] = await t.db.sql<{ n: number }[]>`select count(*)::int as n from files`;
  assert.equal(row?.n, 0);
});

test("another refusal of the bucket's is no lack of room: a store that cannot be used (503, as /readyz says)", async () => {
  // The credentials refused, for the put and for the store's check alike: not 507 STORAGE_FULL.
  answer = { status: 403, code: "AccessDenied" };
  const res = await upload(Buffer.from("1,2\n"));
  assert.equal(res.statusCode, 503, res.body);
  assert.equal(res.json().code, "NOT_READY");
});

test("a worker's output put into a full bucket, or one over its quota, fails as a full disk (ANALYSIS_STORAGE_FULL)", async () => {
  const store = new S3Store({ bucket: "full-bucket", endpoint, forcePathStyle: true });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-full-"));
  try {
    const file = path.join(dir, "out.json");
    fs.writeFileSync(file, "{}");
    for (const refusal of NO_ROOM) {
      answer = refusal;
      const err = await store.putFile("outputs/1/1.1.x/out.json", file).then(
        () => assert.fail("the put succeeded"),
        (e: unknown) => e,
      );
      assert.ok(isNoSpace(err), `${refusal.code}: ${String(err)}`);
      assert.ok(String((err as Error).cause).includes(refusal.code), String((err as Error).cause));
    }
    // Any other refusal is the store's own error, not a full disk (a misconfigured key is no lack of room).
    answer = { status: 403, code: "AccessDenied" };
    const denied = await store.putFile("outputs/1/1.1.x/out.json", file).then(
      () => assert.fail("the put succeeded"),
      (e: unknown) => e,
    );
    assert.ok(!isNoSpace(denied), String(denied));
  } finally {
    store.client.destroy();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
