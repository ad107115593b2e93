// The store sweep where the store fails it, in a local and an S3 store alike:
// - under one prefix (the store's listing of files/, as a bucket answering 503 or a folder the worker
//   cannot read fails it, at the same page every pass: the walk's cursor stays where it was): the other
//   prefix is still swept and incomplete uploads still ended, pass after pass, and the pass then ends
//   with the failure;
// - on an object of an orphan output folder whose name the store refuses as a key (a copy made by hand,
//   `out (1).json`): it is left alone, and the page's orphans still go — and the same where a worker
//   removes a lost attempt's leftovers once its run is recorded (removeLeftovers).
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import {
  CreateMultipartUploadCommand,
  ListMultipartUploadsCommand,
  PutObjectCommand,
  UploadPartCommand,
} from "@aws-sdk/client-s3";
import { createLogger } from "../../src/log.ts";
import type { ClaimedRun } from "../../src/queue/sql.ts";
import { StoreSweep } from "../../src/queue/store-sweep.ts";
import { removeLeftovers } from "../../src/runner/handler.ts";
import { LocalStore } from "../../src/storage/local.ts";
import { S3Store } from "../../src/storage/s3.ts";
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

/** `base`, except that listing `files/` fails, every time. */
function failingFiles(base: ObjectStore): ObjectStore {
  const store: ObjectStore = Object.create(base);
  store.list = async (prefix, o) => {
    if (prefix === "files/") throw new Error("the store could not list files/");
    return base.list(prefix, o);
  };
  return store;
}

for (const [kind, makeStore] of [
  ["local", () => new LocalStore(scratchDir("assay-sweep-failures-"))],
  ["s3", () => bucket.store("sweep-failures/")],
] as const) {
  test(`${kind}: a prefix the store fails to list does not keep the other from being swept, nor uploads from being ended`, async () => {
    const base = makeStore();
    // Orphans of a task whose deletion was interrupted (no row names them), past digit boundaries.
    const orphans = [
      "outputs/1000000000/9999999999.1.00000000-0000-4000-8000-000000000001/out.json",
      "outputs/999999999/10000000000.2.00000000-0000-4000-8000-000000000002/Result_2024-final.csv",
    ];
    for (const key of orphans) await base.put(key, Readable.from([Buffer.from(key)]));
    // An upload a killed process left.
    let incomplete: () => Promise<number>;
    if (base instanceof LocalStore) {
      const partial = path.join(base.root, ".partial");
      fs.mkdirSync(partial, { recursive: true });
      fs.writeFileSync(path.join(partial, "1700000000000-abandoned"), "half a file");
      incomplete = async () => fs.readdirSync(partial).length;
    } else {
      assert.ok(base instanceof S3Store);
      const Key = "sweep-failures/files/12345678";
      const { UploadId } = await base.client.send(
        new CreateMultipartUploadCommand({ Bucket: bucket.name, Key }),
      );
      await base.client.send(
        new UploadPartCommand({ Bucket: bucket.name, Key, UploadId, PartNumber: 1, Body: "half" }),
      );
      incomplete = async () =>
        (
          await base.client.send(
            new ListMultipartUploadsCommand({ Bucket: bucket.name, Prefix: "sweep-failures/" }),
          )
        ).Uploads?.length ?? 0;
    }
    assert.equal(await incomplete(), 1);

    const sweep = new StoreSweep({
      sql: db.sql,
      logger: createLogger({ level: "silent" }),
      store: failingFiles(base),
      intervalMs: 60_000,
      minAgeMs: -1000, // every object counts as old
      random: () => 0, // each walk starts before the ids used here (randomStartKey)
    });
    // The pass still ends with the failure (logged by the service), after doing the rest.
    await assert.rejects(sweep.runOnce(), /could not list files\//);
    assert.deepEqual(
      (await base.list("outputs/")).map((o) => o.key),
      [],
      "the orphans under outputs/ are swept although files/ cannot be listed",
    );
    assert.equal(await incomplete(), 0, "the abandoned upload is ended although files/ cannot be listed");
    // And again on the next pass: the failure does not stop the sweep for good.
    const late = "outputs/1000000001/10000000001.1.00000000-0000-4000-8000-000000000003/out.json";
    await base.put(late, Readable.from([Buffer.from("late")]));
    await assert.rejects(sweep.runOnce(), /could not list files\//);
    assert.deepEqual(
      (await base.list("outputs/")).map((o) => o.key),
      [],
    );
  });

  test(`${kind}: an object the store refuses as a key, in an orphan output folder, is left alone and the page's orphans go`, async () => {
    const base = makeStore();
    const folder = "outputs/1000000000/9999999999.1.00000000-0000-4000-8000-000000000004";
    const orphans = [`${folder}/a.json`, `${folder}/z.json`, "outputs/999999999/10000000000/out.csv"];
    for (const key of orphans) await base.put(key, Readable.from([Buffer.from(key)]));
    // A name Assay never makes (not a key the store takes), put beside them by hand.
    const foreign = `${folder}/out (1).json`;
    if (base instanceof LocalStore) fs.writeFileSync(path.join(base.root, foreign), "a copy");
    else {
      assert.ok(base instanceof S3Store);
      await base.client.send(
        new PutObjectCommand({ Bucket: bucket.name, Key: `sweep-failures/${foreign}`, Body: "a copy" }),
      );
    }
    const sweep = new StoreSweep({
      sql: db.sql,
      logger: createLogger({ level: "silent" }),
      store: base,
      intervalMs: 60_000,
      minAgeMs: -1000,
      random: () => 0,
    });
    assert.equal(await sweep.runOnce(), orphans.length);
    assert.deepEqual(
      (await base.list("outputs/")).map((o) => o.key),
      [foreign],
    );
  });

  test(`${kind}: a lost attempt's leftovers go once its run is recorded, and an object the store refuses as a key stays`, async () => {
    const base = makeStore();
    const lost = "outputs/1000000002/10000000002.1.00000000-0000-4000-8000-000000000005";
    const winner = "1000000002/10000000002.2.00000000-0000-4000-8000-000000000006";
    for (const key of [`${lost}/out.json`, `outputs/${winner}/out.json`])
      await base.put(key, Readable.from([Buffer.from(key)]));
    const foreign = `${lost}/out (1).json`;
    if (base instanceof LocalStore) fs.writeFileSync(path.join(base.root, foreign), "a copy");
    else {
      assert.ok(base instanceof S3Store);
      await base.client.send(
        new PutObjectCommand({ Bucket: bucket.name, Key: `sweep-failures/${foreign}`, Body: "a copy" }),
      );
    }
    const run = { id: 10000000002, taskId: 1000000002, afterLostLease: true } as ClaimedRun;
    await removeLeftovers(base)(run, winner);
    assert.deepEqual(
      (await base.list("outputs/1000000002/")).map((o) => o.key),
      [foreign, `outputs/${winner}/out.json`].sort(),
    );
  });
}
