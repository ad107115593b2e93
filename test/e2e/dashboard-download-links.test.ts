// The dashboard's downloads in a real browser (Debian's chromium driven by playwright-core, real
// `assay api` and `assay worker` processes running the real summary program): every download button
// saves through a fresh download link the browser fetches itself, streamed to disk — never a file read
// into the page with fetch and saved from a blob: URL — and arrives whole, under the API's name. An
// error note left by a failed cancel or download goes with the next action that succeeds. Waits on
// conditions, never on time.
import assert from "node:assert/strict";
import fs from "node:fs";
import { beforeEach, test } from "node:test";
import type { Page } from "playwright-core";
import { browserSkip, dashboardSuite, uploadFile } from "../helpers/browser.ts";
import { waitForTerminal } from "../helpers/queue.ts";
import { zipNames, zipRead } from "../helpers/zip.ts";

const skip = browserSkip;

const s = dashboardSuite({ ASSAY_POLL_INTERVAL_MS: "200" }, { worker: true });
const { problems } = s;
/** Requests the pages made, as `METHOD path`. */
const requests: string[] = [];

beforeEach(() => {
  requests.length = 0;
});

/** GET `p` of the API with the token, as bytes and Content-Disposition. */
async function apiGet(p: string): Promise<{ body: Buffer; disposition: string | null }> {
  const res = await fetch(`${s.base}/api${p}`, { headers: { authorization: `Bearer ${s.adminToken}` } });
  assert.equal(res.status, 200, p);
  return { body: Buffer.from(await res.arrayBuffer()), disposition: res.headers.get("content-disposition") };
}

/** A summary task over `names` (CSV files of a few rows each), finished unless not `finished`; its id. */
async function summaryTask(names: string[], finished = true): Promise<string> {
  const ids: string[] = [];
  for (const [i, name] of names.entries())
    ids.push((await uploadFile(s.base, s.adminToken, name, `a,b\n${i},2\n3,${i}\n`)).fileId);
  const res = await fetch(`${s.base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${s.adminToken}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileIds: ids }),
  });
  assert.equal(res.status, 201);
  const taskId = ((await res.json()) as { data: { taskId: string } }).data.taskId;
  if (finished) await waitForTerminal(s.env.db.sql, taskId, 60_000);
  return taskId;
}

async function taskPage(taskId: string, status = "succeeded"): Promise<Page> {
  const ctx = await s.browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  ctx.on("request", (r) => requests.push(`${r.method()} ${new URL(r.url()).pathname}`));
  const page = await s.signedIn(s.adminToken, ctx);
  await page.goto(`${s.base}/#/tasks/${taskId}`);
  await page.locator(".task header .badge", { hasText: status }).waitFor({ timeout: 30_000 });
  return page;
}

/** What `click` saves: the browser's download, its URL's path, name and bytes. */
async function saved(page: Page, click: () => Promise<void>) {
  const [download] = await Promise.all([page.waitForEvent("download"), click()]);
  assert.equal(await download.failure(), null);
  return {
    path: new URL(download.url()).pathname,
    name: download.suggestedFilename(),
    body: fs.readFileSync(await download.path()),
  };
}

test("every download button saves through a download link, streamed by the browser, whole and under the API's name", {
  skip,
}, async () => {
  const taskId = await summaryTask(["données α.csv", "b.csv", "<img src=x>.csv"]);
  const page = await taskPage(taskId);
  // Download all: the task's zip.
  const zip = await saved(page, () => page.getByRole("button", { name: "Download all (zip)" }).click());
  assert.match(
    zip.path,
    new RegExp(`^/view/download/\\d+\\.task\\.${taskId}\\.\\d+\\.[\\w-]{43}/task-${taskId}\\.zip$`),
  );
  assert.equal(zip.name, `task-${taskId}.zip`);
  const fromApi = await apiGet(`/analysis-tasks/${taskId}/download`);
  const names = zipNames(zip.body);
  assert.deepEqual(names, zipNames(fromApi.body));
  for (const n of names) assert.deepEqual(zipRead(zip.body, n), zipRead(fromApi.body, n), n);
  assert.ok(
    names.some((n) => n.startsWith("données α.csv/")),
    names.join(", "),
  );
  // A run's download: its output, under the output's name.
  const row = page.locator("tr[data-run]", { hasText: "données α.csv" });
  const runId = (await row.getAttribute("data-run")) as string;
  const run = await saved(page, () => row.getByRole("button", { name: "download" }).click());
  assert.match(run.path, /^\/view\/download\/\d+\.run\./);
  assert.equal(run.name, "summary.json");
  assert.deepEqual(run.body, (await apiGet(`/analysis-tasks/${taskId}/runs/${runId}/download`)).body);
  // One output of the run, from its outputs list.
  await row.getByRole("button", { name: "results" }).click();
  const output = await saved(page, () => page.getByRole("button", { name: "Download summary.json" }).click());
  assert.match(output.path, /^\/view\/download\/\d+\.output\..*\/summary\.json$/);
  assert.equal(output.name, "summary.json");
  assert.deepEqual(output.body, run.body);
  // The results table.
  await page.getByRole("tab", { name: "Results" }).click();
  await page.locator("table.results").waitFor();
  const csv = await saved(page, () => page.getByRole("button", { name: "Download results.csv" }).click());
  assert.match(csv.path, /^\/view\/download\/\d+\.results\./);
  assert.equal(csv.name, `task-${taskId}-results.csv`);
  assert.deepEqual(csv.body, (await apiGet(`/analysis-tasks/${taskId}/results.csv`)).body);
  // Nothing saved was read into the page: no GET of a download route with the token (an output and
  // the results table are read, for their preview and the table shown).
  const read = requests.filter((r) => /^GET \/api\/.*\/download$/.test(r));
  assert.deepEqual(read, []);
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("the note of a failed cancel or download goes with the next action that succeeds", {
  skip,
}, async () => {
  const taskId = await summaryTask(["one.csv"]);
  const page = await taskPage(taskId);
  const note = page.locator("section.task > p.error");
  // The request of a download (its link's, or the download itself).
  const downloadRequest = /\/api\/analysis-tasks\/\d+(\/runs\/\d+)?\/download(\/link)?$/;
  // The connection drops under the link's request: the download fails, and says why.
  await page.route(downloadRequest, (route) => route.abort("connectionreset"));
  await page.getByRole("button", { name: "Download all" }).click();
  await note.filter({ hasText: "could not be reached" }).waitFor();
  await page.unroute(downloadRequest);
  // The next download succeeds: the note is gone.
  const all = await saved(page, () => page.getByRole("button", { name: "Download all" }).click());
  assert.equal(all.name, "summary.json");
  await note.waitFor({ state: "detached" });
  // A run's download after a failed one, likewise.
  await page.route(downloadRequest, (route) => route.abort("connectionreset"));
  const row = page.locator("tr[data-run]", { hasText: "one.csv" });
  await row.getByRole("button", { name: "download" }).click();
  await note.filter({ hasText: "could not be reached" }).waitFor();
  await page.unroute(downloadRequest);
  await saved(page, () => row.getByRole("button", { name: "download" }).click());
  await note.waitFor({ state: "detached" });
  await page.context().close();
  // A cancel whose request is lost, then one that goes through.
  s.worker?.kill("SIGSTOP");
  try {
    const queued = await summaryTask(["two.csv"], false);
    const other = await taskPage(queued, "queued");
    const otherNote = other.locator("section.task > p.error");
    await other.route("**/cancel", (route) => route.abort("connectionreset"));
    await other.getByRole("button", { name: "Cancel task" }).click();
    await otherNote.filter({ hasText: "could not be reached" }).waitFor();
    await other.unroute("**/cancel");
    await other.getByRole("button", { name: "Cancel task" }).click();
    await other.getByRole("status").filter({ hasText: "Cancel requested" }).waitFor();
    await otherNote.waitFor({ state: "detached" });
    await other.context().close();
  } finally {
    s.worker?.kill("SIGCONT");
  }
  assert.deepEqual(problems, []);
});
