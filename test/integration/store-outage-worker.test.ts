// A worker whose object store goes away mid-task: the runs it claims wait for the store (put back with
// their attempts refunded, ANALYSIS_STORAGE_UNAVAILABLE on their retry events) and the worker holds
// its claims, instead of using up every queued run's attempts within seconds and failing them all
// ANALYSIS_PROCESS_FAILED — a user's trial on 2026-12-07 stopped the store for 15 s and lost 272 of
// 300 runs that way. A store that still answers (its check passes) while one request of an attempt
// fails is not an outage: that attempt is counted as before. The store here is the test run's s3rver
// behind a TCP proxy that cuts what a client sends while "down".
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Registry } from "prom-client";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { workerMetrics } from "../../src/metrics/worker.ts";
import { S3Store } from "../../src/storage/s3.ts";
import { bearer, multipart } from "../helpers/app.ts";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";
import { createTestBucket, type TestBucket } from "../helpers/s3.ts";
import { startTcpProxy, type TcpProxy } from "../helpers/tcp-proxy.ts";

let bucket: TestBucket;
let proxy: TcpProxy;
let store: S3Store;
let env: RunnerEnv;
/** What the proxy cuts: every request, only uploads (PUT), or nothing. */
let down: "all" | "puts" | "none" = "none";

before(async () => {
  bucket = await createTestBucket();
  proxy = await startTcpProxy(bucket.endpoint, {
    fromClient: (chunk) =>
      down === "all" || (down === "puts" && chunk.subarray(0, 4).toString("latin1") === "PUT ")
        ? "cut"
        : "pass",
  });
  store = new S3Store({
    bucket: bucket.name,
    endpoint: proxy.url,
    forcePathStyle: true,
    prefix: "outage/",
    checkTimeoutMs: 2_000,
  });
  env = await runnerEnv({ store });
});
after(async () => {
  await env.close();
  store.client.destroy();
  await proxy.close();
  await bucket.drop();
});

const eventsOf = (taskId: string) =>
  env.db.sql<{ type: string; code: string | null; attempt: number | null; refunded: boolean | null }[]>`
    select type, data->>'errorCode' as code, (data->>'attempt')::int as attempt,
           (data->'refunded')::boolean as refunded
    from task_events where task_id = ${taskId} and run_id is not null`;

test("runs claimed while the store is down wait for it, their attempts refunded, and all succeed once it is back", async () => {
  const type = "store-outage";
  const inputs: string[] = [];
  for (let i = 0; i < 12; i++) inputs.push(await env.file(`a,b\n${i},ü\n`));
  // One attempt each: a run whose outage used it up would fail.
  const taskId = await env.task(type, inputs, { mode: "ok" }, 1);
  down = "all";
  const registry = new Registry();
  const worker = env.worker([fixtureProgram(type)], {
    concurrency: 2,
    observer: workerMetrics(registry, [type]),
  });
  worker.start();
  try {
    // Several claims meet the outage (the worker holds its claims between them, 100 ms doubling here).
    await waitFor(
      async () =>
        (await eventsOf(taskId)).filter((e) => e.code === "ANALYSIS_STORAGE_UNAVAILABLE").length >= 4 || null,
      30_000,
      "retries for the store",
    );
    const [during] = await env.db.sql<{ failed: number; attempts: number }[]>`
      select count(*) filter (where status = 'failed')::int as failed, coalesce(max(attempt), 0)::int as attempts
      from runs where task_id = ${taskId} and status not in ('starting', 'running')`;
    assert.deepEqual(during, { failed: 0, attempts: 0 }, "nothing failed, no attempt used up");
  } finally {
    down = "none";
  }
  const task = await waitForTerminal(env.db.sql, taskId, 60_000);
  assert.equal(task.status, "succeeded");
  const runs = await env.db.sql<{ status: string; attempt: number; output_key: string | null }[]>`
    select status, attempt, output_key from runs where task_id = ${taskId}`;
  assert.equal(runs.length, 12);
  for (const r of runs) {
    assert.equal(r.status, "succeeded");
    assert.equal(r.attempt, 1, "the outage's tries refunded");
    assert.ok(r.output_key);
    assert.ok((await store.list(`outputs/${r.output_key}/`)).length > 0, "its outputs are in the store");
  }
  const events = await eventsOf(taskId);
  assert.equal(events.filter((e) => e.type === "run.succeeded").length, 12, "each run's ending once");
  assert.ok(events.every((e) => e.type !== "run.failed"));
  // Each store retry says its attempt was not counted (the dashboard read "attempt 0 failed" without it).
  for (const e of events.filter((e) => e.code === "ANALYSIS_STORAGE_UNAVAILABLE"))
    assert.deepEqual(
      { type: e.type, attempt: e.attempt, refunded: e.refunded },
      {
        type: "run.retry",
        attempt: 0,
        refunded: true,
      },
    );
  await worker.stop();
  // Counted as the store's, not as a shutdown's (until 2026-12-07 every refunded retry was "shutdown").
  const text = await registry.metrics();
  const storeRetries = events.filter((e) => e.code === "ANALYSIS_STORAGE_UNAVAILABLE").length;
  assert.match(
    text,
    new RegExp(`assay_run_retries_total\\{analysis_type="${type}",reason="storage"\\} ${storeRetries}\\n`),
  );
  assert.doesNotMatch(text, /reason="shutdown"\} [1-9]/);
  assert.match(
    text,
    new RegExp(
      `assay_run_duration_seconds_count\\{analysis_type="${type}",outcome="storage"\\} ${storeRetries}\\n`,
    ),
  );
  assert.doesNotMatch(text, /outcome="requeued"\} [1-9]/);
});

test("an output put that fails while the store still answers its check is an attempt of the run's, counted", async () => {
  const type = "store-put-fails";
  const input = await env.file("a,b\n1,2\n");
  const taskId = await env.task(type, [input], { mode: "ok" }, 1);
  down = "puts";
  const worker = env.worker([fixtureProgram(type)], { concurrency: 1 });
  worker.start();
  try {
    const task = await waitForTerminal(env.db.sql, taskId, 60_000);
    assert.equal(task.status, "failed");
  } finally {
    down = "none";
    await worker.stop();
  }
  const [run] = await env.db.sql<{ error_code: string; attempt: number }[]>`
    select error_code, attempt from runs where task_id = ${taskId}`;
  assert.deepEqual(run, { error_code: "ANALYSIS_PROCESS_FAILED", attempt: 1 });
  // Nothing of the attempt is left in the store (its partial outputs are deleted as before).
  assert.deepEqual(await store.list(`outputs/${taskId}/`), []);
});

test("the API answers 503 NOT_READY with Retry-After while the store is away: an upload, a download, an output, a zip", async () => {
  // Until 2026-12-07 each was a 500 INTERNAL_ERROR, which clients take for a bug and do not retry.
  const type = "store-outage-api";
  const taskId = await env.task(type, [await env.file("a,b\n1,2\n")], { mode: "ok" }, 1);
  // And a task of two runs, whose download is a zip.
  const zipTaskId = await env.task(
    type,
    [await env.file("a,b\n3,4\n"), await env.file("a,b\n5,6\n")],
    { mode: "ok" },
    1,
  );
  const worker = env.worker([fixtureProgram(type)], { concurrency: 1 });
  worker.start();
  await waitForTerminal(env.db.sql, taskId, 60_000);
  await waitForTerminal(env.db.sql, zipTaskId, 60_000);
  await worker.stop();
  const [run] = await env.db.sql<{ id: string }[]>`select id::text from runs where task_id = ${taskId}`;
  const app = await env.app();
  const token = (await tokenCreate(env.db.sql, "runner")).token;
  const upload = () => {
    const { payload, headers } = multipart("file", "x,y\n3,4\n", "während.csv", "text/csv");
    return app.inject({
      method: "POST",
      url: "/api/files",
      payload,
      headers: { ...headers, ...bearer(token) },
    });
  };
  const get = (url: string) => app.inject({ url, headers: bearer(token) });
  const files = async () => (await env.db.sql`select id from files`).length;
  const before = await files();
  down = "all";
  try {
    for (const res of [
      await upload(),
      await get(`/api/analysis-tasks/${taskId}/download`),
      await get(`/api/analysis-tasks/${taskId}/runs/${run?.id}/outputs/out.json`),
      await get(`/api/analysis-tasks/${zipTaskId}/download`),
    ]) {
      assert.equal(res.statusCode, 503, res.body);
      assert.equal(res.headers["retry-after"], "2");
      assert.deepEqual(res.json(), {
        code: "NOT_READY",
        message: "The object store cannot be used right now; try again shortly.",
      });
    }
    assert.equal(await files(), before, "no file row for the refused upload");
    // Over a real socket too (its request is read whole before the put ends: a check of the request's
    // state took that for a client that had left, and answered 500).
    await app.listen({ host: "127.0.0.1", port: 0 });
    const form = new FormData();
    form.append("file", new Blob(["x,y\n5,6\n"], { type: "text/csv" }), "über das Netz.csv");
    const { port } = app.server.address() as { port: number };
    const real = await fetch(`http://127.0.0.1:${port}/api/files`, {
      method: "POST",
      body: form,
      headers: bearer(token),
    });
    assert.equal(real.status, 503, await real.clone().text());
    assert.equal(real.headers.get("retry-after"), "2");
    assert.equal(((await real.json()) as { code: string }).code, "NOT_READY");
    assert.equal(await files(), before, "no file row for the refused upload");
  } finally {
    down = "none";
  }
  assert.equal((await upload()).statusCode, 201);
  assert.equal((await get(`/api/analysis-tasks/${taskId}/download`)).statusCode, 200);
  assert.equal((await get(`/api/analysis-tasks/${zipTaskId}/download`)).statusCode, 200);
});
