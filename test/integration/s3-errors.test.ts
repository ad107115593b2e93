// How the S3 store fails: a missing bucket is the store's failure (retried), never a missing object
// (a run failed for good); start-up and /readyz get a reason in words; a server that accepts
// connections and never answers does not hold a caller forever.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import { runClaim } from "../../src/queue/sql.ts";
import type { HandlerContext } from "../../src/queue/worker.ts";
import { processHandler } from "../../src/runner/handler.ts";
import { S3Store } from "../../src/storage/s3.ts";
import { ObjectMissingError } from "../../src/storage/store.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";
import { createTestBucket, s3Endpoint, type TestBucket } from "../helpers/s3.ts";

let bucket: TestBucket;
let env: RunnerEnv;
const MISSING = "assay-no-such-bucket";
const opened: S3Store[] = [];
const s3 = (o: Partial<ConstructorParameters<typeof S3Store>[0]> = {}) => {
  const store = new S3Store({ bucket: MISSING, endpoint: s3Endpoint(), forcePathStyle: true, ...o });
  opened.push(store);
  return store;
};

before(async () => {
  bucket = await createTestBucket();
  env = await runnerEnv({ store: bucket.store("errors/") });
});
after(async () => {
  for (const s of opened) s.client.destroy();
  await env.close();
  await bucket.drop();
});

test("a missing bucket is not a missing object: open and download fail with the store's error", async () => {
  const missing = s3();
  for (const attempt of [
    () => missing.open("files/1"),
    () => missing.download("files/1", path.join(env.dataDir, "never")),
  ]) {
    await assert.rejects(
      attempt(),
      (err) => !(err instanceof ObjectMissingError) && /bucket/i.test(String(err)),
    );
  }
  // A missing key in a bucket that exists still is one.
  await assert.rejects(env.storage.open("files/0"), (err) => err instanceof ObjectMissingError);
});

test("a worker whose bucket is gone retries the run instead of failing it as invalid input", async () => {
  const type = "s3-errors";
  const input = await env.file("a,b\n1,2\n");
  await env.task(type, [input], { mode: "ok" }, 3);
  const [run] = await runClaim(env.db.sql, {
    workerId: "s3-errors",
    analysisType: type,
    limit: 1,
    globalLimit: 0,
    leaseTtlMs: 30_000,
  });
  assert.ok(run);
  const handler = processHandler(fixtureProgram(type), {
    store: s3(),
    workDir: path.join(env.dataDir, "work"),
    killGraceMs: 500,
  });
  const ctx: HandlerContext = {
    signal: new AbortController().signal,
    reportProgress: () => {},
    releaseSlot: () => {},
    finishing: () => {},
  };
  // A handler that throws is a transient failure: the worker retries the run with backoff. Resolving
  // with ANALYSIS_INPUT_INVALID would fail it for good, its input intact in the real bucket.
  await assert.rejects(handler(run, ctx), /bucket/i);
});

test("check says in words that the bucket does not exist, and where", async () => {
  await assert.rejects(s3().check(), (err: Error) => {
    assert.match(
      err.message,
      /^the bucket "assay-no-such-bucket" does not exist at http:\/\/127\.0\.0\.1:\d+$/,
    );
    assert.ok(err.cause, "the SDK's error is kept as the cause");
    return true;
  });
});

test("a server that accepts connections and never answers: check, open and put give up in time", async () => {
  const sockets = new Set<net.Socket>();
  const silent = net.createServer((socket) => {
    sockets.add(socket);
    socket.on("error", () => {});
  });
  await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
  const port = (silent.address() as net.AddressInfo).port;
  try {
    const store = s3({
      bucket: bucket.name,
      // Credentials in the endpoint's URL never reach a message.
      endpoint: `http://someone:hunter2@127.0.0.1:${port}`,
      responseTimeoutMs: 300,
      checkTimeoutMs: 500,
    });
    /** Fails the test, rather than hanging it, when `work` never settles. */
    const bounded = <T>(work: Promise<T>, ms: number) =>
      Promise.race([
        work,
        new Promise<never>((_, reject) =>
          setTimeout(() => reject(new Error(`still waiting after ${ms} ms`)), ms).unref(),
        ),
      ]);
    await assert.rejects(bounded(store.check(), 5000), (err: Error) => {
      assert.match(err.message, /^the store at http:\/\/127\.0\.0\.1:\d+ did not answer within 500 ms$/);
      assert.doesNotMatch(err.message, /hunter2/);
      return true;
    });
    // The SDK retries a request that timed out (three attempts): a few seconds at most.
    await assert.rejects(
      bounded(store.open("files/1"), 10_000),
      (err: Error) => err.name === "TimeoutError" && !(err instanceof ObjectMissingError),
    );
    await assert.rejects(
      bounded(store.put("files/1", Readable.from([Buffer.from("x")])), 10_000),
      (err: Error) => err.name === "TimeoutError",
    );
  } finally {
    for (const s of sockets) s.destroy();
    silent.close();
  }
});

/**
 * A store endpoint that answers every GET with the headers of an object of `length` bytes and its
 * first 1,000, then sends nothing more on a connection it keeps open (a gateway stalled mid-object,
 * or a slow link).
 */
async function stallingServer(length: number): Promise<{ port: number; close(): void }> {
  const sockets = new Set<net.Socket>();
  const server = http.createServer((_req, res) => {
    res.writeHead(200, { "content-length": String(length), "content-type": "application/octet-stream" });
    res.write(Buffer.alloc(1000, 7));
  });
  server.on("connection", (s) => sockets.add(s));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

test("a body that stops arriving mid-download is given up, not waited for forever", async () => {
  const { port, close } = await stallingServer(100_000);
  try {
    const store = s3({ bucket: "b", endpoint: `http://127.0.0.1:${port}`, bodyIdleTimeoutMs: 300 });
    const file = path.join(env.dataDir, "stalled");
    await assert.rejects(
      Promise.race([
        store.download("files/1", file),
        new Promise<never>((_, reject) =>
          setTimeout(() => reject(new Error("still downloading after 5 s")), 5000).unref(),
        ),
      ]),
      /the store sent nothing of "files\/1" for 300 ms/,
    );
  } finally {
    close();
  }
});

test("a run cancelled while its input downloads ends at once, the download with it", async () => {
  // A large object whose first bytes come and then nothing (a slow link): without the run's signal
  // the download went on, the cancel waiting for it (for the idle timeout at least).
  const { port, close } = await stallingServer(100_000_000);
  try {
    const store = s3({ bucket: "b", endpoint: `http://127.0.0.1:${port}` });
    // The store alone: the download ends with the signal's reason.
    const controller = new AbortController();
    const file = path.join(env.dataDir, "cancelled-download");
    const download = store.download("files/1", file, controller.signal);
    setTimeout(() => controller.abort("cancel"), 200);
    const t0 = performance.now();
    await assert.rejects(download, (err) => err === "cancel" || /abort/i.test(String(err)));
    assert.ok(performance.now() - t0 < 5000, "the download ended with its signal");
    // Through the handler: a run's signal aborted mid-download ends the handler (the worker's decide()
    // records the cancel: the reason comes first), and its attempt's folder is gone.
    const type = "s3-errors";
    const input = await env.file("a,b\n1,2\n");
    await env.task(type, [input], { mode: "ok" }, 3);
    const [run] = await runClaim(env.db.sql, {
      workerId: "s3-errors-cancel",
      analysisType: type,
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
    assert.ok(run);
    const workDir = path.join(env.dataDir, "work-cancel");
    const handler = processHandler(fixtureProgram(type), { store, workDir, killGraceMs: 500 });
    const runSignal = new AbortController();
    const ctx: HandlerContext = {
      signal: runSignal.signal,
      reportProgress: () => {},
      releaseSlot: () => {},
      finishing: () => {},
    };
    const ended = handler(run, ctx);
    setTimeout(() => runSignal.abort("cancel"), 200);
    const t1 = performance.now();
    // The worker's folder is made (it did not exist): the download starts, and the cancel ends it.
    await assert.rejects(ended, (err: NodeJS.ErrnoException) => {
      assert.notEqual(err.code, "ENOENT", String(err));
      return true;
    });
    const took = performance.now() - t1;
    assert.ok(took >= 150 && took < 5000, `the handler ended with the run's signal (${took} ms)`);
    // Made by the attempt (it did not exist), and its folder gone.
    assert.deepEqual(fs.readdirSync(workDir), [], "no attempt folder left");
  } finally {
    close();
  }
});
