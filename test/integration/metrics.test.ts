import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { startTestApp, type TestApp } from "../helpers/app.ts";
import { createTask, seedUser } from "../helpers/queue.ts";

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
  assert.match(after, /assay_api_process_resident_memory_bytes \d+/);
});
