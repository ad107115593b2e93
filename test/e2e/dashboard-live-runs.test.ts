// A task page's runs, live, in a real browser (Debian's chromium driven by playwright-core) against a
// real `assay api` process: a re-read of the runs whose answer predates an event that came while it
// was on its way must not undo that event. No worker: the test moves the runs itself, in one statement
// each, as a worker's does (the run's row, its event, the notification), so it chooses the order.
// Waits on conditions, never on time.
import assert from "node:assert/strict";
import { test } from "node:test";
import { browserSkip, dashboardSuite, uploadFile } from "../helpers/browser.ts";
import { waitFor } from "../helpers/queue.ts";

const skip = browserSkip;

const s = dashboardSuite({ ASSAY_SSE_HEARTBEAT_MS: "1000" });
const { problems } = s;

/** Sets run `runId`'s status (and error) and appends its `run.<status>` event, announced: a worker's step. */
async function runBecomes(runId: string, status: string, error: { code: string; message: string } | null) {
  // A claimed run starts from `starting` (the runs' trigger allows no other way in).
  if (status === "running") await s.env.db.sql`update runs set status = 'starting' where id = ${runId}`;
  await s.env.db.sql`
    with run as (
      update runs set status = ${status}, attempt = 1, error_code = ${error?.code ?? null},
        error_message = ${error?.message ?? null}
      where id = ${runId} returning task_id, id, attempt, error_code
    ), event as (
      insert into task_events (task_id, run_id, type, data)
      select task_id, id, ${`run.${status}`},
             jsonb_strip_nulls(jsonb_build_object('status', ${status}::text, 'attempt', attempt, 'errorCode', error_code))
      from run returning task_id, id
    )
    select pg_notify('assay_events', json_build_object('taskId', task_id::text, 'eventId', id::text)::text)
    from event`;
}

test("a run that starts while the runs are re-read shows running, not the read's older queued", {
  skip,
}, async () => {
  const ids: string[] = [];
  for (const name of ["första.csv", "second ✓.csv"])
    ids.push((await uploadFile(s.base, s.adminToken, name, "a,b\n1,2\n")).fileId);
  const res = await fetch(`${s.base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${s.adminToken}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileIds: ids }),
  });
  const taskId = ((await res.json()) as { data: { taskId: string } }).data.taskId;
  const [first, second] = (
    await s.env.db.sql<{ id: string }[]>`select id::text from runs where task_id = ${taskId} order by id`
  ).map((r) => r.id) as [string, string];

  const page = await s.signedIn(s.adminToken);
  await page.goto(`${s.base}/#/tasks/${taskId}`);
  const row = (runId: string) => page.locator(`tr[data-run="${runId}"]`);
  await row(second).locator(".badge", { hasText: "queued" }).waitFor();
  await page.locator(".task header .stream", { hasText: "live" }).waitFor();

  // The next read of the runs is answered at once and its answer held until the first run has started.
  let held = () => {};
  const heldNow = new Promise<void>((resolve) => {
    held = resolve;
  });
  let release = () => {};
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  await page.route(new RegExp(`/api/analysis-tasks/${taskId}/runs\\?`), async (route) => {
    const response = await route.fetch();
    held();
    await released;
    await route.fulfill({ response }).catch(() => {});
  });
  try {
    // The second run fails: the page reads the runs again (for its error message).
    await runBecomes(second, "failed", { code: "ANALYSIS_INPUT_INVALID", message: "no such columns: ö" });
    await heldNow;
    // Meanwhile the first starts: its event reaches the page before the read's answer.
    await runBecomes(first, "running", null);
    await row(first).locator(".badge", { hasText: "running" }).waitFor();
  } finally {
    release();
  }
  // The answer is shown (the error message comes with it only)…
  await row(second).getByText("no such columns: ö").waitFor();
  // …and the first run is still shown running: the answer is older than its event.
  assert.equal(await row(first).locator(".badge").textContent(), "running");
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("a running task's duration and its running run's count on while no event comes", { skip }, async () => {
  const fileId = (await uploadFile(s.base, s.adminToken, "quiet ✓.csv", "a,b\n1,2\n")).fileId;
  const res = await fetch(`${s.base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${s.adminToken}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileId: fileId }),
  });
  const taskId = ((await res.json()) as { data: { taskId: string } }).data.taskId;
  const [run] = await s.env.db.sql<{ id: string }[]>`select id::text from runs where task_id = ${taskId}`;
  assert.ok(run);
  // Started two seconds ago, as a program that has written no progress since (its next write a minute
  // away): nothing more reaches the page.
  await runBecomes(run.id, "running", null);
  await s.env.db.sql`update runs set started_at = now() - interval '2 s' where id = ${run.id}`;
  // (The page takes a run's start from its run.running event too.)
  await s.env.db.sql`update task_events set created_at = now() - interval '2 s' where run_id = ${run.id}`;
  await s.env.db
    .sql`update tasks set status = 'running', started_at = now() - interval '2 s' where id = ${taskId}`;

  const page = await s.signedIn(s.adminToken);
  await page.goto(`${s.base}/#/tasks/${taskId}`);
  await page.locator(`tr[data-run="${run.id}"] .badge`, { hasText: "running" }).waitFor();
  // Read once the stream is live (its going live draws the page again).
  await page.locator(".task header .stream", { hasText: "live" }).waitFor();
  const taskDuration = page.locator("dl.counts div", { hasText: "Duration" }).locator("dd");
  const runDuration = page.locator(`tr[data-run="${run.id}"] td`).nth(5);
  const first = { task: await taskDuration.textContent(), run: await runDuration.textContent() };
  assert.match(first.task ?? "", /^\d+(\.\d)? s$/);
  assert.match(first.run ?? "", /^\d+(\.\d)? s$/);
  // Until 2026-12-07 both stood still until the next event or read (none comes here, but for one
  // read early on): they must count on by two seconds and more.
  const seconds = (text: string | null) => Number(/^(\d+(?:\.\d)?) s$/.exec(text ?? "")?.[1] ?? Number.NaN);
  await waitFor(
    async () => {
      const now = {
        task: seconds(await taskDuration.textContent()),
        run: seconds(await runDuration.textContent()),
      };
      return now.task >= seconds(first.task) + 2 && now.run >= seconds(first.run) + 2 ? now : null;
    },
    15_000,
    "the durations counting on",
  );
  // Its outputs, asked for while it runs: none yet, not "did not succeed" (as until 2026-12-07).
  await page
    .locator(`tr[data-run="${run.id}"]`)
    .getByRole("button", { name: /^results of/ })
    .click();
  await page.getByText("No outputs yet: the run has not finished.").waitFor();
  await page.context().close();
  assert.deepEqual(problems, []);
});
