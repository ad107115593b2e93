// The queue gauges of /metrics against the runs table itself, through the events that matter: a task
// queued, claimed by a worker process, that worker SIGKILLed (its leases left to expire, and no
// reaper running anywhere), another worker reaping and draining, and a task cancelled while queued.
// At every step each gauge of the type must say what `select count(*)` says.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { bearer, startTestApp, type TestApp } from "../helpers/app.ts";
import { createTask, seedUser, waitFor, waitForTerminal } from "../helpers/queue.ts";
import { createExecutionsTable, startWorkerProcess, type WorkerProcess } from "../helpers/workers.ts";

// A type Assay knows (the fixture worker runs any type as a sleep), so its series exist even at zero.
const TYPE = "summary";
const LIVE = ["starting", "running", "cancelling"];
const FINISHED = ["succeeded", "failed", "timed_out", "cancelled"];

let t: TestApp;
const workers: WorkerProcess[] = [];
before(async () => {
  t = await startTestApp();
  await createExecutionsTable(t.db.sql);
});
after(async () => {
  for (const w of workers)
    if (w.child.exitCode === null && w.child.signalCode === null) w.child.kill("SIGKILL");
  await Promise.all(workers.map((w) => w.exited));
  await t.close();
});

/** The type's queue series from one scrape, by `name{labels}` (absent series are left out). */
async function scraped(): Promise<Map<string, number>> {
  const res = await t.app.inject({ url: "/metrics" });
  assert.equal(res.statusCode, 200);
  const out = new Map<string, number>();
  for (const line of res.body.split("\n")) {
    const m = /^(assay_(?:queue_depth|runs_live|runs_lease_expired|runs_finished)\{[^}]*\}) (\S+)$/.exec(
      line,
    );
    if (m && line.includes(`analysis_type="${TYPE}"`)) out.set(m[1] as string, Number(m[2]));
  }
  return out;
}

/** The same series computed from the runs table (the reaper's test of an expired lease). */
async function truth(): Promise<Map<string, number>> {
  const rows = await t.db.sql<{ status: string; expired: boolean; n: number }[]>`
    select status, coalesce(lease_expires_at < now(), false) as expired, count(*)::int as n
    from runs where analysis_type = ${TYPE} group by 1, 2`;
  const count = (status: string, expired?: boolean) =>
    rows
      .filter((r) => r.status === status && (expired === undefined || r.expired === expired))
      .reduce((n, r) => n + r.n, 0);
  const l = `analysis_type="${TYPE}"`;
  const out = new Map<string, number>([[`assay_queue_depth{${l}}`, count("queued")]]);
  for (const s of LIVE) out.set(`assay_runs_live{${l},status="${s}"}`, count(s, false));
  out.set(
    `assay_runs_lease_expired{${l}}`,
    LIVE.reduce((n, s) => n + count(s, true), 0),
  );
  for (const s of FINISHED) out.set(`assay_runs_finished{${l},status="${s}"}`, count(s));
  return out;
}

const show = (m: Map<string, number>) => JSON.stringify(Object.fromEntries([...m].sort()), null, 1);

/** Until one scrape and the table agree on every series (both read again each time), then the values. */
async function agree(what: string): Promise<Map<string, number>> {
  let last = "";
  try {
    return await waitFor(
      async () => {
        const [m, want] = [await scraped(), await truth()];
        last = `scraped ${show(m)}\ntable ${show(want)}`;
        return show(m) === show(want) ? want : undefined;
      },
      15_000,
      what,
    );
  } catch {
    assert.fail(`${what}: /metrics and the runs table disagree:\n${last}`);
  }
}

const startWorker = (sleepMs: number, reapIntervalMs: number) =>
  startWorkerProcess(t.db.url, {
    types: { [TYPE]: { sleepMs } },
    concurrency: 3,
    leaseTtlMs: 1500,
    reapIntervalMs,
  }).then((w) => {
    workers.push(w);
    return w;
  });

test("queue gauges follow the table: queued, claimed, worker SIGKILLed (leases expire, none reaped), reaped and drained, cancelled", async () => {
  const owner = await seedUser(t.db.sql, "killed");
  const taskId = await createTask(t.db.sql, owner, TYPE, 5, { maxAttempts: 3 });
  const queued = await agree("five runs queued, none live");
  assert.equal(queued.get(`assay_queue_depth{analysis_type="${TYPE}"}`), 5);

  // A worker whose reaper never comes round: the only reaper there is dies with it.
  const first = await startWorker(600_000, 600_000);
  await waitFor(
    async () =>
      (await t.db.sql`select 1 from test_executions`).length === 3 &&
      (await t.db.sql`select 1 from runs where analysis_type = ${TYPE} and status = 'running'`).length === 3,
  );
  const claimed = await agree("three runs claimed");
  assert.equal(claimed.get(`assay_runs_live{analysis_type="${TYPE}",status="running"}`), 3);

  first.child.kill("SIGKILL");
  await first.exited;
  // Their leases run out; nobody takes them back, so the table keeps them `running`, run by no one.
  await waitFor(
    async () =>
      (
        await t.db
          .sql`select 1 from runs where analysis_type = ${TYPE} and status = 'running' and lease_expires_at < now()`
      ).length === 3,
  );
  const orphaned = await agree("the killed worker's leases expired, not reaped");
  assert.equal(orphaned.get(`assay_runs_live{analysis_type="${TYPE}",status="running"}`), 0);
  assert.equal(orphaned.get(`assay_runs_lease_expired{analysis_type="${TYPE}"}`), 3);

  // Another worker's reaper takes them back and it drains the task.
  const second = await startWorker(20, 200);
  const task = await waitForTerminal(t.db.sql, taskId);
  assert.equal(task.status, "succeeded");
  const drained = await agree("drained");
  assert.equal(drained.get(`assay_queue_depth{analysis_type="${TYPE}"}`), 0, "a drained type reads 0");
  assert.equal(drained.get(`assay_runs_finished{analysis_type="${TYPE}",status="succeeded"}`), 5);
  second.child.kill("SIGTERM");
  assert.equal(await second.exited, 0);

  // Cancelled while queued (no worker left): gone from the depth, counted cancelled once.
  const cancelledId = await createTask(t.db.sql, owner, TYPE, 3);
  await agree("three more queued");
  const admin = await t.token("metrics-admin", "admin");
  const res = await t.app.inject({
    method: "POST",
    url: `/api/analysis-tasks/${cancelledId}/cancel`,
    headers: bearer(admin),
  });
  assert.ok(res.statusCode < 300, res.body);
  await waitForTerminal(t.db.sql, cancelledId);
  const cancelled = await agree("cancelled while queued");
  assert.equal(cancelled.get(`assay_queue_depth{analysis_type="${TYPE}"}`), 0);
  assert.equal(cancelled.get(`assay_runs_finished{analysis_type="${TYPE}",status="cancelled"}`), 3);
});
