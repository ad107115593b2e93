// The store sweep on a host whose clock runs ahead (not yet synced after boot, a VM resumed): an object
// is judged old against the store's clock (S3's LastModified, a file's modification time), so the age
// must not come from that host's clock alone — two days ahead, it swept objects seconds old (an upload
// whose row was about to be written) and ended uploads still under way.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import {
  CreateMultipartUploadCommand,
  ListMultipartUploadsCommand,
  UploadPartCommand,
} from "@aws-sdk/client-s3";
import { createLogger } from "../../src/log.ts";
import { StoreSweep } from "../../src/queue/store-sweep.ts";
import { LocalStore } from "../../src/storage/local.ts";
import type { ObjectStore } from "../../src/storage/store.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTestBucket, type TestBucket } from "../helpers/s3.ts";
import { scratchDir } from "../helpers/tmp.ts";

let db: TestDatabase;
let bucket: TestBucket;

before(async () => {
  db = await createTestDatabase();
  bucket = await createTestBucket();
});
after(async () => {
  await db.drop();
  await bucket.drop();
});

const TWO_DAYS = 2 * 24 * 3600_000;

/** A sweep on a host whose wall clock is `offsetMs` off; objects younger than `minAgeMs` are kept. */
const sweepOf = (store: ObjectStore, offsetMs: number, minAgeMs?: number) =>
  new StoreSweep({
    sql: db.sql,
    logger: createLogger({ level: "silent" }),
    store,
    intervalMs: 60_000,
    clock: () => Date.now() + offsetMs,
    ...(minAgeMs === undefined ? {} : { minAgeMs }),
  });

for (const [kind, makeStore] of [
  ["local", () => new LocalStore(scratchDir("assay-clock-sweep-"))],
  ["s3", () => bucket.store("clock/")],
] as const) {
  test(`${kind}: a host whose clock is two days ahead sweeps no young object and ends no young upload`, async () => {
    const store = makeStore();
    // An upload whose row is not written yet, and an upload still under way.
    const orphan = "files/999999999998";
    await store.put(orphan, Readable.from([Buffer.from("just stored")]));
    let uploads: () => Promise<number>;
    if (store instanceof LocalStore) {
      const partial = path.join(store.root, ".partial");
      fs.mkdirSync(partial, { recursive: true });
      fs.writeFileSync(path.join(partial, `${Date.now()}-uploading`), "half a file");
      uploads = async () => fs.readdirSync(partial).length;
    } else {
      const Key = `clock/files/999999999997`;
      const { UploadId } = await store.client.send(
        new CreateMultipartUploadCommand({ Bucket: bucket.name, Key }),
      );
      await store.client.send(
        new UploadPartCommand({ Bucket: bucket.name, Key, UploadId, PartNumber: 1, Body: "half" }),
      );
      uploads = async () =>
        (await store.client.send(new ListMultipartUploadsCommand({ Bucket: bucket.name, Prefix: "clock/" })))
          .Uploads?.length ?? 0;
    }
    const keys = async () => (await store.list("files/")).map((o) => o.key);

    // A day's margin (the default), a clock two days ahead: both are seconds old by the store's clock.
    assert.equal(await sweepOf(store, TWO_DAYS).runOnce(), 0, "nothing removed");
    assert.deepEqual(await keys(), [orphan], "the young orphan is kept");
    assert.equal(await uploads(), 1, "the upload under way goes on");

    // Old by every clock (any age counts), the same host sweeps them.
    assert.equal(await sweepOf(store, TWO_DAYS, -1000).runOnce(), 2);
    assert.deepEqual(await keys(), []);
    assert.equal(await uploads(), 0);
  });
}
