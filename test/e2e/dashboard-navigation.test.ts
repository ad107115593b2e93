// The dashboard's navigation state, in a real browser (Debian's chromium driven by playwright-core)
// against a real `assay api` process: the task list's filters and page and the files list's page are
// in the address, so Back from a task, a reload and a link show the list as it was; hostile values in
// the address show the API's error, never break the page; and the Results tab of a running task shows
// its runs as they end (read again after runs change, at most every POLL_MS), not only when the task
// does. Waits on conditions, never time.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { Page } from "playwright-core";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { Worker } from "../../src/queue/worker.ts";
import { browserSkip, dashboardSuite, uploadFile } from "../helpers/browser.ts";
import { idsCrossPowerOfTen, waitFor } from "../helpers/queue.ts";

const skip = browserSkip;
/** A hostile name: markup, a right-to-left override, letters beyond ASCII. */
const NAME = "<img src=x onerror=alert(1)> Größe \u202evsc.csv";

const s = dashboardSuite({ ASSAY_SSE_HEARTBEAT_MS: "1000", ASSAY_SHUTDOWN_GRACE_MS: "2000" });
const { problems } = s;

let users = 0;
/** A user of the test's own: their files and tasks are only the test's. */
async function newUser(): Promise<string> {
  users++;
  return (await tokenCreate(s.env.db.sql, `nav-${users}-Ünïcode`, "user")).token;
}

async function post(token: string, path: string, body?: unknown): Promise<Record<string, string>> {
  const res = await fetch(`${s.base}/api${path}`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${token}`,
      ...(body === undefined ? {} : { "content-type": "application/json" }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  assert.ok(res.ok, `${path}: ${res.status} ${await res.clone().text()}`);
  return ((await res.json()) as { data: Record<string, string> }).data;
}

/** The hash of the page's address, decoded. */
const hashOf = (page: Page) => decodeURIComponent(new URL(page.url()).hash);

test("the task list's filters and page are in the address: Back from a task, a reload and a link restore them", {
  skip,
}, async () => {
  const token = await newUser();
  const fileId = (await uploadFile(s.base, token, NAME, "a,b\n1,2\n")).fileId;
  // Task ids cross a power of ten among the tasks listed (…99, 100…).
  await idsCrossPowerOfTen(s.env.db.sql, "tasks", 20);
  // 45 tasks no worker here runs: every third cancelled, so 30 queued, two pages of them (20, 10).
  const queued: string[] = [];
  for (let i = 0; i < 45; i++) {
    const { taskId } = await post(token, "/analysis-tasks", {
      analysisType: "python-stats",
      inputFileId: fileId,
      parameters: { method: "mean" },
    });
    if (i % 3 === 2) await post(token, `/analysis-tasks/${taskId}/cancel`);
    else queued.push(taskId as string);
  }
  const [oldest, newest] = [queued[0] as string, queued.at(-1) as string];
  const page = await s.signedIn(token);
  const row = (id: string) => page.locator(`tr[data-task="${id}"]`);
  await page.getByLabel("Status").selectOption("queued");
  await page.waitForURL((u) => u.hash.includes("status=queued"));
  await page.getByLabel("Type").selectOption("python-stats");
  await page.waitForURL((u) => u.hash.includes("type=python-stats"));
  await row(newest).waitFor();
  await page.getByRole("button", { name: "Older" }).click();
  await row(oldest).waitFor();
  assert.match(hashOf(page), /^#\/\?status=queued&type=python-stats&cursor=\d+$/);
  const second = page.url();

  /** The second page of queued tasks, its filters chosen. */
  const onSecondPage = async (p: Page) => {
    await p.locator(`tr[data-task="${oldest}"]`).waitFor();
    assert.equal(await p.locator("tr[data-task]").count(), 10);
    assert.equal(await p.getByLabel("Status").inputValue(), "queued");
    // The Type list's options come with the analysis types, which may arrive after the rows: its value
    // is "" until then (seen once under a full test run's load).
    await waitFor(
      async () => (await p.getByLabel("Type").inputValue()) === "python-stats",
      10_000,
      "the type filter",
    );
    assert.equal(await p.locator(".badge", { hasText: "cancelled" }).count(), 0);
    assert.equal(await p.getByRole("button", { name: "Newer" }).isDisabled(), false);
  };
  // To a task and Back.
  await row(oldest).getByRole("link").click();
  await page.getByRole("heading", { name: `Task #${oldest}` }).waitFor();
  await page.goBack();
  await onSecondPage(page);
  // A reload.
  await page.reload();
  await onSecondPage(page);
  // Newer goes to the first page; Back and Forward go between the two.
  await page.getByRole("button", { name: "Newer" }).click();
  await row(newest).waitFor();
  assert.equal(hashOf(page), "#/?status=queued&type=python-stats");
  await page.goBack();
  await onSecondPage(page);
  await page.goForward();
  await row(newest).waitFor();
  assert.equal(await page.locator("tr[data-task]").count(), 20);
  // The address, opened in another browser, shows the same page.
  const other = await s.signedIn(token);
  await other.goto(second);
  await onSecondPage(other);
  await page.context().close();
  await other.context().close();
  assert.deepEqual(problems, []);
});

test("hostile values in a list's address show the API's error in the page, never break it", {
  skip,
}, async () => {
  const token = await newUser();
  const fileId = (await uploadFile(s.base, token, NAME, "a,b\n1,2\n")).fileId;
  const { taskId } = await post(token, "/analysis-tasks", {
    analysisType: "python-stats",
    inputFileId: fileId,
    parameters: { method: "mean" },
  });
  const page = await s.signedIn(token);
  const alert = page.getByRole("alert");
  const hostile = [
    `#/?status=${encodeURIComponent("<script>alert(1)</script>")}`,
    `#/?type=${"x".repeat(500_000)}`,
    `#/?type=${encodeURIComponent("\u202e<img src=x onerror=alert(1)>")}`,
    "#/?cursor=0",
    "#/?cursor=99999999999999999999",
    `#/?cursor=${encodeURIComponent("1 or 1=1")}&newer=${encodeURIComponent("\u0000,,%")}`,
    "#/files?cursor=-1",
    `#/files?cursor=${"9".repeat(300_000)}`,
  ];
  for (const hash of hostile) {
    await page.goto(`${s.base}/${hash}`);
    await alert.filter({ hasText: "VALIDATION_FAILED" }).waitFor();
    assert.equal(await page.getByText("Loading…").count(), 0, `${hash.slice(0, 60)}: not left loading`);
    assert.equal(await page.locator("img").count(), 0);
    // No rows read under other filters are left under these (a failed page of the same filters leaves
    // the page shown before it, whose pager goes on from there).
    if (/[?&](status|type)=/.test(hash))
      assert.equal(await page.locator("tr[data-task]").count(), 0, hash.slice(0, 60));
    // The page is not pushed sideways by the value (a select is as wide as its widest option).
    assert.ok(
      await page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth"),
      hash.slice(0, 60),
    );
  }
  // A status the address names and no task has is shown as such in its select; leaving it for the
  // list of all tasks shows "any" (until 2026-12-07 the select was left blank).
  await page.goto(`${s.base}/#/?status=bogus`);
  await alert.filter({ hasText: "VALIDATION_FAILED" }).waitFor();
  const status = page.getByLabel("Status");
  assert.equal(await status.locator("option:checked").textContent(), "bogus (not known)");
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Tasks" }).click();
  await page.locator(`tr[data-task="${taskId}"]`).waitFor();
  assert.equal(await status.locator("option:checked").textContent(), "any");
  // Back on a list the API takes, the error goes.
  await page.goto(`${s.base}/#/?status=${encodeURIComponent("<script>")}`);
  await alert.waitFor();
  await page.getByLabel("Status").selectOption("queued");
  await page.locator(`tr[data-task="${taskId}"]`).waitFor();
  await alert.waitFor({ state: "detached" });
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("the files list's page is in the address: Back, Forward and a reload come back to it", {
  skip,
}, async () => {
  const token = await newUser();
  // More than a page (50); file ids cross a power of ten among them.
  await idsCrossPowerOfTen(s.env.db.sql, "files", 25);
  const ids: string[] = [];
  for (let i = 0; i < 52; i++)
    ids.push((await uploadFile(s.base, token, `${i} ${NAME}`, `a\n${i}\n`)).fileId);
  const [oldest, newest] = [ids[0] as string, ids.at(-1) as string];
  const page = await s.signedIn(token);
  await page.goto(`${s.base}/#/files`);
  const row = (id: string) => page.locator(`tr[data-file="${id}"]`);
  await row(newest).waitFor();
  await page.getByRole("button", { name: "Older" }).click();
  await row(oldest).waitFor();
  assert.match(hashOf(page), /^#\/files\?cursor=\d+$/);
  await page.goBack();
  await row(newest).waitFor();
  assert.equal(hashOf(page), "#/files");
  await page.goForward();
  await row(oldest).waitFor();
  await page.reload();
  await row(oldest).waitFor();
  assert.equal(await page.locator("tr[data-file]").count(), 2);
  await page.getByRole("button", { name: "Newer" }).click();
  await row(newest).waitFor();
  assert.equal(await page.getByRole("button", { name: "Newer" }).isDisabled(), true, "the first page");
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("the Results tab of a running task shows each run's result as it ends, not only the task's end", {
  skip,
}, async () => {
  const token = await newUser();
  const first = (await uploadFile(s.base, token, `erst ${NAME}`, "a\n1\n")).fileId;
  const second = (await uploadFile(s.base, token, `zweit ${NAME}`, "a\n2\n")).fileId;
  const gates = new Map<string, () => void>();
  const opened = new Map<string, Promise<void>>();
  for (const id of [first, second])
    opened.set(
      id,
      new Promise<void>((resolve) => {
        gates.set(id, resolve);
      }),
    );
  const worker = new Worker({
    sql: s.env.db.sql,
    logger: createLogger({ level: "silent" }),
    types: {
      summary: {
        handler: async (run, { reportProgress }) => {
          reportProgress(10, "waiting");
          await opened.get(String(run.inputFileId));
          return { status: "succeeded", result: { metrics: { "Größe µ": Number(run.inputFileId) % 1000 } } };
        },
      },
    },
    concurrency: 2,
    leaseTtlMs: 30_000,
    pollIntervalMs: 200,
    retryBaseMs: 100,
  });
  await worker.start();
  const release = () => {
    for (const open of gates.values()) open();
  };
  try {
    const { taskId } = await post(token, "/analysis-tasks", {
      analysisType: "summary",
      inputFileIds: [first, second],
    });
    const page = await s.signedIn(token);
    const reads: number[] = [];
    page.on("request", (r) => {
      if (r.url().endsWith(`/analysis-tasks/${taskId}/results.csv`)) reads.push(Date.now());
    });
    await page.goto(`${s.base}/#/tasks/${taskId}`);
    await page.locator("header .badge").filter({ hasText: "running" }).waitFor({ timeout: 20_000 });
    await page.getByRole("tab", { name: "Results" }).click();
    const resultRow = (name: string) => page.locator("table.results tbody tr", { hasText: name });
    await resultRow(`erst `).filter({ hasText: "running" }).waitFor();
    // The re-read after the first run ends fails (the network, the API restarting): the table stays
    // under its error, and the read is tried again (without another event).
    let blocked = true;
    await page.route(/\/results\.csv$/, (route) =>
      blocked ? route.abort("connectionrefused") : route.continue(),
    );
    gates.get(first)?.();
    await page.getByRole("alert").filter({ hasText: "NETWORK" }).waitFor({ timeout: 20_000 });
    assert.equal(await resultRow("erst ").count(), 1, "the table stays");
    blocked = false;
    await page.getByRole("alert").waitFor({ state: "detached", timeout: 20_000 });
    // The first run's row shows its end and its metric while the task still runs.
    await resultRow("erst ").filter({ hasText: "succeeded" }).waitFor({ timeout: 20_000 });
    await page.getByRole("columnheader", { name: "Größe µ" }).waitFor();
    assert.equal(await resultRow("zweit ").filter({ hasText: "succeeded" }).count(), 0);
    assert.equal(await page.locator("header .badge").filter({ hasText: "running" }).count(), 1);
    reads.length = 0;
    gates.get(second)?.();
    await resultRow("zweit ").filter({ hasText: "succeeded" }).waitFor({ timeout: 20_000 });
    await page.locator("header .badge").filter({ hasText: "succeeded" }).waitFor({ timeout: 20_000 });
    // Read again after runs end, at most every POLL_MS (2 s), not back to back. (Two reads may come
    // together: a task's end reads the table again at once.)
    const gaps = reads.slice(1).map((t, i) => t - (reads[i] as number));
    assert.ok(gaps.filter((g) => g < 1500).length <= 1, `reads ${gaps.join(", ")} ms apart`);
    await page.context().close();
  } finally {
    release();
    await worker.stop();
  }
  assert.deepEqual(problems, []);
});

test("a list whose read failed (the API restarting) is read again by itself, with no rows of the filters before", {
  skip,
}, async () => {
  const token = await newUser();
  const fileId = (await uploadFile(s.base, token, NAME, "a,b\n1,2\n")).fileId;
  // Every task on the list finished: the list is not re-read for a running one.
  const { taskId } = await post(token, "/analysis-tasks", { analysisType: "summary", inputFileId: fileId });
  await post(token, `/analysis-tasks/${taskId}/cancel`);
  const page = await s.signedIn(token);
  const row = page.locator(`tr[data-task="${taskId}"]`);
  await row.locator(".badge", { hasText: "cancelled" }).waitFor();
  await s.stopApi();
  try {
    await page.getByLabel("Type").selectOption("summary");
    await page.getByRole("alert").filter({ hasText: "NETWORK" }).waitFor();
    assert.equal(await page.locator("tr[data-task]").count(), 0, "the rows of the filters before");
  } finally {
    await s.startApi();
  }
  // Until 2026-12-07 only a reload read it again.
  await row.waitFor({ timeout: 30_000 });
  await page.getByRole("alert").waitFor({ state: "detached" });
  assert.equal(hashOf(page), "#/?type=summary");
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("a list's retries start afresh under new filters: the failures under the filters before do not delay them", {
  skip,
}, async () => {
  const token = await newUser();
  const page = await s.signedIn(token);
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  // Every read of the list fails (an API behind a proxy that answers 503); each read's time is kept
  // by its filters.
  const reads: { type: string; at: number }[] = [];
  await page.route(/\/api\/analysis-tasks\?/, async (route) => {
    reads.push({
      type: new URL(route.request().url()).searchParams.get("analysisType") ?? "",
      at: Date.now(),
    });
    await route.fulfill({
      status: 503,
      contentType: "application/json",
      body: JSON.stringify({
        code: "NOT_READY",
        message: "The database is not answering; try again shortly.",
      }),
    });
  });
  const of = (type: string) => reads.filter((r) => r.type === type);
  try {
    // A new address of the same filters, so that its read fails: three failures in a row (the retries
    // 1 s and 2 s apart).
    await page.goto(`${s.base}/#/?status=cancelled`);
    await waitFor(async () => of("").length >= 3, 15_000, "three failed reads of the list");
    await page.getByLabel("Type").selectOption("summary");
    // The new filters' first read fails at once; its retry comes 1 s later, as a first failure's
    // (until 2026-12-07: 8 s, the fourth failure's delay).
    await waitFor(async () => of("summary").length >= 2, 5_000, "the new filters' first retry");
    const [first, second] = of("summary");
    assert.ok(first && second);
    assert.ok(second.at - first.at < 3_000, `retried after ${second.at - first.at} ms`);
  } finally {
    await page.unroute(/\/api\/analysis-tasks\?/);
  }
  await page.context().close();
});

test("the files list whose read failed (the API restarting) is read again by itself", { skip }, async () => {
  const token = await newUser();
  const fileId = (await uploadFile(s.base, token, NAME, "a,b\n1,2\n")).fileId;
  const page = await s.signedIn(token);
  await s.stopApi();
  try {
    // From the task list to the files list while the API is down: its read fails.
    await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Files" }).click();
    await page.getByRole("alert").filter({ hasText: "NETWORK" }).waitFor();
  } finally {
    await s.startApi();
  }
  // Until 2026-12-07 only a reload (or choosing the page again) read it again.
  await page.locator(`tr[data-file="${fileId}"]`).waitFor({ timeout: 30_000 });
  await page.getByRole("alert").waitFor({ state: "detached" });
  await page.context().close();
  assert.deepEqual(problems, []);
});
