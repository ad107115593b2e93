// The dashboard in a real browser: Debian's chromium driven by playwright-core (never a browser
// download), against real `assay api` and `assay worker` processes running the real programs. Each test
// saves a screenshot of its final screen under test-results/dashboard/ (not committed) to look at.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import type { Page } from "playwright-core";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { browserSkip, dashboardSuite, watchPage } from "../helpers/browser.ts";
import { ROOT } from "../helpers/cli.ts";
import { tableEvents, waitFor, waitForTerminal } from "../helpers/queue.ts";
import { zipNames } from "../helpers/zip.ts";

const skip = browserSkip;
const SHOTS = path.join(ROOT, "test-results", "dashboard");
const HOSTILE = "<img src=x onerror=alert(1)>.csv";
/** The test server's upload limit: above every CSV the tests make, below the one meant to be refused. */
const MAX_UPLOAD = 30 * 1024 * 1024;

let page: Page;
const s = dashboardSuite(
  {
    ASSAY_POLL_INTERVAL_MS: "200",
    ASSAY_SSE_HEARTBEAT_MS: "1000",
    ASSAY_SHUTDOWN_GRACE_MS: "2000",
    ASSAY_MAX_UPLOAD_BYTES: String(MAX_UPLOAD),
  },
  {
    worker: true,
    // One page for the whole file: a test goes on where the one before it left off.
    setup: async () => {
      const context = await s.browser.newContext({
        viewport: { width: 1280, height: 900 },
        acceptDownloads: true,
      });
      page = await context.newPage();
      watchPage(page, problems);
    },
  },
);
/** Problems the page reported: script errors, CSP violations, dialogs (an injected alert). */
const { problems } = s;

async function shot(name: string): Promise<void> {
  fs.mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });
}

function csv(rows: number, seed: number): string {
  const lines = ["id,value,weight,label"];
  for (let i = 0; i < rows; i++) lines.push(`${i},${(i * seed) % 97},${(i % 13) + seed / 10},row ${i}`);
  return `${lines.join("\n")}\n`;
}

/** Files on disk for the browser's file picker. */
function localFiles(names: string[], rows = 200): string[] {
  const dir = fs.mkdtempSync(path.join(s.env.dataDir, "picked-"));
  return names.map((name, i) => {
    const file = path.join(dir, name);
    fs.writeFileSync(file, csv(rows, i + 3));
    return file;
  });
}

const taskIdFromUrl = () => /#\/tasks\/(\d+)/.exec(page.url())?.[1] as string;

test("sign in through the fragment link: the token leaves the address bar and never reaches the server", {
  skip,
}, async () => {
  assert.match(s.link, /^http:\/\/127\.0\.0\.1:\d+\/#token=assay_/);
  await page.goto(s.link);
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "New task" }).waitFor();
  assert.equal(new URL(page.url()).hash, "#/", "the token is removed from the address bar");
  assert.ok(!page.url().includes("token"));
  // Served with a strict policy: scripts from this origin only.
  const res = await page.request.get(`${s.base}/`);
  assert.match(res.headers()["content-security-policy"] ?? "", /script-src 'self'(;|$)/);
  assert.doesNotMatch(await res.text(), /<script(?![^>]*\bsrc=)/, "no inline script");
  // Sign out, then in again by pasting the token.
  const token = s.adminToken;
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByLabel("API token").fill("assay_not-a-real-token");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByText("That token is not valid").waitFor();
  await page.getByLabel("API token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  await shot("sign-in");
  assert.deepEqual(problems, []);
});

test("upload three CSVs (one with a hostile name), submit python-stats, every run reaches 100 % live", {
  skip,
}, async () => {
  await page.goto(`${s.base}/#/new`);
  await page.evaluate("window.loadedOnce = true");
  await page.getByRole("radio", { name: /^python-stats/ }).check();
  await page.getByLabel("method").selectOption("mean");
  const files = localFiles(["alpha.csv", "données β.csv", HOSTILE], 3000);
  await page.locator('input[type="file"]').setInputFiles(files);
  await page.getByRole("button", { name: /Start python-stats over 3 files/ }).click();
  await page.waitForURL(/#\/tasks\/\d+$/);
  const taskId = taskIdFromUrl();
  await page.locator(".task header .badge", { hasText: "succeeded" }).waitFor({ timeout: 60_000 });
  const rows = page.locator("tr[data-run]");
  assert.equal(await rows.count(), 3);
  for (let i = 0; i < 3; i++) {
    assert.equal(await rows.nth(i).getByRole("progressbar").getAttribute("aria-valuenow"), "100");
  }
  // Never reloaded: the marker set before submitting is still there.
  assert.equal(await page.evaluate("window.loadedOnce === true"), true);
  // The hostile name is text: shown verbatim, no element made of it, no alert.
  assert.deepEqual(
    (await page.locator("tr[data-run] td.name").allTextContents()).sort(),
    ["alpha.csv", "données β.csv", HOSTILE].sort(),
  );
  assert.equal(await page.locator('img[src="x"]').count(), 0);
  assert.equal((await s.env.db.sql`select status from tasks where id = ${taskId}`)[0]?.status, "succeeded");
  await shot("task-succeeded");
  assert.deepEqual(problems, []);
});

test("a run's outputs: metrics, the CSV previewed; the fan-in results table; the zip with results.csv", {
  skip,
}, async () => {
  const row = page.locator("tr[data-run]", { hasText: "alpha.csv" });
  await row.getByRole("button", { name: "results" }).click();
  // The first previewable output opens by itself; the button toggles it.
  const statsButton = page.getByRole("button", { name: "stats.csv", exact: true });
  if ((await statsButton.getAttribute("aria-pressed")) !== "true") await statsButton.click();
  const preview = page.getByRole("table", { name: "Preview of stats.csv" });
  await preview.waitFor();
  assert.ok((await preview.locator("tbody tr").count()) >= 1);
  assert.match((await preview.locator("thead").textContent()) ?? "", /column|mean/i);
  // The fan-in result: a row per input file.
  await page.getByRole("tab", { name: "Results" }).click();
  const results = page.locator("table.results");
  await results.waitFor();
  assert.equal(await results.locator("tbody tr").count(), 3);
  assert.match((await results.textContent()) ?? "", /données β\.csv/);
  // Download all: a zip with a folder per input file and results.csv at its root.
  const [download] = await Promise.all([
    page.waitForEvent("download"),
    page.getByRole("button", { name: /Download all/ }).click(),
  ]);
  // Saved under the name the API gives it.
  assert.equal(download.suggestedFilename(), `task-${taskIdFromUrl()}.zip`);
  const zipFile = await download.path();
  const names = zipNames(fs.readFileSync(zipFile));
  assert.ok(names.includes("results.csv"), names.join(", "));
  assert.ok(
    names.some((n) => n.startsWith("alpha.csv/")),
    names.join(", "),
  );
  await shot("results");
  assert.deepEqual(problems, []);
});

test("a file over the upload limit gets a clear error; the others upload and can be submitted", {
  skip,
}, async () => {
  await page.goto(`${s.base}/#/new`);
  const [small] = localFiles(["small.csv"], 100);
  const big = path.join(path.dirname(small as string), "too-big.csv");
  fs.writeFileSync(big, Buffer.alloc(MAX_UPLOAD + 1024 * 1024, "1,2,3\n"));
  await page.locator('input[type="file"]').setInputFiles([small as string, big]);
  const failed = page.locator("li.upload.failed", { hasText: "too-big.csv" });
  await failed.getByText(/too-big\.csv is too large/).waitFor({ timeout: 30_000 });
  await page.locator("li.upload.done", { hasText: "small.csv" }).waitFor();
  await page.getByRole("button", { name: /Start \S+ over 1 file$/ }).waitFor();
  await shot("upload-too-large");
  // Removed again, the form is back to no files.
  await page.getByRole("button", { name: "Remove too-big.csv" }).click();
  await page.getByRole("button", { name: "Remove small.csv" }).click();
  assert.equal(await page.locator("li.upload").count(), 0);
  assert.deepEqual(problems, []);
});

test("r-report's HTML report shows in a sandboxed frame", { skip }, async () => {
  await page.goto(`${s.base}/#/new`);
  await page.getByRole("radio", { name: /^r-report/ }).check();
  await page.getByLabel("title").fill("Quarterly <b>numbers</b>");
  await page.locator('input[type="file"]').setInputFiles(localFiles(["report-input.csv"], 500));
  await page.getByRole("button", { name: /Start r-report over 1 file/ }).click();
  await page.waitForURL(/#\/tasks\/\d+$/);
  await page.locator(".task header .badge", { hasText: "succeeded" }).waitFor({ timeout: 60_000 });
  await page.locator("tr[data-run]").getByRole("button", { name: "results" }).click();
  const frame = page.locator("iframe.report");
  await frame.waitFor();
  assert.equal(await frame.getAttribute("sandbox"), "", "no script, opaque origin");
  const inner = page.frameLocator("iframe.report");
  await inner.locator("body").waitFor();
  assert.match((await inner.locator("body").textContent()) ?? "", /Quarterly <b>numbers<\/b>/);
  // The report's own stylesheet applies (a blob: frame inherited the dashboard's policy, which blocked it).
  assert.equal(
    await inner
      .locator("body")
      .evaluate(
        (el) =>
          (globalThis as unknown as { getComputedStyle(e: unknown): { marginTop: string } }).getComputedStyle(
            el,
          ).marginTop,
      ),
    "32px",
  );
  await waitFor(
    async () =>
      (await inner.locator("img").evaluate((el) => {
        const img = el as unknown as { complete: boolean; naturalWidth: number };
        return img.complete && img.naturalWidth > 0;
      })) === true,
    10_000,
    "the report's histograms to show",
  );
  await shot("r-report");
  assert.deepEqual(problems, []);
});

test("cancel a long task from its page and see it cancelled", { skip }, async () => {
  // Six files, two slots: at least two rounds of runs, so some are still queued when the cancel lands
  // even when a run or two finish first (a loaded machine can be that slow to click).
  const files = localFiles(
    ["slow-1.csv", "slow-2.csv", "slow-3.csv", "slow-4.csv", "slow-5.csv", "slow-6.csv"],
    600_000,
  );
  await page.goto(`${s.base}/#/new`);
  // python-stats' median: ~5 s a run over 600,000 rows here, against summary's 0.5 s, which a quiet
  // machine finished, all six, before the page showed one under way (CI waited 30 s for it once).
  await page.getByRole("radio", { name: /^python-stats/ }).check();
  await page.getByLabel("method").selectOption("median");
  await page.locator('input[type="file"]').setInputFiles(files);
  await page.getByRole("button", { name: /Start python-stats over 6 files/ }).click();
  await page.waitForURL(/#\/tasks\/\d+$/);
  const taskId = taskIdFromUrl();
  // A run under way: "starting" or "running" (a run's running is recorded with its first progress
  // flush).
  await page
    .locator("tr[data-run] .badge", { hasText: /^(starting|running)$/ })
    .first()
    .waitFor({ timeout: 30_000 });
  await page.getByRole("button", { name: "Cancel task" }).click();
  await page.getByRole("status").filter({ hasText: "Cancel requested" }).waitFor();
  await page.locator(".task header .badge", { hasText: "cancelled" }).waitFor({ timeout: 30_000 });
  assert.equal(await page.getByRole("button", { name: "Cancel task" }).count(), 0);
  assert.equal((await s.env.db.sql`select status from tasks where id = ${taskId}`)[0]?.status, "cancelled");
  // Every run shows its ending as the database has it, the ones that never started too (they have
  // no event of their own: the task.cancelling event counts them, and the page shows that count in
  // its log). A run whose program finished before the cancel reached it keeps its success: the
  // database decides which, so the page is checked against it, run by run.
  const ended = await s.env.db.sql<{ id: string; status: string; attempt: number }[]>`
    select id, status, attempt from runs where task_id = ${taskId} order by id`;
  assert.equal(ended.length, 6);
  for (const r of ended) {
    assert.ok(["cancelled", "succeeded"].includes(r.status), `run ${r.id} ended ${r.status}`);
    if (r.attempt === 0) assert.equal(r.status, "cancelled", `run ${r.id} never started`);
  }
  const want = ended.map((r) => `${r.id}:${r.status}`).join(" ");
  const shown = async () =>
    (
      await page
        .locator("tr[data-run]")
        .evaluateAll((rows) =>
          rows.map(
            (row) =>
              `${(row as unknown as { dataset: { run: string } }).dataset.run}:${
                (row as unknown as { querySelector(s: string): { textContent: string } | null })
                  .querySelector(".badge")
                  ?.textContent.trim() ?? ""
              }`,
          ),
        )
    ).join(" ");
  await waitFor(
    async () => ((await shown()) === want ? true : undefined),
    10_000,
    "every run to show its ending",
  ).catch(async (err) => {
    assert.equal(await shown(), want, String(err));
  });
  const [ev] = await s.env.db.sql<{ n: number }[]>`
    select (data->>'cancelledQueued')::int as n from task_events where task_id = ${taskId} and type = 'task.cancelling'`;
  // Two slots, six runs: some were still queued.
  assert.ok((ev?.n ?? 0) > 0, "the cancel ended queued runs");
  await page.getByRole("tab", { name: "Event log" }).click();
  await page
    .getByText(`${ev?.n} queued ${ev?.n === 1 ? "run" : "runs"} cancelled`)
    .waitFor({ timeout: 10_000 });
  await shot("cancelled");
  assert.deepEqual(problems, []);
});

test("the API restarts mid-task: the page resumes, its event log has every event once, in order", {
  skip,
}, async () => {
  const files = localFiles(["r-1.csv", "r-2.csv", "r-3.csv", "r-4.csv", "r-5.csv", "r-6.csv"], 150_000);
  await page.goto(`${s.base}/#/new`);
  await page.getByRole("radio", { name: /^summary/ }).check();
  await page.locator('input[type="file"]').setInputFiles(files);
  // The worker is paused until the page is cut off, so the task is still queued when the API goes
  // away and its runs produce events while the page cannot hear them (caught up by Last-Event-ID) as
  // well as after it is back (live).
  s.worker?.kill("SIGSTOP");
  await page.getByRole("button", { name: /Start summary over 6 files/ }).click();
  await page.waitForURL(/#\/tasks\/\d+$/);
  const taskId = taskIdFromUrl();
  // Queued while the worker is paused: the page says where it stands, as an estimate.
  await page.locator(".queue-place", { hasText: /runs? ahead \(estimate\)/ }).waitFor();
  await page.getByRole("tab", { name: "Event log" }).click();
  await page.locator("li[data-event]").first().waitFor();
  await s.stopApi();
  await page.locator(".stream", { hasText: "reconnecting" }).waitFor({ timeout: 15_000 });
  s.worker?.kill("SIGCONT");
  await waitFor(
    async () =>
      ((await s.env.db.sql`select succeeded_count from tasks where id = ${taskId}`)[0]?.succeeded_count ??
        0) > 0,
    60_000,
    "a run to succeed while the API is down",
  );
  await s.startApi();
  await waitForTerminal(s.env.db.sql, taskId, 120_000);
  await page.locator(".task header .badge", { hasText: "succeeded" }).waitFor({ timeout: 30_000 });
  const expected = (await tableEvents(s.env.db.sql, taskId)).map(([id]) => id);
  await waitFor(
    async () => (await page.locator("li[data-event]").count()) >= expected.length,
    15_000,
    "the log to show every event",
  );
  const shown = await page
    .locator("li[data-event]")
    .evaluateAll((els) => els.map((e) => e.getAttribute("data-event")));
  assert.deepEqual(shown, expected, "every event once, in order, across the restart");
  await shot("restart-resumed");
  assert.deepEqual(problems, []);
});

test("another user's task is not reachable by URL; at 375 px the task list still reads", {
  skip,
}, async () => {
  const [task] = await s.env.db.sql<
    { id: string }[]
  >`select t.id::text as id from tasks t order by t.id limit 1`;
  const { token } = await tokenCreate(s.env.db.sql, "mallory", "user");
  const other = await s.browser.newContext({ viewport: { width: 375, height: 740 } });
  const p = await other.newPage();
  p.on("pageerror", (err) => problems.push(`page error: ${err.message}`));
  await p.goto(`${s.base}/#token=${encodeURIComponent(token)}`);
  await p.getByRole("heading", { name: "Tasks" }).waitFor();
  await p.getByText("No tasks yet").waitFor();
  await p.goto(`${s.base}/#/tasks/${task?.id}`);
  await p.getByRole("heading", { name: "Task not found" }).waitFor();
  // The task list of the admin at phone width: no horizontal overflow of the page itself.
  await page.setViewportSize({ width: 375, height: 740 });
  await page.goto(`${s.base}/#/`);
  await page.locator("tr[data-task]").first().waitFor();
  const overflow = await page.evaluate<number>("document.documentElement.scrollWidth - window.innerWidth");
  assert.ok(overflow <= 1, `the page scrolls sideways by ${overflow}px`);
  await shot("narrow-task-list");
  await p.screenshot({ path: path.join(SHOTS, "foreign-task.png") });
  await other.close();
  assert.deepEqual(problems, []);
});
