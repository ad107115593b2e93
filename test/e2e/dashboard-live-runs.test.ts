// A task page's runs, live, in a real browser (Debian's chromium driven by playwright-core) against a
// real `assay api` process: a re-read of the runs whose answer predates an event that came while it
// was on its way must not undo that event. No worker: the test moves the runs itself, in one statement
// each, as a worker's does (the run's row, its event, the notification), so it chooses the order.
// Waits on conditions, never on time.
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { after, before, test } from "node:test";
import type { Browser } from "playwright-core";
import { freePort } from "../../src/db/embedded.ts";
import {
  browserSkip,
  dashboardEnv,
  launchBrowser,
  linkToken,
  startDevApi,
  uploadFile,
  watchPage,
} from "../helpers/browser.ts";
import { type RunnerEnv, runnerEnv } from "../helpers/runner.ts";

const skip = browserSkip;

let env: RunnerEnv;
let base: string;
let adminToken: string;
let api: { child: ChildProcess; done: Promise<unknown> } | undefined;
let browser: Browser;
const problems: string[] = [];

before(async () => {
  if (skip) return;
  env = await runnerEnv();
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  const started = await startDevApi(dashboardEnv(env, port, { ASSAY_SSE_HEARTBEAT_MS: "1000" }));
  api = { child: started.child, done: started.done };
  adminToken = linkToken(started.link);
  browser = await launchBrowser();
});

after(async () => {
  if (skip) return;
  await browser?.close();
  api?.child.kill("SIGTERM");
  await api?.done;
  await env.close();
});

/** Sets run `runId`'s status (and error) and appends its `run.<status>` event, announced: a worker's step. */
async function runBecomes(runId: string, status: string, error: { code: string; message: string } | null) {
  // A claimed run starts from `starting` (the runs' trigger allows no other way in).
  if (status === "running") await env.db.sql`update runs set status = 'starting' where id = ${runId}`;
  await env.db.sql`
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
    ids.push((await uploadFile(base, adminToken, name, "a,b\n1,2\n")).fileId);
  const res = await fetch(`${base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileIds: ids }),
  });
  const taskId = ((await res.json()) as { data: { taskId: string } }).data.taskId;
  const [first, second] = (
    await env.db.sql<{ id: string }[]>`select id::text from runs where task_id = ${taskId} order by id`
  ).map((r) => r.id) as [string, string];

  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await ctx.newPage();
  watchPage(page, problems);
  await page.goto(`${base}/#token=${encodeURIComponent(adminToken)}`);
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  await page.goto(`${base}/#/tasks/${taskId}`);
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
  await ctx.close();
  assert.deepEqual(problems, []);
});
