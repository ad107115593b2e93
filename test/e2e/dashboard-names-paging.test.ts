// The dashboard against hostile file names and failed page reads, in a real browser (Debian's chromium
// driven by playwright-core) against a real `assay api` process: a name with a bidirectional override
// must not reverse the text beside it nor read as another name, a 255-character name must not push the
// page sideways, a letter with 210 combining marks must not draw over the name above it, and a page of a list whose read failed must neither leave its error shown after the
// next read succeeds nor put the pager out of step with the page shown, and a task page whose read
// failed reads again by itself. Waits on conditions, never time.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import type { Locator, Page } from "playwright-core";
import { createLogger } from "../../src/log.ts";
import { Worker } from "../../src/queue/worker.ts";
import { browserSkip, dashboardSuite, uploadFile } from "../helpers/browser.ts";

const skip = browserSkip;
/** Small, so a file over it is quick to make. */
const MAX_UPLOAD = 64 * 1024;
/** Reads "invoiceexe.csv" where the override is obeyed. */
const SPOOF = "invoice\u202evsc.exe";

const s = dashboardSuite({
  ASSAY_SSE_HEARTBEAT_MS: "1000",
  ASSAY_SHUTDOWN_GRACE_MS: "2000",
  ASSAY_MAX_UPLOAD_BYTES: String(MAX_UPLOAD),
});
const { problems } = s;

async function upload(name: string, content = "a,b\n1,2\n"): Promise<string> {
  const data = await uploadFile(s.base, s.adminToken, name, content);
  assert.equal(data.name, name, "the name is stored as it was given");
  return data.fileId;
}

/** A page signed in as the admin, in a context of its own `width` wide. */
async function pageFor(width = 1280): Promise<Page> {
  return s.signedIn(s.adminToken, await s.browser.newContext({ viewport: { width, height: 900 } }));
}

/**
 * Where the text of `el` (left-to-right text only) is drawn out of its reading order: each character
 * must stand right of the one before it on its line, and each line below the one before. Returns the
 * characters found out of place ("" when none).
 */
/** The little of the DOM outOfOrder uses (this project's TypeScript has no DOM library). */
interface Dom {
  createTreeWalker(root: unknown, show: number): { nextNode(): { nodeValue: string | null } | null };
  createRange(): {
    setStart(node: unknown, offset: number): void;
    setEnd(node: unknown, offset: number): void;
    getBoundingClientRect(): { left: number; top: number; width: number; height: number };
  };
}

function outOfOrder(el: Locator): Promise<string> {
  return el.evaluate((root) => {
    const document = (globalThis as unknown as { document: Dom }).document;
    const SHOW_TEXT = 4;
    const walker = document.createTreeWalker(root, SHOW_TEXT);
    const bad: string[] = [];
    let prev: { left: number; top: number; c: string } | null = null;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const text = node.nodeValue ?? "";
      for (let i = 0; i < text.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const r = range.getBoundingClientRect();
        if (r.width === 0) continue;
        const c = text[i] as string;
        if (prev) {
          const sameLine = Math.abs(r.top - prev.top) < r.height / 2;
          if (sameLine ? r.left < prev.left : r.top < prev.top) bad.push(`${prev.c}→${c}`);
        }
        prev = { left: r.left, top: r.top, c };
      }
    }
    return bad.join(" ");
  });
}

test("a name with a bidi override reverses neither itself nor the text beside it", { skip }, async () => {
  const id = await upload(SPOOF);
  const page = await pageFor();
  // The file list: the name in its cell.
  await page.goto(`${s.base}/#/files`);
  const fileRow = page.locator(`tr[data-file="${id}"]`);
  await fileRow.waitFor();
  assert.equal(await outOfOrder(fileRow.locator("td.name")), "", "the files page's name");
  // A new task's list of uploaded files: the name, then its size and date on the same line.
  await page.goto(`${s.base}/#/new?files=${id}`);
  const known = page.locator(".known li", { has: page.locator("input:checked") });
  await known.waitFor();
  assert.equal(await outOfOrder(known), "", "the new task's list of uploaded files");
  // A task's runs.
  const res = await fetch(`${s.base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${s.adminToken}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileIds: [id] }),
  });
  const body = (await res.json()) as { data: { taskId: string } };
  assert.equal(res.status, 201, JSON.stringify(body));
  const { taskId } = body.data;
  await page.goto(`${s.base}/#/tasks/${taskId}`);
  const run = page.locator("tr[data-run]");
  await run.waitFor();
  assert.equal(await outOfOrder(run.locator("td.name")), "", "the task's runs");
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("an upload refused as too large: its error reads in order whatever the name", { skip }, async () => {
  const page = await pageFor();
  await page.goto(`${s.base}/#/new`);
  const dir = fs.mkdtempSync(path.join(s.env.dataDir, "picked-"));
  const big = path.join(dir, SPOOF);
  fs.writeFileSync(big, Buffer.alloc(MAX_UPLOAD + 1024, "1,2\n"));
  await page.locator('input[type="file"]').setInputFiles([big]);
  const note = page.locator("li.upload.failed .error");
  await note.waitFor({ timeout: 30_000 });
  assert.match((await note.textContent()) ?? "", /is too large/);
  assert.equal(await outOfOrder(note), "", "the error");
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("a 255-character name does not push the page sideways", { skip }, async () => {
  const long = `${"x".repeat(251)}.csv`;
  const id = await upload(long);
  const page = await pageFor(1024);
  const sideways = () => page.evaluate<number>("document.documentElement.scrollWidth - window.innerWidth");
  await page.goto(`${s.base}/#/new?files=${id}`);
  await page.locator(".known li", { has: page.locator("input:checked") }).waitFor();
  assert.ok((await sideways()) <= 1, `the new task page scrolls sideways by ${await sideways()}px`);
  // Refused as too large: its error names it.
  const big = path.join(fs.mkdtempSync(path.join(s.env.dataDir, "picked-")), long);
  fs.writeFileSync(big, Buffer.alloc(MAX_UPLOAD + 1024, "1,2\n"));
  await page.locator('input[type="file"]').setInputFiles([big]);
  await page.locator("li.upload.failed .error").waitFor({ timeout: 30_000 });
  assert.ok((await sideways()) <= 1, `the refused upload scrolls the page sideways by ${await sideways()}px`);
  await page.goto(`${s.base}/#/files`);
  await page.locator(`tr[data-file="${id}"]`).waitFor();
  assert.ok((await sideways()) <= 1, `the files page scrolls sideways by ${await sideways()}px`);
  // A task's Results table (a row per input file, its name in a cell): wrapped, not scrolled
  // sideways in its box (until 2026-12-07 the table was ~5,000 px wide, its status column out of sight).
  const task = await fetch(`${s.base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${s.adminToken}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileId: id }),
  });
  assert.equal(task.status, 201);
  const { taskId } = ((await task.json()) as { data: { taskId: string } }).data;
  await page.goto(`${s.base}/#/tasks/${taskId}`);
  await page.getByRole("tab", { name: "Results" }).click();
  const table = page.locator("table.results");
  await table.getByText(long.slice(0, 20)).waitFor();
  const inBox = await table.evaluate((el) => {
    const box = (el as unknown as { parentElement: { scrollWidth: number; clientWidth: number } })
      .parentElement;
    return box.scrollWidth - box.clientWidth;
  });
  assert.ok(inBox <= 1, `the results table scrolls sideways by ${inBox}px`);
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("a name of stacked combining marks draws nothing over the name above it", { skip }, async () => {
  // 210 marks on one letter (a 255-character name): unclipped, they stack up over the rows above.
  const stacked = `a${"\u0301\u0302\u0303\u0304\u0306\u0307\u0308".repeat(30)}b.csv`;
  const id = await upload(stacked);
  const plain = await upload("plain name.csv");
  const page = await pageFor();
  /** `above` drawn as it is, and with the stacked name hidden: alike when nothing is drawn over it. */
  const drawnOver = async (above: Locator, stackedName: Locator) => {
    await above.scrollIntoViewIfNeeded();
    const before = await above.screenshot();
    await stackedName.evaluate((el) => {
      (el as unknown as { style: { visibility: string } }).style.visibility = "hidden";
    });
    const after = await above.screenshot();
    return !before.equals(after);
  };
  await page.goto(`${s.base}/#/files`);
  await page.locator(`tr[data-file="${id}"]`).waitFor();
  assert.equal(
    await drawnOver(page.locator(`tr[data-file="${plain}"]`), page.locator(`tr[data-file="${id}"] td.name`)),
    false,
    "the files page",
  );
  // The new task's list of uploaded files: a name in a line of text (a span).
  await page.goto(`${s.base}/#/new?files=${id}`);
  const known = page.locator(".known li");
  await known.filter({ hasText: "plain name.csv" }).waitFor();
  assert.equal(
    await drawnOver(
      known.filter({ hasText: "plain name.csv" }),
      known.filter({ has: page.locator("input:checked") }).locator(".name"),
    ),
    false,
    "the new task's list",
  );
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("a page of files whose read failed: the next read clears the error, the pager stays in step", {
  skip,
}, async () => {
  // More than a page (50).
  for (let i = 0; i < 51; i++) await upload(`page-${i}.csv`);
  const newest = (await s.env.db.sql<{ id: string }[]>`select max(id)::text as id from files`)[0]
    ?.id as string;
  const page = await pageFor();
  await page.goto(`${s.base}/#/files`);
  await page.locator(`tr[data-file="${newest}"]`).waitFor();
  // The next page's first read fails (the network, an API restarting); the second goes through.
  let failed = false;
  await page.route(/\/api\/files\?limit=50&cursor=/, async (route) => {
    if (failed) return route.continue();
    failed = true;
    await route.abort("connectionrefused");
  });
  const older = page.getByRole("button", { name: "Older" });
  await older.click();
  await page.getByRole("alert").waitFor();
  // Still the first page: its newest file is shown.
  assert.equal(await page.locator(`tr[data-file="${newest}"]`).count(), 1);
  await older.click();
  await page.locator(`tr[data-file="${newest}"]`).waitFor({ state: "detached" });
  // One page back from the second page is the first page (read without a cursor).
  const [back] = await Promise.all([
    page.waitForRequest(/\/api\/files\?/),
    page.getByRole("button", { name: "Newer" }).click(),
  ]);
  assert.doesNotMatch(back.url(), /cursor=/, "Newer from the second page reads the first");
  await page.locator(`tr[data-file="${newest}"]`).waitFor();
  assert.equal(await page.getByRole("button", { name: "Newer" }).isDisabled(), true, "the first page");
  assert.equal(await page.getByRole("alert").count(), 0, "the error is gone once a read succeeds");
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("a task page whose re-read failed reads the task again by itself: it shows how the task ended", {
  skip,
}, async () => {
  // A running task ends; its last events make the page read the task again, and that read fails (the
  // API restarting, the network). No event comes after the task's last, and only a queued task is
  // polled, so before, the page kept the error and showed the task running, for good.
  const fileId = await upload("ending.csv");
  let finish = () => {};
  const gate = new Promise<void>((resolve) => {
    finish = resolve;
  });
  const worker = new Worker({
    sql: s.env.db.sql,
    logger: createLogger({ level: "silent" }),
    types: {
      summary: {
        handler: async (run, { reportProgress }) => {
          // Only this test's run waits: the other tests' tasks end at once.
          if (String(run.inputFileId) === fileId) {
            reportProgress(50, "half");
            await gate;
          }
          return { status: "succeeded" };
        },
      },
    },
    concurrency: 2,
    leaseTtlMs: 30_000,
    pollIntervalMs: 200,
    retryBaseMs: 100,
  });
  await worker.start();
  try {
    const res = await fetch(`${s.base}/api/analysis-tasks`, {
      method: "POST",
      headers: { authorization: `Bearer ${s.adminToken}`, "content-type": "application/json" },
      body: JSON.stringify({ analysisType: "summary", inputFileId: fileId }),
    });
    assert.equal(res.status, 201);
    const { taskId } = ((await res.json()) as { data: { taskId: string } }).data;
    const page = await pageFor();
    await page.goto(`${s.base}/#/tasks/${taskId}`);
    const badge = page.locator("header .badge");
    await badge.filter({ hasText: "running" }).waitFor({ timeout: 20_000 });
    // From here the task's reads fail until the test lets them by.
    let blocked = true;
    let failed = 0;
    await page.route(new RegExp(`/api/analysis-tasks/${taskId}$`), async (route) => {
      if (!blocked) return route.continue();
      failed++;
      await route.abort("connectionrefused");
    });
    finish();
    // The stream has brought the task's last event and ended; the read its events asked for failed.
    await page.locator("header .stream").filter({ hasText: "finished" }).waitFor({ timeout: 20_000 });
    await page.getByRole("alert").waitFor();
    assert.ok(failed >= 1);
    blocked = false;
    await badge.filter({ hasText: "succeeded" }).waitFor({ timeout: 20_000 });
    await page.getByRole("alert").waitFor({ state: "detached", timeout: 20_000 });
    await page.context().close();
  } finally {
    finish();
    await worker.stop();
  }
  assert.deepEqual(problems, []);
});
