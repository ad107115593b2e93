// The queue gauges' read when it is held up for good (a lock on runs that is never released): PostgreSQL
// cancels it at its bound, so it does not hold a pool connection forever, and scrapes go on answering
// in time, one read at a time. The bounds are shortened here (apiMetrics' own defaults: 5 s and 30 s).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import Fastify from "fastify";
import { Registry } from "prom-client";
import type { EventHub } from "../../src/events/hub.ts";
import { apiMetrics } from "../../src/metrics/api.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser, waitFor } from "../helpers/queue.ts";

const WAIT_MS = 300;
const CANCEL_MS = 1500;

let db: TestDatabase;
let registry: Registry;
before(async () => {
  db = await createTestDatabase();
  registry = new Registry();
  // The hub's two counters are all the metrics read of it; the queue read is the real one.
  const hub = { size: 0, received: { notifications: 0, doorbells: 0 } } as unknown as EventHub;
  apiMetrics(Fastify(), db.sql, hub, registry, { waitMs: WAIT_MS, cancelMs: CANCEL_MS });
});
after(() => db.drop());

const errorsIn = (body: string) =>
  Number(/^assay_metrics_scrape_errors_total (\d+)$/m.exec(body)?.[1] ?? Number.NaN);

/** Queue reads of this database's sessions waiting on a lock. */
async function readsWaiting(): Promise<number> {
  const [r] = await db.sql<{ n: number }[]>`
    select count(*)::int as n from pg_stat_activity
    where datname = current_database() and wait_event_type = 'Lock'
      and query like '%from runs where status%' and pid <> pg_backend_pid()`;
  return r?.n ?? 0;
}

test("a queue read held up for good is cancelled at its bound; scrapes stay bounded, one read at a time", async () => {
  const owner = await seedUser(db.sql, 'Zoë "held" 💤');
  await createTask(db.sql, owner, "held-for-good", 1);
  const depth = 'assay_queue_depth{analysis_type="held-for-good"} 1\n';
  assert.ok((await registry.metrics()).includes(depth), "the queue depth, before the lock");

  const locked = await db.sql.reserve();
  try {
    await locked`begin`;
    await locked`lock table runs in access exclusive mode`;
    const started = performance.now();
    const body = await registry.metrics();
    assert.ok(performance.now() - started < WAIT_MS + 2000, "the scrape answered in time");
    assert.ok(!/^assay_queue_depth\{/m.test(body), "no queue gauges");
    assert.equal(errorsIn(body), 1);
    assert.equal(await readsWaiting(), 1, "the read waits on the lock");
    // The lock is never released: PostgreSQL cancels the read (before, it waited as long as the lock).
    await waitFor(async () => (await readsWaiting()) === 0, CANCEL_MS + 10_000, "the held read cancelled");
    // Scrapes go on failing in time, each counted, and never more than one read waits.
    for (const n of [2, 3, 4]) {
      const b = await registry.metrics();
      assert.equal(errorsIn(b), n);
      assert.ok((await readsWaiting()) <= 1, `after scrape ${n}: one read at most`);
    }
    await locked`commit`;
  } finally {
    locked.release();
  }
  await waitFor(async () => (await registry.metrics()).includes(depth), 10_000, "the queue depth again");
});
