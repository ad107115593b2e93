// The whole path of a file with ASSAY_STORAGE=s3 (an S3-compatible server on 127.0.0.1): uploads stream
// to the bucket, workers fetch inputs into their scratch folders and upload outputs under the attempt's
// key, the fence decides which attempt's objects are the run's, downloads stream from the bucket, and
// nothing is left behind locally.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { type ClaimedRun, runClaim, runComplete, runReapExpired } from "../../src/queue/sql.ts";
import type { HandlerContext } from "../../src/queue/worker.ts";
import { discardAttempt, processHandler, removeLeftovers } from "../../src/runner/handler.ts";
import type { S3Store } from "../../src/storage/s3.ts";
import { bearer, multipart } from "../helpers/app.ts";
import { waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv, strayOutputs } from "../helpers/runner.ts";
import { createTestBucket, type TestBucket } from "../helpers/s3.ts";
import { zipNames } from "../helpers/zip.ts";

const PREFIX = "flow/";
const LIMIT = 6 * 1024 * 1024;
let bucket: TestBucket;
let store: S3Store;
let env: RunnerEnv;
let app: FastifyInstance;
let token: string;
const logs: Record<string, unknown>[] = [];

before(async () => {
  bucket = await createTestBucket();
  store = bucket.store(PREFIX);
  env = await runnerEnv({
    store,
    configEnv: { ...bucket.env, ASSAY_S3_PREFIX: PREFIX, ASSAY_MAX_UPLOAD_BYTES: String(LIMIT) },
  });
  app = await env.app(logs);
  token = (await tokenCreate(env.db.sql, "runner")).token;
});
after(async () => {
  await env.close();
  await bucket.drop();
});

const keys = async (prefix: string) => (await store.list(prefix)).map((o) => o.key);
let typeSeq = 0;

test("an upload streams to the bucket; the row is written after the object; over the limit nothing is left", async () => {
  const content = randomBytes(LIMIT - 10);
  const { payload, headers } = multipart("file", content, "big.bin", "application/octet-stream");
  const res = await app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { ...headers, ...bearer(token) },
  });
  assert.equal(res.statusCode, 201, res.body);
  const { fileId, sizeBytes } = res.json().data;
  assert.equal(sizeBytes, content.length);
  const { stream, size } = await store.open(`files/${fileId}`);
  stream.destroy();
  assert.equal(size, content.length);
  assert.deepEqual(
    fs.readdirSync(env.dataDir).filter((n) => n === "files"),
    [],
    "nothing on the local disk",
  );

  const before = await keys("files/");
  const rows = (await env.db.sql`select count(*)::int as n from files`)[0]?.n;
  const tooBig = multipart("file", randomBytes(LIMIT + 1), "too-big.bin");
  const rejected = await app.inject({
    method: "POST",
    url: "/api/files",
    payload: tooBig.payload,
    headers: { ...tooBig.headers, ...bearer(token) },
  });
  assert.equal(rejected.statusCode, 413);
  assert.deepEqual(await keys("files/"), before, "no object for the rejected upload");
  assert.equal((await env.db.sql`select count(*)::int as n from files`)[0]?.n, rows);
});

test("a task runs from the bucket: inputs fetched, outputs uploaded under the attempt, zip and file served", async () => {
  const type = `s3-${++typeSeq}`;
  const files = [];
  for (const c of ["a,b\n1,2\n", "c\n3\n", "d\n4\n"]) files.push(await env.file(c));
  const failing = await env.file("x\n1\n");
  const taskId = await env.task(type, files, { mode: "ok" });
  const failTask = await env.task(type, [failing], { mode: "exit", code: 3 });
  const w = env.worker([fixtureProgram(type)]);
  await w.start();
  await waitForTerminal(env.db.sql, taskId);
  await waitForTerminal(env.db.sql, failTask);
  await w.stop();
  const runs = await env.db.sql<{ id: string; key: string }[]>`
    select r.id::text as id, r.output_key as key from runs r where r.task_id = ${taskId} order by r.id`;
  assert.equal(runs.length, 3);
  assert.deepEqual(
    await keys(`outputs/${taskId}/`),
    runs.map((r) => `outputs/${r.key}/out.json`),
  );
  assert.deepEqual(await keys(`outputs/${failTask}/`), [], "a failed attempt leaves no object");
  assert.deepEqual(fs.readdirSync(path.join(env.dataDir, "work")), [], "no scratch folder is left");
  assert.deepEqual(await strayOutputs(env), []);

  const one = await app.inject({
    url: `/api/analysis-tasks/${taskId}/runs/${runs[0]?.id}/download`,
    headers: bearer(token),
  });
  assert.equal(one.statusCode, 200);
  assert.equal(one.headers["content-length"], String(one.rawPayload.length));
  assert.deepEqual(one.json(), { input: 8 });
  const zip = await app.inject({ url: `/api/analysis-tasks/${taskId}/download`, headers: bearer(token) });
  assert.equal(zip.statusCode, 200);
  const names = zipNames(zip.rawPayload);
  assert.equal(names.length, 4); // results.csv and a file per run

  // An object the store lost: a logged 500 before any byte, for the zip and the single file.
  await store.delete([`outputs/${runs[1]?.key}/out.json`]);
  const broken = await app.inject({ url: `/api/analysis-tasks/${taskId}/download`, headers: bearer(token) });
  assert.equal(broken.statusCode, 500);
  const brokenOne = await app.inject({
    url: `/api/analysis-tasks/${taskId}/runs/${runs[1]?.id}/download`,
    headers: bearer(token),
  });
  assert.equal(brokenOne.statusCode, 500);
});

test("the fence decides: a stale attempt's objects go, the winner's stay; leftovers of a lost attempt go", async () => {
  const type = `s3-${++typeSeq}`;
  const input = await env.file("a,b\n1,2\n");
  const taskId = await env.task(type, [input], { mode: "ok" }, 3);
  const handler = processHandler(fixtureProgram(type), {
    store,
    workDir: path.join(env.dataDir, "work"),
    killGraceMs: 500,
  });
  const ctx = (): HandlerContext => ({
    signal: new AbortController().signal,
    reportProgress: () => {},
    releaseSlot: () => {},
    finishing: () => {},
  });
  const claim = async (): Promise<ClaimedRun> => {
    const [run] = await runClaim(env.db.sql, {
      workerId: "s3-fence",
      analysisType: type,
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
    assert.ok(run);
    return run;
  };
  // Attempt 1 uploads its outputs, then its lease is lost (its worker "died" before completing).
  const stale = await claim();
  const staleDone = await handler(stale, ctx());
  assert.equal(staleDone.status, "succeeded");
  await env.db.sql`update runs set lease_expires_at = now() - interval '1 second' where id = ${stale.id}`;
  await runReapExpired(env.db.sql, { batchSize: 10, retryBaseMs: 0, workerWaitMs: 60_000 });
  await env.db.sql`update runs set run_after = now() where id = ${stale.id}`;
  // Attempt 2 wins.
  const winner = await claim();
  assert.equal(winner.afterLostLease, true);
  const won = await handler(winner, ctx());
  assert.ok(won.status === "succeeded" && won.outputKey);
  const recorded = await runComplete(env.db.sql, [
    {
      id: winner.id,
      token: winner.leaseToken,
      status: "succeeded",
      result: won.result ?? null,
      outputKey: won.outputKey ?? null,
    },
  ]);
  assert.deepEqual(recorded.completed, [winner.id]);
  assert.equal((await keys(`outputs/${taskId}/`)).length, 2, "both attempts' objects exist for now");
  // The worker removes what the lost attempt left, once the winner is recorded.
  await removeLeftovers(store)(winner, won.outputKey ?? null);
  assert.deepEqual(await keys(`outputs/${taskId}/`), [`outputs/${won.outputKey}/out.json`]);
  // A stale attempt that completes late is fenced off; discarding it removes only its own objects.
  const fenced = await runComplete(env.db.sql, [
    {
      id: stale.id,
      token: stale.leaseToken,
      status: "succeeded",
      outputKey: staleDone.status === "succeeded" ? (staleDone.outputKey ?? null) : null,
    },
  ]);
  assert.deepEqual(fenced.completed, []);
  await discardAttempt(store)(stale);
  assert.deepEqual(await keys(`outputs/${taskId}/`), [`outputs/${won.outputKey}/out.json`]);
  const res = await app.inject({ url: `/api/analysis-tasks/${taskId}/download`, headers: bearer(token) });
  assert.equal(res.statusCode, 200, JSON.stringify(logs.filter((l) => (l.level as number) >= 50)));
  assert.deepEqual(res.json(), { input: 8 });
});

test("an input missing from the bucket fails the run as invalid input, not as a crash", async () => {
  const type = `s3-${++typeSeq}`;
  const input = await env.file("a\n1\n");
  await store.delete([`files/${input}`]);
  const taskId = await env.task(type, [input], { mode: "ok" }, 3);
  const w = env.worker([fixtureProgram(type)]);
  await w.start();
  await waitForTerminal(env.db.sql, taskId);
  await w.stop();
  const [run] = await env.db.sql`select status, error_code, attempt from runs where task_id = ${taskId}`;
  assert.deepEqual({ ...run }, { status: "failed", error_code: "ANALYSIS_INPUT_INVALID", attempt: 1 });
});

test("an input object that is not the file uploaded (other bytes of the same size, or another size) fails the run as invalid input; the program never sees it", async () => {
  const content = "naïve,\u202Ename\n1,2\n";
  const cases = {
    // As `assay storage migrate` leaves another installation's object of the same size.
    sameSize: Buffer.from(content.replace("1,2", "9,9")),
    otherSize: Buffer.from(`${content}3,4\n`),
  };
  for (const [what, bytes] of Object.entries(cases)) {
    const type = `s3-${++typeSeq}`;
    const input = await env.file(content);
    await store.put(`files/${input}`, Readable.from([bytes]));
    const taskId = await env.task(type, [input], { mode: "ok" }, 3);
    const w = env.worker([fixtureProgram(type)]);
    await w.start();
    await waitForTerminal(env.db.sql, taskId);
    await w.stop();
    const [run] = await env.db.sql`
      select status, error_code, error_message, attempt, output_key from runs where task_id = ${taskId}`;
    assert.deepEqual(
      { ...run },
      {
        status: "failed",
        error_code: "ANALYSIS_INPUT_INVALID",
        error_message: "the input file in storage is not the file uploaded (its size or sha256 differs)",
        attempt: 1,
        output_key: null,
      },
      what,
    );
    assert.deepEqual(await keys(`outputs/${taskId}/`), [], `${what}: no output`);
  }
  assert.deepEqual(await strayOutputs(env), [], "no scratch folder left");
});
