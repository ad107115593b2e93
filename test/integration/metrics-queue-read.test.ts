// The queue gauges' read from PostgreSQL at scrape time: totals past 2^31, and what a scrape costs the
// database once the tasks table is large.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { startTestApp, type TestApp } from "../helpers/app.ts";
import { createTask, seedUser, waitFor } from "../helpers/queue.ts";

let t: TestApp;
before(async () => {
  t = await startTestApp();
});
after(() => t.close());

const scrape = async () => {
  const res = await t.app.inject({ url: "/metrics" });
  assert.equal(res.statusCode, 200);
  return res.body;
};
const line = (body: string, name: string) =>
  body.split("\n").find((l) => l.startsWith(`${name} `)) ?? `(no ${name})`;

test("finished totals past 2^31 are reported, not a failed read", async () => {
  const owner = await seedUser(t.db.sql, "huge");
  const max = 2 ** 31 - 1;
  await t.db.sql`
    insert into tasks (owner_id, analysis_type, status, total_count, succeeded_count, failed_count, finished_at)
    values (${owner.userId}, 'huge-type', 'succeeded', ${max}, ${max}, 0, now()),
           (${owner.userId}, 'huge-type', 'failed', 10, 5, 5, now())`;
  try {
    const body = await scrape();
    assert.equal(
      line(body, 'assay_runs_finished{analysis_type="huge-type",status="succeeded"}'),
      `assay_runs_finished{analysis_type="huge-type",status="succeeded"} ${max + 5}`,
    );
    assert.equal(line(body, "assay_metrics_scrape_errors_total"), "assay_metrics_scrape_errors_total 0");
  } finally {
    // Gone again, whatever happened: the next test's scrapes must not fail on it.
    await t.db.sql`delete from tasks where analysis_type = 'huge-type'`;
  }
});

test("a large tasks table is not summed on every scrape; the queue depth still is read every time", async () => {
  const owner = await seedUser(t.db.sql, "bulk");
  // Enough finished tasks that summing their counters takes tens of milliseconds.
  await t.db.sql`
    insert into tasks (owner_id, analysis_type, status, total_count, succeeded_count, finished_at)
    select ${owner.userId}, 'bulk-type', 'succeeded', 1, 1, now() from generate_series(1, 200000)`;
  await t.db.sql`analyze tasks`;
  const first = await scrape();
  assert.equal(
    line(first, 'assay_runs_finished{analysis_type="bulk-type",status="succeeded"}'),
    'assay_runs_finished{analysis_type="bulk-type",status="succeeded"} 200000',
  );
  // Right after: a task finishes and another is queued. The next scrape reports the queued one (its
  // read is cheap, on a partial index) but reuses the totals it summed a moment ago...
  await t.db.sql`
    insert into tasks (owner_id, analysis_type, status, total_count, succeeded_count, finished_at)
    values (${owner.userId}, 'bulk-late', 'succeeded', 1, 1, now())`;
  await createTask(t.db.sql, owner, "bulk-queued", 1);
  const second = await scrape();
  assert.equal(
    line(second, 'assay_queue_depth{analysis_type="bulk-queued"}'),
    'assay_queue_depth{analysis_type="bulk-queued"} 1',
  );
  assert.ok(
    !second.includes('assay_runs_finished{analysis_type="bulk-late"'),
    "the totals were not summed again at once",
  );
  // ...until a hundred times the sum's duration (at most a minute) has passed.
  await waitFor(
    async () =>
      (await scrape()).includes('assay_runs_finished{analysis_type="bulk-late",status="succeeded"} 1\n'),
    90_000,
    "the totals summed again",
  );
});
