// The dashboard's task page in a real browser, set up as dashboard.test.ts is (Debian's chromium driven
// by playwright-core, real `assay api` and `assay worker` processes): download names, a queued task's
// place in the queue, a slow runs answer, events while animation frames are paused. Each test opens its
// own browser context, signed in as the user it needs, and waits on conditions, never on time.
import assert from "node:assert/strict";
import fs from "node:fs";
import { test } from "node:test";
import type { Page } from "playwright-core";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { browserSkip, dashboardSuite, uploadFile } from "../helpers/browser.ts";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";

const skip = browserSkip;

const s = dashboardSuite(
  { ASSAY_POLL_INTERVAL_MS: "200", ASSAY_SSE_HEARTBEAT_MS: "1000", ASSAY_SHUTDOWN_GRACE_MS: "2000" },
  { worker: true },
);
const { problems } = s;

/** Runs `body` with the worker paused: tasks stay queued, and no run produces an event. */
async function workerPaused<T>(body: () => Promise<T>): Promise<T> {
  s.worker?.kill("SIGSTOP");
  try {
    return await body();
  } finally {
    s.worker?.kill("SIGCONT");
  }
}

async function call(
  token: string,
  method: string,
  p: string,
  body?: unknown,
): Promise<Record<string, unknown>> {
  const res = await fetch(`${s.base}/api${p}`, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body ? { "content-type": "application/json" } : {}) },
    ...(body ? { body: JSON.stringify(body) } : {}),
  });
  assert.ok(res.ok, `${method} ${p}: ${res.status}`);
  return ((await res.json()) as { data: Record<string, unknown> }).data;
}

const upload = async (token: string, name: string, content: string) =>
  (await uploadFile(s.base, token, name, content)).fileId;

/** A summary task over `n` small files of `token`'s; returns its id. */
async function summaryTask(token: string, n: number, extra: Record<string, unknown> = {}): Promise<string> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) ids.push(await upload(token, `in-${i}.csv`, `a,b\n${i},2\n3,${i}\n`));
  const task = await call(token, "POST", "/analysis-tasks", {
    analysisType: "summary",
    inputFileIds: ids,
    ...extra,
  });
  return task.taskId as string;
}

/** A page in a context of its own, signed in with `token`; `init` runs before the page's own scripts. */
async function pageFor(token: string, init?: string): Promise<Page> {
  const ctx = await s.browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  if (init) await ctx.addInitScript(init);
  return s.signedIn(token, ctx);
}

async function saved(page: Page, click: () => Promise<void>): Promise<{ name: string; body: Buffer }> {
  const [download] = await Promise.all([page.waitForEvent("download"), click()]);
  return { name: download.suggestedFilename(), body: fs.readFileSync(await download.path()) };
}

test("downloads are saved under the API's names: a run's output, a one-file task's output, a task's zip", {
  skip,
}, async () => {
  const one = await summaryTask(s.adminToken, 1);
  const three = await summaryTask(s.adminToken, 3);
  await waitForTerminal(s.env.db.sql, one, 60_000);
  await waitForTerminal(s.env.db.sql, three, 60_000);
  const page = await pageFor(s.adminToken);
  await page.goto(`${s.base}/#/tasks/${one}`);
  await page.locator(".task header .badge", { hasText: "succeeded" }).waitFor({ timeout: 30_000 });
  // The run's output is summary.json: saved as that, not under the input's name (in-0.csv).
  const run = await saved(page, () =>
    page.locator("tr[data-run]").getByRole("button", { name: "download" }).click(),
  );
  assert.equal(run.name, "summary.json");
  assert.equal(JSON.parse(run.body.toString()).rows, 2);
  // A one-file task's download is that file itself.
  const all = await saved(page, () => page.getByRole("button", { name: /Download all/ }).click());
  assert.equal(all.name, "summary.json");
  assert.deepEqual(all.body, run.body);
  // Several files: a zip, saved as one.
  await page.goto(`${s.base}/#/tasks/${three}`);
  await page.locator(".task header .badge", { hasText: "succeeded" }).waitFor({ timeout: 30_000 });
  const zip = await saved(page, () => page.getByRole("button", { name: /Download all \(zip\)/ }).click());
  assert.equal(zip.name, `task-${three}.zip`);
  assert.equal(zip.body.subarray(0, 4).toString("latin1"), "PK\x03\x04");
  const second = await saved(page, () =>
    page.locator("tr[data-run]", { hasText: "in-1.csv" }).getByRole("button", { name: "download" }).click(),
  );
  assert.equal(second.name, "summary.json");
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("a queued task's page re-reads its place in the queue while it waits", { skip }, async () => {
  await workerPaused(async () => {
    const { token: alice } = await tokenCreate(s.env.db.sql, "alice", "user");
    // Five runs of a higher priority go first.
    const first = await summaryTask(s.adminToken, 5, { priority: 0 });
    const mine = await summaryTask(alice, 1);
    const page = await pageFor(alice);
    // The page reads the task when it opens, and again after the stream's first event (task.queued):
    // the cancel below comes after both, so only a later read can show it.
    let reads = 0;
    const taskUrl = new RegExp(`/api/analysis-tasks/${mine}$`);
    page.on("requestfinished", (r) => {
      if (taskUrl.test(r.url())) reads++;
    });
    await page.goto(`${s.base}/#/tasks/${mine}`);
    const place = page.locator(".counts .queue-place");
    await place.filter({ hasText: "≈ 5 runs ahead (estimate)" }).waitFor();
    await waitFor(async () => reads >= 2, 10_000, "the page's first two reads of the task");
    assert.match((await place.textContent()) ?? "", /≈ 5 runs ahead/);
    // They are cancelled: nothing is ahead any more, and the page says so without an event of its own.
    await call(s.adminToken, "POST", `/analysis-tasks/${first}/cancel`);
    await place.filter({ hasText: "≈ 0 runs ahead (estimate)" }).waitFor({ timeout: 15_000 });
    assert.equal(await page.locator(".task header .badge").textContent(), "queued");
    await page.context().close();
  });
  assert.deepEqual(problems, []);
});

test("a queued task no live worker can run says it waits for a worker, not a place in the queue", {
  skip,
}, async () => {
  await workerPaused(async () => {
    // The paused worker's heartbeat made stale: no live worker (it said "≈ 0 runs ahead").
    await s.env.db.sql`update workers set heartbeat_at = now() - interval '1 day'`;
    const { token: carol } = await tokenCreate(s.env.db.sql, "carol", "user");
    const mine = await summaryTask(carol, 1);
    const page = await pageFor(carol);
    await page.goto(`${s.base}/#/tasks/${mine}`);
    const place = page.locator(".counts .queue-place");
    await place.filter({ hasText: "waiting for a worker" }).waitFor();
    assert.match(
      (await place.locator(".queue-why").textContent()) ?? "",
      /^No live worker can run this analysis type now \(no worker is running\); the task fails with ANALYSIS_WORKER_UNAVAILABLE if none comes in time\.$/,
    );
    assert.doesNotMatch((await place.textContent()) ?? "", /runs? ahead/);
    await page.context().close();
  });
  assert.deepEqual(problems, []);
});

// Every fetch of the page, listed in `window.settled` by URL once the page has handled its answer (or
// its failure): marked from a timer set when the body is parsed, so after the promise callbacks and the
// render they cause, which all run before any timer.
const MARK_SETTLED = `(() => {
  const real = window.fetch.bind(window);
  window.settled = [];
  window.fetch = (input, init) => {
    const url = String(input);
    const mark = () => setTimeout(() => window.settled.push(url));
    return real(input, init).then(
      (res) => {
        const json = res.json.bind(res);
        res.json = () => json().finally(mark);
        return res;
      },
      (err) => {
        mark();
        throw err;
      },
    );
  };
})();`;

test("a slow runs answer for a filter left since does not replace the current filter's runs", {
  skip,
}, async () => {
  await workerPaused(async () => {
    // Queued, and the worker paused: no run event, so no re-read of the runs but the test's own.
    const taskId = await summaryTask(s.adminToken, 3);
    const page = await pageFor(s.adminToken, MARK_SETTLED);
    // The first (unfiltered) runs page is held until the filter chosen since has been answered.
    const unfiltered = /\/runs\?limit=100$/;
    let held = () => {};
    const heldNow = new Promise<void>((resolve) => {
      held = resolve;
    });
    let release = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let first = true;
    await page.route(unfiltered, async (route) => {
      if (first) {
        first = false;
        held();
        await released;
      }
      // Fails when the page has given the request up meanwhile.
      await route.continue().catch(() => {});
    });
    try {
      await page.goto(`${s.base}/#/tasks/${taskId}`);
      await heldNow;
      await page.getByLabel("Run status").selectOption("succeeded");
      await page.locator("table.runs").waitFor();
      assert.equal(await page.locator("tr[data-run]").count(), 0, "no run has succeeded");
    } finally {
      release();
    }
    await page.waitForFunction(
      (source) =>
        (globalThis as unknown as { settled: string[] }).settled.some((url) => new RegExp(source).test(url)),
      unfiltered.source,
    );
    assert.equal(await page.getByLabel("Run status").inputValue(), "succeeded");
    assert.equal(await page.locator("tr[data-run]").count(), 0, "the unfiltered answer came too late");
    // The filter chosen back: all three, queued.
    await page.getByLabel("Run status").selectOption("");
    await page.locator("tr[data-run]").nth(2).waitFor();
    assert.deepEqual(await page.locator("tr[data-run] .badge").allTextContents(), [
      "queued",
      "queued",
      "queued",
    ]);
    await page.context().close();
  });
  assert.deepEqual(problems, []);
});

test("events are applied while animation frames are paused (a hidden tab), and leaving drops them", {
  skip,
}, async () => {
  await workerPaused(async () => {
    const taskId = await summaryTask(s.adminToken, 1);
    const [run] = await s.env.db.sql<{ id: string }[]>`select id::text from runs where task_id = ${taskId}`;
    const EVENTS = 100_000;
    await s.env.db.sql`insert into task_events (task_id, run_id, type, data)
      select ${taskId}, ${run?.id ?? null}, 'run.progress',
             jsonb_build_object('percent', g % 100, 'message', 'step ' || g || ' ' || repeat('x', 100))
      from generate_series(1, ${EVENTS}) g`;
    const [last] = await s.env.db.sql<{ id: string }[]>`
      select max(id)::text as id from task_events where task_id = ${taskId}`;
    // A hidden tab: the browser runs no animation frame, while the stream keeps reading.
    const page = await pageFor(s.adminToken, "window.requestAnimationFrame = () => 1;");
    const cdp = await page.context().newCDPSession(page);
    const heap = async () => {
      await cdp.send("HeapProfiler.collectGarbage");
      return (await cdp.send("Runtime.getHeapUsage")).usedSize / 1048576;
    };
    const before = await heap();
    await page.goto(`${s.base}/#/tasks/${taskId}`);
    // The last event reached the run's row (a locator polls from playwright's own script, whose
    // animation frames the stub does not stop).
    await page.locator("tr[data-run] .message", { hasText: `step ${EVENTS} ` }).waitFor({ timeout: 60_000 });
    const grew = (await heap()) - before;
    // Without the timer, 100,000 events waited for a frame: 28.6 MiB. Now the latest 1,000 are kept.
    assert.ok(grew < 8, `the page's heap grew ${grew.toFixed(1)} MiB`);
    await page.getByRole("tab", { name: "Event log" }).click();
    await page.getByText("The latest 1000 events.").waitFor();
    const shown = page.locator("li[data-event]");
    assert.equal(await shown.count(), 1000);
    assert.equal(await shown.last().getAttribute("data-event"), last?.id);
    // Leaving the view leaves nothing of it behind.
    await page.goto(`${s.base}/#/`);
    await page.getByRole("heading", { name: "Tasks" }).waitFor();
    const left = (await heap()) - before;
    assert.ok(left < 4, `${left.toFixed(1)} MiB above the heap before the visit`);
    await page.context().close();
  });
  assert.deepEqual(problems, []);
});

test("a metric's chart leaves out the runs without a value (a failed run is no bar of 0); they sort last", {
  skip,
}, async () => {
  const ids = [
    await upload(s.adminToken, "two.csv", "a,b\n1,2\n3,4\n"),
    await upload(s.adminToken, "broken.csv", "a,b\n1,2,3\n"),
    await upload(s.adminToken, "one.csv", "a,b\n1,2\n"),
  ];
  const task = await call(s.adminToken, "POST", "/analysis-tasks", {
    analysisType: "summary",
    inputFileIds: ids,
  });
  const taskId = task.taskId as string;
  const done = await waitForTerminal(s.env.db.sql, taskId, 60_000);
  assert.deepEqual([done.succeeded, done.failed], [2, 1]);
  const page = await pageFor(s.adminToken);
  await page.goto(`${s.base}/#/tasks/${taskId}`);
  await page.getByRole("tab", { name: "Results" }).click();
  const table = page.locator("table.results");
  await table.waitFor();
  await table.getByRole("button", { name: "rows", exact: true }).click();
  const chart = page.locator("figure.chart");
  await chart
    .locator("figcaption", { hasText: "1 without a value (failed, or not measured) not charted" })
    .waitFor();
  assert.deepEqual(await chart.locator("title").allTextContents(), ["one.csv: 1", "two.csv: 2"]);
  const names = () => table.locator("tbody tr td:nth-child(2)").allTextContents();
  assert.deepEqual(await names(), ["one.csv", "two.csv", "broken.csv"], "ascending, the failed run last");
  await table.getByRole("button", { name: "rows", exact: true }).click();
  // (An SVG title is never visible: waited for as there.)
  await waitFor(
    async () => (await chart.locator("title").first().textContent()) === "two.csv: 2" || undefined,
    10_000,
    "the chart in descending order",
  );
  assert.deepEqual(await chart.locator("title").allTextContents(), ["two.csv: 2", "one.csv: 1"]);
  assert.deepEqual(
    await names(),
    ["two.csv", "one.csv", "broken.csv"],
    "descending, the failed run still last",
  );
  await page.context().close();
  assert.deepEqual(problems, []);
});
