// The queue gauges' read from PostgreSQL at scrape time: totals past 2^31, and what a scrape costs the
// database once the tasks table is large.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { QUEUE_READ_TIMEOUT_MS } from "../../src/metrics/api.ts";
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

test("a slow totals read is not repeated on every scrape; the queue depth still is read every time", async () => {
  const owner = await seedUser(t.db.sql, "bulk");
  await t.db.sql`
    insert into tasks (owner_id, analysis_type, status, total_count, succeeded_count, finished_at)
    select ${owner.userId}, 'bulk-type', 'succeeded', 1, 1, now() from generate_series(1, 20000)`;
  await t.db.sql`analyze tasks`;
  // The totals read made slow whatever the machine's speed (a table of a million tasks takes
  // ~0.3 s): the tasks table locked until the scrape's sum has waited 100 ms for it.
  const locked = await t.db.sql.reserve();
  let first: string;
  try {
    await locked`begin`;
    await locked`lock table tasks in access exclusive mode`;
    const scraping = scrape();
    await waitFor(async () => {
      const [waiting] = await t.db.sql<{ n: number }[]>`
        select count(*)::int as n from pg_stat_activity
        where datname = current_database() and query like '%sum(succeeded_count)%' and wait_event_type = 'Lock'
          and now() - query_start > interval '100 ms' and pid <> pg_backend_pid()`;
      return (waiting?.n ?? 0) > 0;
    });
    await locked`commit`;
    first = await scraping;
  } finally {
    locked.release();
  }
  assert.equal(
    line(first, 'assay_runs_finished{analysis_type="bulk-type",status="succeeded"}'),
    'assay_runs_finished{analysis_type="bulk-type",status="succeeded"} 20000',
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
  // ...until a hundred times the sum's duration (here ≥ 10 s; at most a minute) has passed.
  await waitFor(
    async () =>
      (await scrape()).includes('assay_runs_finished{analysis_type="bulk-late",status="succeeded"} 1\n'),
    90_000,
    "the totals summed again",
  );
});

test("a read held up past the timeout: the next scrape waits for it instead of starting another", async () => {
  const owner = await seedUser(t.db.sql, "held");
  await createTask(t.db.sql, owner, "held-type", 1);
  const errorsBefore = Number(
    /^assay_metrics_scrape_errors_total (\d+)$/m.exec(await scrape())?.[1] ?? Number.NaN,
  );
  const readsWaiting = async () => {
    const [r] = await t.db.sql<{ n: number }[]>`
      select count(*)::int as n from pg_stat_activity
      where datname = current_database() and wait_event_type = 'Lock' and query like '%from runs where status%'
        and pid <> pg_backend_pid()`;
    return r?.n ?? 0;
  };
  // The runs table locked: the queue read waits on the lock, past QUEUE_READ_TIMEOUT_MS.
  const locked = await t.db.sql.reserve();
  try {
    await locked`begin`;
    await locked`lock table runs in access exclusive mode`;
    for (const n of [1, 2]) {
      const started = performance.now();
      const body = await scrape();
      const ms = performance.now() - started;
      assert.ok(ms >= QUEUE_READ_TIMEOUT_MS - 100, `scrape ${n} waited ${Math.round(ms)} ms for the read`);
      assert.ok(!/^assay_queue_depth\{/m.test(body), `scrape ${n}: no queue gauges`);
      assert.equal(
        line(body, "assay_metrics_scrape_errors_total"),
        `assay_metrics_scrape_errors_total ${errorsBefore + n}`,
      );
      assert.equal(await readsWaiting(), 1, `after scrape ${n}: one read waits, not one per scrape`);
    }
    await locked`commit`;
  } finally {
    locked.release();
  }
  // The read held up ends once the lock goes, and scrapes have their gauges again.
  await waitFor(async () => (await scrape()).includes('assay_queue_depth{analysis_type="held-type"} 1\n'));
});
