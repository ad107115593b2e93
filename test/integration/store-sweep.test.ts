// The store sweep: objects no row references, older than a day, go — in a local and an S3 store alike;
// everything a row references, and anything young, stays.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import {
  AbortMultipartUploadCommand,
  CreateMultipartUploadCommand,
  ListMultipartUploadsCommand,
  UploadPartCommand,
} from "@aws-sdk/client-s3";
import type { Principal } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { runClaim, runComplete } from "../../src/queue/sql.ts";
import { randomStartKey, StoreSweep } from "../../src/queue/store-sweep.ts";
import { LocalStore } from "../../src/storage/local.ts";
import { IncompleteUploadsError, type ObjectStore } from "../../src/storage/store.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedFiles, seedUser } from "../helpers/queue.ts";
import { createTestBucket, type TestBucket } from "../helpers/s3.ts";
import { scratchDir } from "../helpers/tmp.ts";

let db: TestDatabase;
let owner: Principal;
let bucket: TestBucket;
const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-sweep-"));
/** A sweep of `store` for objects older than `minAgeMs`, listing `pageSize` keys a page. */
const sweepOf = (store: ObjectStore, minAgeMs: number, pageSize?: number) =>
  new StoreSweep({
    sql: db.sql,
    logger: createLogger({ level: "silent" }),
    store,
    intervalMs: 60_000,
    minAgeMs,
    ...(pageSize === undefined ? {} : { pageSize }),
  });

before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "sweep");
  bucket = await createTestBucket();
});
after(async () => {
  await db.drop();
  await bucket.drop();
  fs.rmSync(root, { recursive: true, force: true });
});

const put = (store: ObjectStore, key: string) => store.put(key, Readable.from([Buffer.from(key)]));
const keys = async (store: ObjectStore, prefix: string) => (await store.list(prefix)).map((o) => o.key);

for (const [kind, makeStore] of [
  ["local", () => new LocalStore(root)],
  ["s3", () => bucket.store("sweep/")],
] as const) {
  test(`${kind}: the sweep deletes old objects no row references, and nothing else`, async () => {
    const store = makeStore();
    // Referenced: an uploaded file, a recorded output, the output of an attempt still holding its lease,
    // and a run's output from before output keys (the old scheme).
    const [fileId] = await seedFiles(db.sql, owner, 1);
    const taskId = await createTask(db.sql, owner, `sweep-${kind}`, 3);
    const [done, live, legacy] = await runClaim(db.sql, {
      workerId: "w",
      analysisType: `sweep-${kind}`,
      limit: 3,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
    assert.ok(done && live && legacy);
    const doneKey = `${taskId}/${done.id}.1.${done.leaseToken}`;
    await runComplete(db.sql, [
      { id: done.id, token: done.leaseToken, status: "succeeded", outputKey: doneKey },
      { id: legacy.id, token: legacy.leaseToken, status: "succeeded" },
    ]);
    const kept = [
      `files/${fileId}`,
      `outputs/${doneKey}/out.json`,
      `outputs/${taskId}/${live.id}.1.${live.leaseToken}/out.json`,
      `outputs/${taskId}/${legacy.id}/out.json`,
    ];
    // Not referenced: an upload whose row was never written, a fenced-off attempt's outputs, the
    // outputs of a task that no longer exists.
    const orphans = [
      "files/999999999999",
      `outputs/${taskId}/${done.id}.1.00000000-0000-4000-8000-000000000000/out.json`,
      "outputs/999999999/999999999999.1.00000000-0000-4000-8000-000000000001/out.json",
    ];
    const foreign = "files/readme.txt"; // not a key of ours: never judged
    for (const key of [...kept, ...orphans, foreign]) await put(store, key);

    const sweep = (minAgeMs: number, pageSize = 1000) => sweepOf(store, minAgeMs, pageSize);
    // Young objects are never swept, referenced or not.
    assert.equal(await sweep(3_600_000).runOnce(), 0);
    // Once they are old enough (here: any age), the orphans go, a page at a time.
    const paged = sweep(0, 2);
    let deleted = 0;
    for (let pass = 0; pass < 4; pass++) deleted += await paged.runOnce();
    assert.equal(deleted, orphans.length);
    assert.deepEqual(
      [...(await keys(store, "files/")), ...(await keys(store, "outputs/"))].sort(),
      [...kept, foreign].sort(),
    );
  });

  test(`${kind}: the sweep ends uploads that never completed (a process killed mid-upload), once old`, async () => {
    const store = makeStore();
    const key = "files/1234567";
    if (store instanceof LocalStore) {
      fs.mkdirSync(path.join(root, ".partial"), { recursive: true });
      fs.writeFileSync(path.join(root, ".partial", "1700000000000-abandoned"), "half a file");
    } else {
      const { UploadId } = await store.client.send(
        new CreateMultipartUploadCommand({ Bucket: bucket.name, Key: `sweep/${key}` }),
      );
      await store.client.send(
        new UploadPartCommand({
          Bucket: bucket.name,
          Key: `sweep/${key}`,
          UploadId,
          PartNumber: 1,
          Body: "half",
        }),
      );
    }
    const incomplete = async () =>
      store instanceof LocalStore
        ? fs.readdirSync(path.join(root, ".partial")).length
        : ((
            await store.client.send(
              new ListMultipartUploadsCommand({ Bucket: bucket.name, Prefix: "sweep/" }),
            )
          ).Uploads?.length ?? 0);
    assert.equal(await incomplete(), 1);
    const sweep = (minAgeMs: number) => sweepOf(store, minAgeMs);
    // The local partial file is dated 2023 by its name only: its modification time is now, so it is young.
    await sweep(3_600_000).runOnce();
    assert.equal(await incomplete(), 1, "a young upload may still be running: kept");
    // With every age counting as old, it goes (objects young or old are not at stake here).
    assert.ok((await sweep(-1000).runOnce()) >= 1);
    assert.equal(await incomplete(), 0);
    await assert.rejects(store.open(key), /no object/);
  });
}

/** Starts a multipart upload of `key` (a full key: the bucket's own) that nobody completes. */
async function startUpload(key: string): Promise<string> {
  const client = bucket.store().client;
  const { UploadId } = await client.send(new CreateMultipartUploadCommand({ Bucket: bucket.name, Key: key }));
  await client.send(
    new UploadPartCommand({ Bucket: bucket.name, Key: key, UploadId, PartNumber: 1, Body: "half" }),
  );
  return UploadId as string;
}

/** The keys of the bucket's incomplete uploads under `prefix`. */
async function uploadKeys(prefix: string): Promise<string[]> {
  const res = await bucket
    .store()
    .client.send(new ListMultipartUploadsCommand({ Bucket: bucket.name, Prefix: prefix }));
  return (res.Uploads ?? []).map((u) => u.Key as string);
}

test("s3: two workers ending the same old upload at once both succeed (NoSuchUpload is not a failure)", async () => {
  await startUpload("race/files/1234568");
  const first = bucket.store("race/");
  const second = bucket.store("race/");
  // The second worker lists the upload, then the first aborts it before the second's abort arrives.
  let raced = false;
  second.client.middlewareStack.add(
    (next, context) => async (args) => {
      if (context.commandName === "AbortMultipartUploadCommand" && !raced) {
        raced = true;
        assert.ok((await sweepOf(first, -1000).runOnce()) >= 1);
      }
      return next(args);
    },
    { step: "initialize", name: "raceFirstWorker" },
  );
  await sweepOf(second, -1000).runOnce();
  assert.ok(raced, "the second worker tried to abort the upload too");
  assert.deepEqual(await uploadKeys("race/"), []);
});

test("s3: the sweep ends only uploads under Assay's own keys; another tool's old upload survives", async () => {
  // An empty ASSAY_S3_PREFIX: Assay shares the bucket's root with whatever else writes there.
  const otherId = await startUpload("other/backup.tar");
  const lookalike = await startUpload("filesystem-dump");
  await startUpload("files/1234569");
  await startUpload("outputs/1/2.1.00000000-0000-4000-8000-000000000000/out.json");
  await sweepOf(bucket.store(), -1000).runOnce();
  assert.deepEqual((await uploadKeys("")).sort(), ["filesystem-dump", "other/backup.tar"]);
  const { client } = bucket.store();
  for (const [Key, UploadId] of [
    ["other/backup.tar", otherId],
    ["filesystem-dump", lookalike],
  ])
    await client.send(new AbortMultipartUploadCommand({ Bucket: bucket.name, Key, UploadId }));
});

test("s3: an upload begun before the cutoff whose parts are still coming in is kept; idle, it ends", async () => {
  // A 50 GB upload over a slow link outlives the sweep's day: S3 lists only when an upload began, so
  // the sweep asks for its parts and keeps one that wrote a part since the cutoff (it aborted it, and
  // the upload's client got a 500 when its body ended).
  const key = "slow/files/1234570";
  const uploadId = await startUpload(key);
  const store = bucket.store("slow/");
  const cutoff = new Date(Date.now() + 20);
  while (Date.now() <= cutoff.getTime() + 1) await new Promise((resolve) => setTimeout(resolve, 5));
  await store.client.send(
    new UploadPartCommand({ Bucket: bucket.name, Key: key, UploadId: uploadId, PartNumber: 2, Body: "more" }),
  );
  assert.equal(await store.abortIncompleteUploads(cutoff), 0, "a part came in after the cutoff: kept");
  assert.deepEqual(await uploadKeys("slow/"), [key]);
  // Idle since a later cutoff: ended.
  assert.equal(await store.abortIncompleteUploads(new Date(Date.now() + 1000)), 1);
  assert.deepEqual(await uploadKeys("slow/"), []);
});

test("s3: a server that cannot list parts has its old uploads ended by their start, as before", async () => {
  const key = "noparts/files/1234571";
  await startUpload(key);
  const store = bucket.store("noparts/");
  let asked = 0;
  store.client.middlewareStack.add(
    (next, context) => async (args) => {
      if (context.commandName === "ListPartsCommand") {
        asked++;
        throw Object.assign(
          new Error("A parameter you provided implies functionality that is not implemented"),
          {
            name: "NotImplemented",
            $metadata: { httpStatusCode: 501 },
          },
        );
      }
      return next(args);
    },
    { step: "initialize", name: "noListParts" },
  );
  assert.equal(await store.abortIncompleteUploads(new Date(Date.now() + 1000)), 1);
  assert.equal(asked, 1);
  assert.deepEqual(await uploadKeys("noparts/"), []);
});

test("s3: credentials that may not list parts judge by the start; one upload's failing listing leaves the others' ends", async () => {
  const denied = bucket.store("denied/");
  await startUpload("denied/files/1234572");
  denied.client.middlewareStack.add(
    (next, context) => async (args) => {
      if (context.commandName === "ListPartsCommand")
        throw Object.assign(new Error("Access Denied"), {
          name: "AccessDenied",
          $metadata: { httpStatusCode: 403 },
        });
      return next(args);
    },
    { step: "initialize", name: "deniedListParts" },
  );
  // Without s3:ListMultipartUploadParts (operations.md's list lacked it), as before: by the start.
  assert.equal(await denied.abortIncompleteUploads(new Date(Date.now() + 1000)), 1);
  assert.deepEqual(await uploadKeys("denied/"), []);

  const flaky = bucket.store("flaky/");
  await startUpload("flaky/files/1234573");
  await startUpload("flaky/files/1234574");
  let failedOnce = false;
  flaky.client.middlewareStack.add(
    (next, context) => async (args) => {
      if (context.commandName === "ListPartsCommand" && !failedOnce) {
        failedOnce = true;
        throw Object.assign(new Error("We encountered an internal error. Please try again."), {
          name: "InternalError",
          $metadata: { httpStatusCode: 500 },
        });
      }
      return next(args);
    },
    { step: "initialize", name: "flakyListParts" },
  );
  // The first upload's parts cannot be listed: it stays for the next pass, the second is ended, and
  // the pass says both (it stopped at the first, ending nothing).
  await assert.rejects(
    flaky.abortIncompleteUploads(new Date(Date.now() + 1000)),
    (err) =>
      err instanceof IncompleteUploadsError && err.aborted === 1 && /1 incomplete upload/.test(err.message),
  );
  assert.deepEqual(await uploadKeys("flaky/"), ["flaky/files/1234573"]);
  assert.equal(await flaky.abortIncompleteUploads(new Date(Date.now() + 1000)), 1);
  assert.deepEqual(await uploadKeys("flaky/"), []);
});

test("a random start: restarted sweeps reach an orphan past the first pages, not only the first keys", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-sweep-restart-"));
  const store = new LocalStore(dir);
  // 6 referenced uploads, then an orphan whose key sorts after them: three pages of 3 keys.
  const ids = await seedFiles(db.sql, owner, 6);
  for (const id of ids) await put(store, `files/${id}`);
  const orphan = "files/9999999";
  await put(store, orphan);
  const restart = (random: () => number) =>
    new StoreSweep({
      sql: db.sql,
      logger: createLogger({ level: "silent" }),
      store,
      intervalMs: 60_000,
      minAgeMs: 0,
      pageSize: 3,
      random,
    });
  // A process that lives for two passes, restarted ten times: each starts at a point of its own. (With
  // the walk starting at the first key in every process, the orphan was never looked at.)
  for (let life = 0; life < 10 && (await keys(store, "files/")).includes(orphan); life++) {
    const sweep = restart(() => life / 10);
    await sweep.runOnce();
    await sweep.runOnce();
  }
  assert.deepEqual(await keys(store, "files/"), ids.map((id) => `files/${id}`).sort());
  fs.rmSync(dir, { recursive: true, force: true });
});

test("each process's sweep starts after a random key of files/ and of outputs/, and wraps around", async () => {
  assert.equal(
    randomStartKey("files/", () => 0),
    "files/100000",
  );
  assert.equal(
    randomStartKey("outputs/", () => 0.5),
    "outputs/550000",
  );
  assert.equal(
    randomStartKey("files/", () => 0.9999999999),
    "files/999999",
  );
  // What the first pass of each new process asks the store for (the default source of randomness).
  const asked: { prefix: string; after: string | undefined }[] = [];
  const base = new LocalStore(scratchDir("assay-sweep-start-"));
  const store: ObjectStore = Object.create(base);
  store.list = (prefix, o = {}) => {
    asked.push({ prefix, after: o.after });
    return base.list(prefix, o);
  };
  for (let i = 0; i < 5; i++) await sweepOf(store, 0).runOnce();
  for (const prefix of ["files/", "outputs/"]) {
    const starts = asked.filter((a) => a.prefix === prefix).map((a) => a.after);
    assert.equal(starts.length, 5);
    for (const after of starts) assert.match(after ?? "", new RegExp(`^${prefix}[1-9][0-9]{5}$`));
    assert.ok(new Set(starts).size > 1, `every process started at ${starts[0]}`);
  }
  // Past the last key, the next pass starts from the first.
  asked.length = 0;
  const sweep = sweepOf(store, 0);
  await sweep.runOnce();
  await sweep.runOnce();
  assert.deepEqual(
    asked.slice(2).map((a) => a.after),
    [undefined, undefined],
  );
});
