// The Results tab of a running task, in a real browser (Debian's chromium driven by playwright-core)
// against a real `assay api` process: results.csv is read again when the task's event stream says a
// run's status changed (it started, ended, was put back for a retry), coalesced to one read per
// POLL_MS at most, and not while no run changes (it was read every POLL_MS, a multi-MB read every few seconds per open tab for a large
// task). No worker: the test moves the runs itself, each in one statement as a worker's (the run's
// row, its event, the notification), so it chooses when runs end.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { Page } from "playwright-core";
import { browserSkip, dashboardSuite, uploadFile } from "../helpers/browser.ts";
import { idsCrossPowerOfTen } from "../helpers/queue.ts";

const skip = browserSkip;
/** web/api.js's POLL_MS: the shortest time between two reads of the table. */
const POLL_MS = 2000;

const s = dashboardSuite({ ASSAY_SSE_HEARTBEAT_MS: "1000" });
const { problems } = s;

/**
 * Sets run `runId`'s status, attempt and error and appends its event (`run.<status>`, or `type`),
 * announced: a worker's step. A run that starts goes through `starting`, as a claim's does.
 */
async function runBecomes(
  runId: string,
  status: string,
  o: { attempt?: number; error?: { code: string; message: string }; type?: string } = {},
) {
  if (status === "running") await s.env.db.sql`update runs set status = 'starting' where id = ${runId}`;
  await s.env.db.sql`
    with run as (
      update runs set status = ${status}, attempt = ${o.attempt ?? 1}, error_code = ${o.error?.code ?? null},
        error_message = ${o.error?.message ?? null}
      where id = ${runId} returning task_id, id, attempt, error_code
    ), event as (
      insert into task_events (task_id, run_id, type, data)
      select task_id, id, ${o.type ?? `run.${status}`},
             jsonb_strip_nulls(jsonb_build_object('status', ${status}::text, 'attempt', attempt, 'errorCode', error_code))
      from run returning task_id, id
    )
    select pg_notify('assay_events', json_build_object('taskId', task_id::text, 'eventId', id::text)::text)
    from event`;
}

/** Appends a progress event of run `runId`, announced, as a worker's progress flush does. */
async function runProgress(runId: string, percent: number) {
  await s.env.db.sql`
    with run as (update runs set progress = ${percent} where id = ${runId} returning task_id, id),
    event as (
      insert into task_events (task_id, run_id, type, data)
      select task_id, id, 'run.progress', jsonb_build_object('percent', ${percent}::int) from run
      returning task_id, id
    )
    select pg_notify('assay_events', json_build_object('taskId', task_id::text, 'eventId', id::text)::text)
    from event`;
}

/** Sets task `taskId`'s status and, when it is terminal, appends its closing event, announced. */
async function taskBecomes(taskId: string, status: string) {
  await s.env.db.sql`
    with task as (
      update tasks set status = ${status} where id = ${taskId} returning id
    ), event as (
      insert into task_events (task_id, run_id, type, data)
      select id, null, ${`task.${status}`}, jsonb_build_object('status', ${status}::text) from task
      where ${status} <> 'running'
      returning task_id, id
    )
    select pg_notify('assay_events', json_build_object('taskId', task_id::text, 'eventId', id::text)::text)
    from event`;
}

/** Resolves once `ms` have passed: only where the assertion is that nothing happens meanwhile. */
const quietFor = (page: Page, ms: number) => page.waitForTimeout(ms);

test("the Results tab reads results.csv again when runs change status, coalesced, and not otherwise", {
  skip,
}, async () => {
  // Run ids cross a power of ten (…99, 100…), as do the events'.
  await idsCrossPowerOfTen(s.env.db.sql, "runs", 3);
  await idsCrossPowerOfTen(s.env.db.sql, "task_events", 5);
  const names = Array.from(
    { length: 12 },
    (_, i) => `r${String(i).padStart(2, "0")} Größe <img src=x onerror=alert(1)> \u202evsc.csv`,
  );
  const fileIds: string[] = [];
  for (const name of names) fileIds.push((await uploadFile(s.base, s.adminToken, name, "a,b\n1,2\n")).fileId);
  const res = await fetch(`${s.base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${s.adminToken}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileIds: fileIds }),
  });
  assert.equal(res.status, 201, await res.clone().text());
  const taskId = ((await res.json()) as { data: { taskId: string } }).data.taskId;
  const runIds = (
    await s.env.db.sql<{ id: string }[]>`select id::text from runs where task_id = ${taskId} order by runs.id`
  ).map((r) => r.id);
  assert.equal(runIds.length, 12);
  const run = (i: number) => runIds[i] as string;
  // Two runs are going before the page is opened.
  await taskBecomes(taskId, "running");
  await runBecomes(run(0), "running");
  await runBecomes(run(1), "running");

  const page = await s.signedIn(s.adminToken);
  const reads: number[] = [];
  page.on("request", (r) => {
    if (r.url().endsWith(`/analysis-tasks/${taskId}/results.csv`)) reads.push(Date.now());
  });
  await page.goto(`${s.base}/#/tasks/${taskId}`);
  await page.locator(".task header .stream", { hasText: "live" }).waitFor();
  await page.getByRole("tab", { name: "Results" }).click();
  // A row's status cell (the third), by the row's input file.
  const status = (i: number, text: string) =>
    page
      .locator("table.results tbody tr", { hasText: `r${String(i).padStart(2, "0")} ` })
      .locator("td:nth-child(3)", { hasText: new RegExp(`^${text}$`) });
  await status(1, "running").waitFor();
  assert.equal(await page.locator("table.results tbody tr").count(), 12);

  // (a) Runs going and reporting progress, none changing status: no read for three poll periods. (A
  // fixed wait: what is asserted is that nothing happens; before, the table was read every POLL_MS.)
  const before = reads.length;
  for (const percent of [10, 40, 70]) {
    await runProgress(run(0), percent);
    await runProgress(run(1), percent);
    await quietFor(page, POLL_MS);
  }
  await quietFor(page, 500);
  assert.equal(reads.length, before, "no read while no run changes status");
  // A run that starts shows it within a few seconds.
  await runBecomes(run(2), "running");
  await status(2, "running").waitFor({ timeout: 5000 });

  // (b) A run ends: its row shows it within a few seconds; a retry shows the run queued again.
  await runBecomes(run(0), "failed", {
    error: { code: "ANALYSIS_INPUT_INVALID", message: "no such column: ö" },
  });
  await status(0, "failed").waitFor({ timeout: 5000 });
  await page.locator("table.results tbody td", { hasText: "no such column: ö" }).waitFor();
  await runBecomes(run(1), "queued", {
    type: "run.retry",
    error: { code: "ANALYSIS_PROCESS_CRASHED", message: "exit 137" },
  });
  await status(1, "queued").waitFor({ timeout: 5000 });

  // A read after an ending that fails (the network, the API restarting) keeps the table under its
  // error, and is tried again without another event.
  let blocked = true;
  await page.route(/\/results\.csv$/, (route) =>
    blocked ? route.abort("connectionrefused") : route.continue(),
  );
  await runBecomes(run(2), "succeeded");
  await page.getByRole("alert").filter({ hasText: "NETWORK" }).waitFor({ timeout: 5000 });
  await status(1, "queued").waitFor();
  blocked = false;
  await status(2, "succeeded").waitFor({ timeout: 20_000 });
  await page.getByRole("alert").waitFor({ state: "detached" });

  // Many runs ending one after another: reads at least POLL_MS apart, not one per ending. (Paced
  // 100 ms apart so that the endings reach the page in separate batches.)
  const burst = reads.length;
  for (let i = 4; i < 12; i++) {
    await runBecomes(run(i), "failed", { error: { code: "ANALYSIS_INPUT_INVALID", message: `bad ${i}` } });
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await status(11, "failed").waitFor({ timeout: 3 * POLL_MS });
  const burstReads = reads.slice(burst);
  const gaps = burstReads.slice(1).map((t, i) => t - (burstReads[i] as number));
  assert.ok(burstReads.length <= 3, `${burstReads.length} reads for 8 endings`);
  assert.ok(
    gaps.every((g) => g >= POLL_MS - 200),
    `reads ${gaps.join(", ")} ms apart`,
  );

  // (c) Every run ends, and the task: the table shows them all, and is not read again.
  await runBecomes(run(1), "failed", { error: { code: "ANALYSIS_PROCESS_CRASHED", message: "exit 137" } });
  await runBecomes(run(3), "cancelled", {
    error: { code: "ANALYSIS_PROCESS_CANCELLED", message: "cancelled before it started" },
  });
  await taskBecomes(taskId, "partially_succeeded");
  await page.locator(".task header .badge", { hasText: "partially succeeded" }).waitFor();
  await status(3, "cancelled").waitFor({ timeout: 3 * POLL_MS });
  await status(1, "failed").waitFor();
  const last = reads.length;
  // (A fixed wait, as in (a): nothing is to happen.)
  await quietFor(page, 3 * POLL_MS + 500);
  assert.equal(reads.length, last, "no read once every run has ended");
  await page.context().close();
  assert.deepEqual(problems, []);
});
