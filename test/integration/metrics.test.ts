import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";
import { Registry } from "prom-client";
import { createLogger } from "../../src/log.ts";
import { workerMetrics } from "../../src/metrics/worker.ts";
import { Reaper } from "../../src/queue/reaper.ts";
import { type Handler, Worker } from "../../src/queue/worker.ts";
import { startTestApp, type TestApp } from "../helpers/app.ts";
import { createTask, seedUser, waitFor, waitForTerminal } from "../helpers/queue.ts";
import { openSse } from "../helpers/sse.ts";

const logger = createLogger({ level: "silent" });

let t: TestApp;
before(async () => {
  t = await startTestApp();
});
after(() => t.close());

const scrape = async () => {
  const res = await t.app.inject({ url: "/metrics" });
  assert.equal(res.statusCode, 200);
  assert.match(String(res.headers["content-type"]), /^text\/plain/);
  return res.body;
};

test("/metrics: HTTP durations, queue depth and age, live and finished runs, SSE subscribers; and they move", async () => {
  const owner = await seedUser(t.db.sql, "m");
  await t.app.inject({ url: "/healthz" });
  const before = await scrape();
  assert.match(
    before,
    /assay_http_request_duration_seconds_count\{method="GET",route="\/healthz",status_code="200"\} 1/,
  );
  assert.match(before, /assay_sse_subscribers 0/);
  assert.ok(!/assay_queue_depth\{analysis_type="metric-type"\}/.test(before));

  const taskId = await createTask(t.db.sql, owner, "metric-type", 3);
  await t.db
    .sql`update runs set status = 'starting', lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute'
                 where id = (select min(id) from runs where task_id = ${taskId})`;
  const after = await scrape();
  assert.match(after, /assay_queue_depth\{analysis_type="metric-type"\} 2/);
  assert.match(after, /assay_queue_oldest_age_seconds\{analysis_type="metric-type"\} \d/);
  assert.match(after, /assay_runs_live\{analysis_type="metric-type",status="starting"\} 1/);
  assert.match(after, /assay_runs_finished\{analysis_type="metric-type",status="succeeded"\} 0/);
  assert.match(after, /assay_process_resident_memory_bytes \d+/);
  assert.match(after, /assay_event_notifications_total\{kind="doorbell"\} 0/);
});

test("/metrics counts requests whose client left before the response was complete: a closed stream, a cut upload", async () => {
  const owner = await seedUser(t.db.sql, "m-aborts");
  const token = await t.token("m-aborts");
  const taskId = await createTask(t.db.sql, owner, "metric-aborts", 1); // never runs: the stream stays open
  await t.app.listen({ host: "127.0.0.1", port: 0 });
  const { port } = t.app.server.address() as { port: number };
  const count = async (method: string, route: string) => {
    const line = new RegExp(
      `assay_http_requests_aborted_total\\{method="${method}",route="${route.replaceAll("/", "\\/")}"\\} (\\d+)`,
    ).exec(await scrape());
    return Number(line?.[1] ?? 0);
  };
  // An event stream its client closes: the usual end of a browser's stream.
  const stream = await openSse(`http://127.0.0.1:${port}/api/analysis-tasks/${taskId}/events`, token);
  assert.equal(stream.status, 200);
  await waitFor(async () => t.app.services.events.size === 1, 10_000, "the stream's subscription");
  stream.close();
  await waitFor(
    async () => (await count("GET", "/api/analysis-tasks/:taskId/events")) === 1,
    10_000,
    "the closed stream counted",
  );
  // An upload cut off halfway through its body.
  const boundary = "cut-off-upload";
  const head = `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="half.csv"\r\n\r\n`;
  await new Promise<void>((resolve) => {
    const socket = net.connect(port, "127.0.0.1", () => {
      socket.write(
        `POST /api/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${token}\r\n` +
          `Content-Type: multipart/form-data; boundary=${boundary}\r\nContent-Length: 100000\r\n\r\n${head}a,b\n1,2\n`,
      );
      setTimeout(() => socket.destroy(), 200);
    });
    socket.on("error", () => {});
    socket.on("close", () => resolve());
  });
  await waitFor(async () => (await count("POST", "/api/files")) === 1, 10_000, "the cut upload counted");
  // Counted, not timed: neither is in the durations.
  const text = await scrape();
  assert.doesNotMatch(
    text,
    /assay_http_request_duration_seconds_count\{method="GET",route="\/api\/analysis-tasks\/:taskId\/events"/,
  );
  assert.doesNotMatch(text, /assay_http_request_duration_seconds_count\{method="POST",route="\/api\/files"/);
});

test("worker metrics: claims, live attempts, durations by outcome, retries, lost and fenced leases, reaped runs", async () => {
  const owner = await seedUser(t.db.sql, "wm");
  const registry = new Registry();
  const types = ["wm-ok", "wm-flaky", "wm-fail", "wm-lost", "wm-fenced", "wm-held"];
  const observer = workerMetrics(registry, types);
  let releaseLost: () => void = () => {};
  const lostRunning = new Promise<void>((r) => {
    releaseLost = r;
  });
  const abortable = (signal: AbortSignal) =>
    new Promise<{ status: "cancelled" }>((resolve) =>
      signal.addEventListener("abort", () => resolve({ status: "cancelled" })),
    );
  const handlers: Record<string, Handler> = {
    "wm-ok": async () => ({ status: "succeeded" }),
    "wm-flaky": async (run) =>
      run.attempt === 1
        ? { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true }
        : { status: "succeeded" },
    "wm-fail": async () => ({ status: "failed", errorCode: "ANALYSIS_DATA_INVALID" }),
    // First attempt: runs until its lease is found gone; the reaper re-queues it; the second succeeds.
    "wm-lost": async (run, { signal }) => {
      if (run.attempt > 1) return { status: "succeeded" };
      releaseLost();
      return abortable(signal);
    },
    // First attempt: its lease is taken over before it completes, so the completion is fenced off.
    "wm-fenced": async (run) => {
      if (run.attempt === 1)
        await t.db.sql`update runs set lease_token = gen_random_uuid() where id = ${run.id}`;
      return { status: "succeeded" };
    },
    // Runs until shutdown hands it back.
    "wm-held": async (_run, { signal }) => abortable(signal),
  };
  const worker = new Worker({
    sql: t.db.sql,
    logger,
    types: Object.fromEntries(Object.entries(handlers).map(([type, handler]) => [type, { handler }])),
    concurrency: 8,
    leaseTtlMs: 30_000,
    pollIntervalMs: 100,
    retryBaseMs: 10,
    observer,
  });
  const reaper = new Reaper({
    sql: t.db.sql,
    logger,
    intervalMs: 1000,
    leaseTtlMs: 30_000,
    retryBaseMs: 10,
    workerWaitMs: 60_000,
    observer,
  });
  const text = () => registry.metrics();
  const tasks: Record<string, string> = {};
  for (const [type, n] of [
    ["wm-ok", 3],
    ["wm-flaky", 1],
    ["wm-fail", 1],
    ["wm-lost", 1],
    ["wm-fenced", 1],
    ["wm-held", 1],
  ] as const)
    tasks[type] = await createTask(t.db.sql, owner, type, n);
  const before = await text();
  assert.match(before, /assay_worker_attempts_live\{analysis_type="wm-ok"\} 0/);
  assert.match(before, /assay_reaped_runs_total\{outcome="requeued"\} 0/);

  await worker.start();
  await lostRunning;
  await waitFor(async () => /assay_worker_attempts_live\{analysis_type="wm-held"\} 1\n/.test(await text()));
  assert.match(await text(), /assay_worker_attempts_live\{analysis_type="wm-lost"\} 1\n/);
  // Take the wm-lost lease away: the next heartbeat finds it gone and aborts the attempt.
  await t.db
    .sql`update runs set lease_token = gen_random_uuid() where task_id = ${tasks["wm-lost"] as string}`;
  await worker.heartbeat();
  await waitFor(
    async () =>
      (
        await t.db
          .sql`select 1 from runs where task_id = ${tasks["wm-fenced"] as string} and attempt = 1 and status = 'starting'`
      ).length > 0 &&
      /assay_lease_losses_total\{analysis_type="wm-fenced",how="fenced"\} 1\n/.test(await text()),
  );
  // Both orphaned leases expire; one reaper pass re-queues them and the worker finishes them.
  await t.db.sql`update runs set lease_expires_at = now() - interval '1 second'
                 where task_id in ${t.db.sql([tasks["wm-lost"] as string, tasks["wm-fenced"] as string])}`;
  const pass = await reaper.runOnce();
  assert.equal(pass.requeued, 2);
  for (const type of ["wm-ok", "wm-flaky", "wm-fail", "wm-lost", "wm-fenced"])
    await waitForTerminal(t.db.sql, tasks[type] as string);
  await waitFor(async () =>
    /assay_run_duration_seconds_count\{analysis_type="wm-fenced",outcome="succeeded"\} 1\n/.test(
      await text(),
    ),
  );
  await worker.stop(0);
  const m = await text();
  const expect = [
    'assay_claim_latency_seconds_count{analysis_type="wm-ok"} 3',
    'assay_run_duration_seconds_count{analysis_type="wm-ok",outcome="succeeded"} 3',
    'assay_run_duration_seconds_count{analysis_type="wm-flaky",outcome="retried"} 1',
    'assay_run_duration_seconds_count{analysis_type="wm-flaky",outcome="succeeded"} 1',
    'assay_run_retries_total{analysis_type="wm-flaky",reason="transient"} 1',
    'assay_run_duration_seconds_count{analysis_type="wm-fail",outcome="failed"} 1',
    'assay_lease_losses_total{analysis_type="wm-lost",how="heartbeat"} 1',
    'assay_run_duration_seconds_count{analysis_type="wm-lost",outcome="lost"} 1',
    'assay_run_duration_seconds_count{analysis_type="wm-lost",outcome="succeeded"} 1',
    'assay_lease_losses_total{analysis_type="wm-fenced",how="fenced"} 1',
    'assay_run_duration_seconds_count{analysis_type="wm-fenced",outcome="lost"} 1',
    'assay_reaped_runs_total{outcome="requeued"} 2',
    'assay_run_retries_total{analysis_type="wm-held",reason="shutdown"} 1',
    'assay_run_duration_seconds_count{analysis_type="wm-held",outcome="requeued"} 1',
    'assay_worker_attempts_live{analysis_type="wm-held"} 0',
    'assay_worker_attempts_live{analysis_type="wm-lost"} 0',
  ];
  for (const line of expect) assert.ok(m.includes(`${line}\n`), `metrics include ${line}`);
  assert.match(m, /assay_claim_duration_seconds_count\{analysis_type="wm-ok"\} [1-9]/);
  const [held] = await t.db
    .sql`select status, attempt from runs where task_id = ${tasks["wm-held"] as string}`;
  assert.deepEqual({ ...held }, { status: "queued", attempt: 0 }, "shutdown refunded the attempt");
});
