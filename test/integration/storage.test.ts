// One contract, both object stores: a local directory and an S3-compatible server (s3rver, started by
// test/run.ts). Everything the service relies on from a store is asserted here, for each backend alike.
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { buffer } from "node:stream/consumers";
import { after, before, describe, test } from "node:test";
import { PutObjectCommand } from "@aws-sdk/client-s3";
import { LocalStore } from "../../src/storage/local.ts";
import { S3Store } from "../../src/storage/s3.ts";
import {
  type ByteRange,
  ObjectMissingError,
  type ObjectStore,
  PayloadTooLargeError,
  RangeNotSatisfiableError,
  SourceError,
} from "../../src/storage/store.ts";
import { createTestBucket, s3Endpoint, type TestBucket } from "../helpers/s3.ts";

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "assay-store-"));
let bucket: TestBucket;
before(async () => {
  bucket = await createTestBucket();
});
after(async () => {
  await bucket.drop();
  fs.rmSync(scratch, { recursive: true, force: true });
});

const sha256 = (b: Buffer) => createHash("sha256").update(b).digest("hex");
/** Larger than one multipart part (5 MiB): S3 uploads it in parts. */
const BIG = 6 * 1024 * 1024 + 123;

/** A source that sends some bytes, then fails (a client that went away mid-upload). */
function failingSource(bytes: number): Readable {
  let sent = false;
  return new Readable({
    read() {
      if (!sent) {
        sent = true;
        this.push(randomBytes(bytes));
      } else this.destroy(new Error("the client went away"));
    },
  });
}

/**
 * A source that sends `total` bytes 64 KiB a tick, as a client's upload arrives, then ends — or fails
 * after `failAfter` bytes. Paced, the store has parts in flight when the body fails or grows too large.
 */
function pacedSource(total: number, failAfter = Number.POSITIVE_INFINITY): Readable {
  const chunk = 64 * 1024;
  let sent = 0;
  return new Readable({
    read() {
      setImmediate(() => {
        if (sent >= failAfter) this.destroy(new Error("the client went away"));
        else if (sent >= total) this.push(null);
        else {
          const n = Math.min(chunk, total - sent);
          sent += n;
          this.push(randomBytes(n));
        }
      });
    },
  });
}

/** A store, and a way to write an object under any key at all, behind the store's back. */
interface Backend {
  store: ObjectStore;
  raw(key: string, body: string): Promise<void>;
}

const backends: [string, () => Backend][] = [
  [
    "local",
    () => {
      const store = new LocalStore(fs.mkdtempSync(path.join(scratch, "local-")));
      return {
        store,
        raw: async (key, body) => {
          const file = path.join(store.root, key);
          fs.mkdirSync(path.dirname(file), { recursive: true });
          fs.writeFileSync(file, body);
        },
      };
    },
  ],
  [
    "s3",
    () => {
      const prefix = `c${randomBytes(3).toString("hex")}/`;
      const store = bucket.store(prefix);
      return {
        store,
        raw: async (key, body) => {
          await store.client.send(
            new PutObjectCommand({ Bucket: bucket.name, Key: `${prefix}${key}`, Body: body }),
          );
        },
      };
    },
  ],
];

for (const [kind, make] of backends) {
  describe(`${kind} store`, () => {
    let store: ObjectStore;
    let raw: Backend["raw"];
    before(() => {
      ({ store, raw } = make());
    });

    test("put streams, hashes and counts; open gives the bytes and their size; list shows them", async () => {
      const body = randomBytes(BIG);
      const put = await store.put(
        "files/1",
        Readable.from([body.subarray(0, 1000), body.subarray(1000)]),
        BIG,
      );
      assert.deepEqual(put, { sizeBytes: BIG, sha256: sha256(body) });
      const { stream, size } = await store.open("files/1");
      assert.equal(size, BIG);
      assert.ok((await buffer(stream)).equals(body));
      const [info] = await store.list("files/");
      assert.equal(info?.key, "files/1");
      assert.equal(info?.size, BIG);
      assert.ok(info && Date.now() - info.modified.getTime() < 60_000);
    });

    test("over maxBytes → PayloadTooLargeError, and nothing is left under the key", async () => {
      for (const [key, bytes, max] of [
        ["files/too-small", 200, 100],
        ["files/too-big", BIG + 1024 * 1024, BIG],
      ] as const) {
        await assert.rejects(
          store.put(key, Readable.from([randomBytes(bytes)]), max),
          (err) => err instanceof PayloadTooLargeError,
          key,
        );
        await assert.rejects(store.open(key), (err) => err instanceof ObjectMissingError, key);
      }
      assert.deepEqual(
        (await store.list("files/too")).map((o) => o.key),
        [],
      );
      // Nor half an upload: every upload that ended is complete or aborted (a cutoff in the future
      // would end any upload still there).
      assert.equal(await store.abortIncompleteUploads(new Date(Date.now() + 3_600_000)), 0);
    });

    test("a source that fails mid-way leaves nothing, and is blamed on the body (SourceError)", async () => {
      await assert.rejects(
        store.put("files/cut", failingSource(BIG), 10 * BIG),
        (err) => err instanceof SourceError && /went away/.test(String((err as Error).cause)),
      );
      await assert.rejects(store.open("files/cut"), (err) => err instanceof ObjectMissingError);
      assert.equal(await store.abortIncompleteUploads(new Date(Date.now() + 3_600_000)), 0);
    });

    test("a paced body that fails or grows too large with parts in flight is refused, leaving nothing", async () => {
      // The body's failure must not go unhandled while the store waits for the parts it sent: node:test
      // fails the test on an unhandled rejection (the service's process would die of it).
      const MiB = 1024 * 1024;
      await assert.rejects(
        store.put("files/paced-cut", pacedSource(12 * MiB, 8 * MiB), 16 * MiB),
        (err) => err instanceof SourceError && /went away/.test(String((err as Error).cause)),
      );
      await assert.rejects(
        store.put("files/paced-big", pacedSource(12 * MiB), 8 * MiB),
        (err) => err instanceof PayloadTooLargeError,
      );
      assert.deepEqual(
        (await store.list("files/paced")).map((o) => o.key),
        [],
      );
      assert.equal(await store.abortIncompleteUploads(new Date(Date.now() + 3_600_000)), 0);
    });

    test("a missing key is ObjectMissingError for open and download", async () => {
      await assert.rejects(store.open("files/none"), (err) => err instanceof ObjectMissingError);
      await assert.rejects(
        store.download("files/none", path.join(scratch, "none")),
        (err) => err instanceof ObjectMissingError,
      );
    });

    test("putFile and download copy a file in and out, byte for byte", async () => {
      const body = randomBytes(BIG);
      const src = path.join(scratch, `${kind}-in`);
      const dst = path.join(scratch, `${kind}-out`);
      fs.writeFileSync(src, body);
      await store.putFile("outputs/5/50.1.aa/report.html", src);
      await store.download("outputs/5/50.1.aa/report.html", dst);
      assert.ok(fs.readFileSync(dst).equals(body));
    });

    test("list pages in key order; deletePrefix removes exactly what is under the prefix", async () => {
      const keys = [
        "outputs/7/70.1.aa/a.json",
        "outputs/7/70.1.aa/b.csv",
        "outputs/7/71.2.bb/a.json",
        "outputs/70/700.1.cc/a.json",
        "outputs/8/80.1.dd/a.json",
      ];
      for (const key of keys) await store.put(key, Readable.from([Buffer.from(key)]));
      const first = await store.list("outputs/7/", { limit: 2 });
      assert.deepEqual(
        first.map((o) => o.key),
        keys.slice(0, 2),
      );
      const rest = await store.list("outputs/7/", { after: first.at(-1)?.key as string });
      assert.deepEqual(
        rest.map((o) => o.key),
        [keys[2]],
      );
      assert.deepEqual(
        (await store.list("outputs/7/70.")).map((o) => o.key),
        keys.slice(0, 2),
      );
      assert.equal(await store.deletePrefix("outputs/7/"), 3);
      assert.deepEqual(
        (await store.list("outputs/")).map((o) => o.key).filter((k) => !k.startsWith("outputs/5/")),
        [keys[3], keys[4]],
      );
      await assert.rejects(store.deletePrefix("outputs/70"), /must end with/);
    });

    test("list pages through nested keys in byte order, whatever the limit and wherever after falls", async () => {
      // Run folders sort by the text of their ids. (Where S3's byte order and a folder-by-folder order
      // differ — `a-/…` < `a.b` < `a/…` — s3rver gives the latter: that case is checked on the local
      // store alone, in test/unit/storage.test.ts.)
      const keys = [
        "outputs/4/10.1.aa/r.json",
        "outputs/4/100.1.aa/r.json",
        "outputs/4/11.2.bb/a.csv",
        "outputs/4/11.2.bb/r.json",
        "outputs/4/9.1.cc/r.json",
        "outputs/4/a/x",
        "outputs/4/a/z/deep",
        "outputs/4/b.c",
        "outputs/4/b.d/x",
        "outputs/4/c",
      ];
      for (const key of [...keys].reverse()) await store.put(key, Readable.from([Buffer.from(key)]));
      assert.deepEqual(
        (await store.list("outputs/4/")).map((o) => o.key),
        keys,
      );
      for (const limit of [1, 2, 3, 7]) {
        const seen: string[] = [];
        for (let after: string | undefined; ; ) {
          const page = await store.list("outputs/4/", after === undefined ? { limit } : { limit, after });
          assert.ok(page.length <= limit);
          seen.push(...page.map((o) => o.key));
          if (page.length < limit) break;
          after = page.at(-1)?.key;
        }
        assert.deepEqual(seen, keys, `limit ${limit}`);
      }
      // `after` need not be a key: it may fall inside a folder, or before or past them all.
      for (const [after, expected] of [
        ["outputs/4/10", keys],
        ["outputs/4/100.1.aa/r.json", keys.slice(2)],
        ["outputs/4/11.2.bb/b", keys.slice(3)],
        ["outputs/4/11.2.bb/s", keys.slice(4)],
        ["outputs/4/a", keys.slice(5)],
        ["outputs/4/a/y", keys.slice(6)],
        ["outputs/4/a/z/", keys.slice(6)],
        ["outputs/4/b.c", keys.slice(8)],
        ["outputs/4/c", []],
      ] as const) {
        assert.deepEqual(
          (await store.list("outputs/4/", { after, limit: 3 })).map((o) => o.key),
          expected.slice(0, 3),
          after,
        );
      }
      assert.deepEqual(
        (await store.list("outputs/4/11.")).map((o) => o.key),
        keys.slice(2, 4),
      );
      assert.equal(await store.deletePrefix("outputs/4/"), keys.length);
    });

    test("delete removes the keys given; missing keys are fine", async () => {
      await store.put("files/d1", Readable.from([Buffer.from("1")]));
      await store.put("files/d2", Readable.from([Buffer.from("2")]));
      await store.delete(["files/d1", "files/never"]);
      await assert.rejects(store.open("files/d1"), (err) => err instanceof ObjectMissingError);
      const opened = await store.open("files/d2");
      assert.equal(opened.size, 1);
      opened.stream.destroy();
    });

    test("keys that are not the service's own shape are refused", async () => {
      for (const bad of ["../x", "files/../etc", "/etc/passwd", "files//7", "", "files\\7", "files/a b"]) {
        await assert.rejects(store.put(bad, Readable.from([Buffer.from("x")])), /storage key/, bad);
        await assert.rejects(store.open(bad), /storage key/, bad);
      }
    });

    test("every output name the runner accepts is a key the store accepts (capitals included)", async () => {
      const key = "outputs/9/90.1.ab/Report-2026.Final.html";
      await store.put(key, Readable.from([Buffer.from("<p>x</p>")]));
      const opened = await store.open(key);
      assert.equal(opened.size, 8);
      opened.stream.destroy();
      assert.deepEqual(
        (await store.list("outputs/9/")).map((o) => o.key),
        [key],
      );
    });

    test("an open stream destroyed half-way is released", async () => {
      const { stream } = await store.open("files/1");
      await new Promise<void>((resolve) => stream.once("data", () => resolve()));
      stream.destroy();
      await new Promise<void>((resolve) => (stream.closed ? resolve() : stream.once("close", resolve)));
    });

    test("list returns as many objects as asked for, past a server's 1,000 a request; deletePrefix takes them all", async () => {
      const n = 1050;
      const keys = Array.from({ length: n }, (_, i) => `outputs/6/${String(i).padStart(4, "0")}.1.aa/r.json`);
      for (let i = 0; i < n; i += 50) {
        await Promise.all(keys.slice(i, i + 50).map((k) => store.put(k, Readable.from([Buffer.from("x")]))));
      }
      const page = await store.list("outputs/6/", { limit: 1040 });
      assert.deepEqual(
        page.map((o) => o.key),
        keys.slice(0, 1040),
      );
      assert.deepEqual(
        (await store.list("outputs/6/", { after: keys[5] as string, limit: 1200 })).map((o) => o.key),
        keys.slice(6),
      );
      assert.equal((await store.list("outputs/6/", { limit: 0 })).length, 0);
      assert.equal(await store.deletePrefix("outputs/6/"), n);
      assert.deepEqual(await store.list("outputs/6/"), []);
    });

    test("deletePrefix removes objects under the prefix whose keys are not the service's shape", async () => {
      // Put there by hand or by another tool: the prefix is ours, and everything under it goes.
      await store.put("outputs/78/780.1.aa/r.json", Readable.from([Buffer.from("ours")]));
      await raw("outputs/78/780.1.aa/odd name é+%.txt", "theirs");
      await raw("outputs/78/Zz~!", "theirs");
      assert.equal(await store.deletePrefix("outputs/78/"), 3);
      assert.deepEqual(await store.list("outputs/78/"), []);
    });

    test("open with a range reads exactly those bytes and says which; the size is the whole object's", async () => {
      // Past a local read's 64 KiB buffer, and every byte value.
      const body = Buffer.from(Array.from({ length: 70_003 }, (_, i) => (i * 31 + (i >> 9)) & 0xff));
      const key = "outputs/100000001/1000000001.1.0f-1/Report-Final.png";
      await store.put(key, Readable.from([body]));
      const n = body.length;
      const cases: [ByteRange, number, number][] = [
        [{ start: 0, end: 0 }, 0, 0],
        [{ start: 0, end: 99 }, 0, 99],
        [{ start: 65_530, end: 65_545 }, 65_530, 65_545],
        [{ start: 70_000 }, 70_000, n - 1],
        [{ start: 100, end: Number.MAX_SAFE_INTEGER }, 100, n - 1],
        [{ suffix: 5 }, n - 5, n - 1],
        [{ suffix: n + 10 }, 0, n - 1],
        [{ start: n - 1, end: n - 1 }, n - 1, n - 1],
      ];
      for (const [range, start, end] of cases) {
        const opened = await store.open(key, { range });
        assert.equal(opened.size, n, JSON.stringify(range));
        const got = await buffer(opened.stream);
        // s3rver sends the whole object for `bytes=0-0`: the store then says so (no range).
        const { start: s, end: e } = opened.range ?? { start: 0, end: n - 1 };
        if (!opened.range) assert.deepEqual([kind, range], ["s3", { start: 0, end: 0 }]);
        else assert.deepEqual([s, e], [start, end], JSON.stringify(range));
        assert.deepEqual(got, body.subarray(s, e + 1), JSON.stringify(range));
      }
      // Without a range: the whole object, no range said.
      const whole = await store.open(key);
      assert.equal(whole.range, undefined);
      whole.stream.destroy();
    });

    test("a range that selects no byte is RangeNotSatisfiableError with the object's size; a missing object stays missing", async () => {
      await store.put("outputs/100000002/1000000002.1.aa/r.txt", Readable.from([Buffer.from("0123456789")]));
      await store.put("outputs/100000002/1000000002.1.aa/empty.txt", Readable.from([]));
      const unsatisfiable: [string, ByteRange, number][] = [
        ["r.txt", { start: 10 }, 10],
        ["r.txt", { start: 11, end: 20 }, 10],
        ["r.txt", { start: Number.MAX_SAFE_INTEGER }, 10],
        ["r.txt", { suffix: 0 }, 10],
        ["empty.txt", { start: 0 }, 0],
        ["empty.txt", { start: 0, end: 0 }, 0],
        ["empty.txt", { suffix: 3 }, 0],
      ];
      for (const [name, range, size] of unsatisfiable) {
        await assert.rejects(
          store.open(`outputs/100000002/1000000002.1.aa/${name}`, { range }),
          (err) => err instanceof RangeNotSatisfiableError && err.size === size,
          `${name} ${JSON.stringify(range)}`,
        );
      }
      await assert.rejects(
        store.open("outputs/100000002/1000000002.1.aa/gone.txt", { range: { start: 1 } }),
        (err) => err instanceof ObjectMissingError,
      );
      await assert.rejects(
        store.open("outputs/100000002/1000000002.1.aa/gone.txt", { range: { suffix: 0 } }),
        (err) => err instanceof ObjectMissingError,
      );
    });

    test("stat tells an object's size and time without opening it; a missing key or a folder is ObjectMissingError", async () => {
      const key = "outputs/100000003/1000000003.1.aa/Report-2.txt";
      await store.put(key, Readable.from([Buffer.from("naïve ✓\n")]));
      const info = await store.stat(key);
      assert.equal(info.key, key);
      assert.equal(info.size, Buffer.byteLength("naïve ✓\n"));
      assert.ok(Date.now() - info.modified.getTime() < 60_000);
      for (const missing of [
        "outputs/100000003/1000000003.1.aa/gone.txt",
        "outputs/100000003",
        "files/none",
      ]) {
        await assert.rejects(store.stat(missing), (err) => err instanceof ObjectMissingError, missing);
      }
    });

    test("a delete whose signal is aborted fails with the signal's reason and deletes nothing more", async () => {
      await store.put("files/1000004", Readable.from([Buffer.from("x")]));
      const stop = new AbortController();
      stop.abort(new Error("given up"));
      await assert.rejects(store.delete(["files/1000004"], { signal: stop.signal }));
      assert.equal((await store.stat("files/1000004")).size, 1);
      await store.delete(["files/1000004"], { signal: new AbortController().signal });
      await assert.rejects(store.stat("files/1000004"), (err) => err instanceof ObjectMissingError);
    });

    test("check passes on a reachable store", async () => {
      await store.check();
    });
  });
}

test("s3: a store that fails by itself mid-upload is not blamed on the body", async () => {
  const missing = new S3Store({
    bucket: "assay-no-such-bucket",
    endpoint: s3Endpoint(),
    region: "us-east-1",
    forcePathStyle: true,
  });
  for (const bytes of [1000, BIG]) {
    await assert.rejects(
      missing.put("files/1", Readable.from([randomBytes(bytes)]), 10 * BIG),
      (err) => !(err instanceof SourceError) && /bucket/i.test(String(err)),
      `${bytes} bytes`,
    );
  }
});

test("s3: check fails with the cause for a bucket that does not exist or a server that cannot be reached", async () => {
  const missing = new S3Store({
    bucket: "assay-no-such-bucket",
    endpoint: s3Endpoint(),
    forcePathStyle: true,
  });
  await assert.rejects(missing.check());
  const unreachable = new S3Store({
    bucket: bucket.name,
    endpoint: "http://127.0.0.1:9",
    forcePathStyle: true,
  });
  await assert.rejects(unreachable.check(), /ECONNREFUSED|connect/i);
  missing.client.destroy();
  unreachable.client.destroy();
});

test("s3: a 416 that does not tell the object's size (as some servers answer) takes it from a HEAD", async () => {
  const store = bucket.store("noisy/");
  const key = "outputs/100000003/1000000003.1.aa/r.txt";
  await store.put(key, Readable.from([Buffer.from("0123456789")]));
  // s3rver tells ActualObjectSize in its InvalidRange error, as S3 does; this server does not.
  const heads: string[] = [];
  store.client.middlewareStack.add(
    (next, context) => async (args) => {
      if (context.commandName === "HeadObjectCommand") heads.push(context.commandName);
      try {
        return await next(args);
      } catch (err) {
        delete (err as { ActualObjectSize?: unknown }).ActualObjectSize;
        throw err;
      }
    },
    { step: "initialize", name: "forgetObjectSize" },
  );
  await assert.rejects(
    store.open(key, { range: { start: 10 } }),
    (err) => err instanceof RangeNotSatisfiableError && err.size === 10,
  );
  assert.deepEqual(heads, ["HeadObjectCommand"]);
});
