// The dashboard for someone using a keyboard only, or a screen reader: every flow by the keyboard,
// the focus put somewhere sensible after a move, a question, a deletion, a cancel (never lost to
// <body>), the task page's tabs as a tab list (one Tab stop, the arrows between them), controls named
// by what they act on, what matters said by live regions, a title per view, and the focus ring, text
// colours and motion as the user needs them. Real API and worker processes, Debian's chromium. Waits
// on conditions, never on time.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import type { Page } from "playwright-core";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { browserSkip, dashboardSuite, uploadFile } from "../helpers/browser.ts";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";

const skip = browserSkip;
const s = dashboardSuite({ ASSAY_SSE_HEARTBEAT_MS: "1000" }, { worker: true });
const { problems } = s;

let users = 0;
/** A user of the test's own, and their token. */
async function newUser(): Promise<string> {
  users++;
  return (await tokenCreate(s.env.db.sql, `keyboard-${users}`, "user")).token;
}

async function createTask(token: string, fileIds: string[]): Promise<string> {
  const res = await fetch(`${s.base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileIds: fileIds }),
  });
  assert.equal(res.status, 201);
  return ((await res.json()) as { data: { taskId: string } }).data.taskId;
}

/** What has the keyboard's focus: its tag, its accessible text (aria-label, else its text). */
const focused = (page: Page): Promise<string> =>
  page.evaluate(`(() => {
    const at = document.activeElement;
    if (!at || at === document.body) return "BODY";
    return (at.tagName + " " + (at.getAttribute("aria-label") ?? at.textContent ?? "").trim()).trim();
  })()`);

/** Waits until what has the focus is `want` (as `focused` says it). */
async function focusIs(page: Page, want: string | RegExp): Promise<void> {
  let last = "";
  await waitFor(
    async () => {
      last = await focused(page);
      return typeof want === "string" ? last === want : want.test(last);
    },
    10_000,
    `the focus on ${want}`,
  ).catch(() => assert.fail(`the focus is on ${last}, not ${want}`));
}

/** Computed style `property` of a `tag` of class `className` put in the page's main. */
const styleOf = (page: Page, tag: string, className: string, property: string): Promise<string> =>
  page.evaluate(`(() => {
    const el = document.createElement(${JSON.stringify(tag)});
    el.className = ${JSON.stringify(className)};
    document.querySelector("main").append(el);
    const value = getComputedStyle(el)[${JSON.stringify(property)}];
    el.remove();
    return value;
  })()`);

/** The contrast ratio of two CSS colours `rgb(r, g, b)` (WCAG 2). */
function contrast(a: string, b: string): number {
  const lum = (c: string) => {
    const [r, g, bl] = (c.match(/[\d.]+/g) ?? []).slice(0, 3).map((v) => {
      const x = Number(v) / 255;
      return x <= 0.04045 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4;
    }) as [number, number, number];
    return 0.2126 * r + 0.7152 * g + 0.0722 * bl;
  };
  const [hi, lo] = [lum(a), lum(b)].sort((x, y) => y - x) as [number, number];
  return (hi + 0.05) / (lo + 0.05);
}

test("keyboard only: signing in and out and moving between views put the focus on the view's heading; each view has its title", {
  skip,
}, async () => {
  const token = await newUser();
  const page = await s.open("#/");
  await page.getByLabel("API token").waitFor();
  assert.equal(await page.evaluate("document.documentElement.lang"), "en");
  assert.equal(await page.title(), "Sign in — Assay");
  await page.keyboard.press("Tab");
  await focusIs(page, "INPUT");
  // A refused token: the error is the field's (announced, and tied to it).
  await page.keyboard.type("assay_not-a-real-token");
  await page.keyboard.press("Enter");
  const token_ = page.getByLabel("API token");
  await page.getByRole("alert").filter({ hasText: "That token is not valid" }).waitFor();
  assert.equal(await token_.getAttribute("aria-invalid"), "true");
  const described = ((await token_.getAttribute("aria-describedby")) ?? "").split(" ");
  assert.ok(described.includes("token-problem"), described.join(" "));
  assert.match((await page.locator("#token-problem").textContent()) ?? "", /That token is not valid/);
  await token_.focus();
  await page.keyboard.press("ControlOrMeta+a");
  await page.keyboard.type(token);
  await page.keyboard.press("Enter");
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  await focusIs(page, "H1 Tasks");
  assert.equal(await page.title(), "Tasks — Assay");
  // The header's links by the keyboard: the focus goes on to the view's heading.
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Files" }).focus();
  await page.keyboard.press("Enter");
  await focusIs(page, "H1 Files");
  assert.equal(await page.title(), "Files — Assay");
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "New task" }).focus();
  await page.keyboard.press("Enter");
  await focusIs(page, "H1 New task");
  assert.equal(await page.title(), "New task — Assay");
  // A task's heading comes after its read: the focus waits for it.
  const fileId = (await uploadFile(s.base, token, "one.csv", "a,b\n1,2\n")).fileId;
  const taskId = await createTask(token, [fileId]);
  await waitForTerminal(s.env.db.sql, taskId, 60_000);
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Tasks" }).focus();
  await page.keyboard.press("Enter");
  const link = page.locator(`tr[data-task="${taskId}"]`).getByRole("link");
  await link.focus();
  await page.keyboard.press("Enter");
  await focusIs(page, new RegExp(`^H1 Task #${taskId}`));
  assert.equal(await page.title(), `Task #${taskId} — Assay`);
  // Signing out: the sign-in form's heading.
  await page.getByRole("button", { name: "Sign out" }).focus();
  await page.keyboard.press("Enter");
  await focusIs(page, "H1 Assay");
  assert.equal(await page.title(), "Sign in — Assay");
  assert.deepEqual(problems, []);
});

test("files by the keyboard: the delete question focuses Keep, Keep gives the focus back, a deletion is said and focused; the pager keeps the focus", {
  skip,
}, async () => {
  const token = await newUser();
  // 52 files: two pages (50, 2), and still two after one is deleted.
  for (let i = 0; i < 52; i++) await uploadFile(s.base, token, `file-${i}.csv`, "a\n1\n");
  const page = await s.signedIn(token);
  await page.goto(`${s.base}/#/files`);
  const first = page.locator("tr[data-file]").first();
  await first.waitFor();
  const name = ((await first.locator("td.name").textContent()) ?? "").trim();
  await first.getByRole("checkbox").focus();
  await page.keyboard.press("Space");
  await page.getByRole("button", { name: "Delete 1 selected" }).focus();
  await page.keyboard.press("Enter");
  // The question: the focus on the answer that changes nothing.
  await focusIs(page, "BUTTON Keep");
  await page.keyboard.press("Enter");
  await focusIs(page, "BUTTON Delete 1 selected");
  await page.keyboard.press("Enter");
  await focusIs(page, "BUTTON Keep");
  await page.keyboard.press("Shift+Tab");
  await focusIs(page, "BUTTON Delete");
  await page.keyboard.press("Enter");
  await page.locator("tr[data-file]", { hasText: name }).waitFor({ state: "detached" });
  // Said, and where the focus is: not <body>.
  const said = page.getByRole("status").filter({ hasText: "1 file deleted." });
  await said.waitFor();
  await focusIs(page, "P 1 file deleted.");
  // The last page: "Older" is disabled there, and the focus goes to "Newer".
  await page.getByRole("button", { name: "Older" }).focus();
  await page.keyboard.press("Enter");
  await page.locator("tr[data-file]", { hasText: /^file-0\.csv/ }).waitFor();
  assert.equal(await page.getByRole("button", { name: "Older" }).isDisabled(), true);
  await focusIs(page, "BUTTON Newer");
  await page.keyboard.press("Enter");
  await page.locator("tr[data-file]", { hasText: /^file-50\.csv/ }).waitFor();
  await focusIs(page, "BUTTON Older");
  assert.deepEqual(problems, []);
});

test("a new task by the keyboard: the uploaded files stay open when the last is unchosen, a removed upload moves the focus on, a refusal keeps it, uploads are said", {
  skip,
}, async () => {
  const token = await newUser();
  const fileId = (await uploadFile(s.base, token, "chosen.csv", "a,b\n1,2\n")).fileId;
  const page = await s.signedIn(token);
  await page.goto(`${s.base}/#/new`);
  await page.getByRole("radio", { name: /^summary/ }).waitFor();
  await page.locator("summary").focus();
  await page.keyboard.press("Enter");
  const box = page.getByRole("checkbox", { name: /chosen\.csv/ });
  await box.focus();
  await page.keyboard.press("Space");
  await page.getByText("(1 chosen)").waitFor();
  await page.keyboard.press("Space");
  await page.getByText("(0 chosen)").waitFor();
  assert.equal(await page.locator("details").evaluate((d) => (d as { open: boolean }).open), true);
  await focusIs(page, "INPUT");
  assert.equal(await box.evaluate((el) => el === el.ownerDocument.activeElement), true);

  // Uploads (the picker is a file input the keyboard reaches; the browser's own dialog is not the
  // page's), said when they end.
  const dir = fs.mkdtempSync(path.join(s.env.dataDir, "keyboard-"));
  const files = ["first.csv", "second.csv"].map((n) => {
    fs.writeFileSync(path.join(dir, n), "a,b\n1,2\n");
    return path.join(dir, n);
  });
  await page.locator('input[type="file"]').setInputFiles(files);
  await page.getByRole("status").filter({ hasText: "2 of 2 uploads done." }).waitFor();
  await page.getByRole("button", { name: "Remove first.csv" }).focus();
  await page.keyboard.press("Enter");
  await focusIs(page, "BUTTON Remove second.csv");
  await page.keyboard.press("Enter");
  await page.locator("li.upload").first().waitFor({ state: "detached" });
  assert.equal(await page.locator(":focus").getAttribute("type"), "file");

  // A refusal (the file chosen deleted meanwhile): said, and the focus stays on the button.
  await box.focus();
  await page.keyboard.press("Space");
  const gone = await fetch(`${s.base}/api/files/${fileId}`, {
    method: "DELETE",
    headers: { authorization: `Bearer ${token}` },
  });
  assert.equal(gone.status, 200);
  const start = page.getByRole("button", { name: "Start summary over 1 file" });
  await start.focus();
  await page.keyboard.press("Enter");
  await page.getByRole("alert").waitFor();
  await focusIs(page, "BUTTON Start summary over 1 file");
  assert.deepEqual(problems, []);
});

test("a task by the keyboard: the tabs are one stop moved by the arrows, the run's buttons name its file, its end is said, a download keeps the focus, a cancel focuses its note", {
  skip,
}, async () => {
  const token = await newUser();
  const fileId = (await uploadFile(s.base, token, "données.csv", "a,b\n1,2\n3,4\n")).fileId;
  s.worker?.kill("SIGSTOP");
  let taskId: string;
  let page: Page;
  try {
    taskId = await createTask(token, [fileId]);
    page = await s.signedIn(token);
    await page.goto(`${s.base}/#/tasks/${taskId}`);
    await page.locator(".task header .badge", { hasText: "queued" }).waitFor();
  } finally {
    s.worker?.kill("SIGCONT");
  }
  // The end of the task, said once by a live region (not each step of its progress).
  const ended = page
    .getByRole("status")
    .filter({ hasText: `Task #${taskId} succeeded: 1 of 1 runs succeeded.` });
  await ended.waitFor({ timeout: 60_000 });

  const tabs = page.getByRole("tab");
  assert.deepEqual(await tabs.evaluateAll((ts) => ts.map((t) => t.getAttribute("tabindex"))), [
    "0",
    "-1",
    "-1",
  ]);
  // Each tab's aria-controls names a panel that is there.
  for (const id of await tabs.evaluateAll((ts) => ts.map((t) => t.getAttribute("aria-controls"))))
    if (id !== null) assert.equal(await page.locator(`#${id}`).count(), 1, id);
  await page.getByRole("tab", { name: "Runs" }).focus();
  await page.keyboard.press("ArrowRight");
  await focusIs(page, "BUTTON Results");
  assert.equal(await page.getByRole("tab", { name: "Results" }).getAttribute("aria-selected"), "true");
  await page.getByRole("tabpanel", { name: "Results" }).locator("table.results").waitFor();
  // The sort's arrow is not part of the column's name.
  const sorted = page.locator("table.results thead th").first();
  assert.equal(await sorted.getAttribute("aria-sort"), "ascending");
  const column = ((await sorted.locator(".name").textContent()) ?? "").trim();
  await page.getByRole("columnheader", { name: column, exact: true }).waitFor();
  await page.keyboard.press("End");
  await focusIs(page, "BUTTON Event log");
  await page.keyboard.press("ArrowRight");
  await focusIs(page, "BUTTON Runs");
  await page.keyboard.press("ArrowLeft");
  await focusIs(page, "BUTTON Event log");
  await page.keyboard.press("Home");
  await focusIs(page, "BUTTON Runs");
  assert.deepEqual(await tabs.evaluateAll((ts) => ts.map((t) => t.getAttribute("tabindex"))), [
    "0",
    "-1",
    "-1",
  ]);
  // One Tab from the tab list goes into the panel, not to the next tab.
  await page.keyboard.press("Tab");
  await focusIs(page, /^SELECT/);

  // The row's buttons say which run they act on.
  const row = page.locator("tr[data-run]");
  await row.getByRole("button", { name: "results of données.csv", exact: true }).waitFor();
  await row.getByRole("button", { name: "download output of données.csv", exact: true }).waitFor();

  // Download all by the keyboard: the focus stays on the button.
  const all = page.getByRole("button", { name: "Download all" });
  await all.focus();
  const [download] = await Promise.all([page.waitForEvent("download"), page.keyboard.press("Enter")]);
  assert.equal(await download.failure(), null);
  await page.locator(".task .actions button:not([aria-disabled])", { hasText: "Download all" }).waitFor();
  await focusIs(page, "BUTTON Download all");

  // A cancel: the button goes, the focus goes to the note that says what happened.
  s.worker?.kill("SIGSTOP");
  try {
    const queued = await createTask(token, [fileId]);
    await page.goto(`${s.base}/#/tasks/${queued}`);
    await page.locator(".task header .badge", { hasText: "queued" }).waitFor();
    await page.getByRole("button", { name: "Cancel task" }).focus();
    await page.keyboard.press("Enter");
    await page.getByRole("status").filter({ hasText: "Cancel requested" }).waitFor();
    await focusIs(page, /^P Cancel requested: the task is (cancelled|cancelling)\.$/);
  } finally {
    s.worker?.kill("SIGCONT");
  }
  assert.deepEqual(problems, []);
});

test("seen: the focus ring stands out on the page and in the header, warning text is legible, bars do not move for reduced motion", {
  skip,
}, async () => {
  const token = await newUser();
  const page = await s.signedIn(token);
  await page.goto(`${s.base}/#/files`);
  await page.getByText("No files yet").waitFor();
  // A control on the page, focused by the keyboard: its ring against the page's white.
  await page.getByRole("button", { name: "Sign out" }).focus();
  await page.keyboard.press("Tab");
  await focusIs(page, "A Upload some.");
  // The focused element's outline, and the background it is drawn on (the first ancestor's that has one).
  const ring = (): Promise<{ what: string; outline: string; color: string; bg: string }> =>
    page.evaluate(`(() => {
      const at = document.activeElement;
      const style = getComputedStyle(at);
      let bg = "rgba(0, 0, 0, 0)";
      for (let el = at.parentElement; el && /rgba\\(0, 0, 0, 0\\)|transparent/.test(bg); el = el.parentElement)
        bg = getComputedStyle(el).backgroundColor;
      return { what: at.tagName, outline: style.outlineStyle, color: style.outlineColor, bg };
    })()`);
  const onPage = await ring();
  assert.equal(onPage.outline, "solid", JSON.stringify(onPage));
  assert.ok(contrast(onPage.color, onPage.bg) >= 3, JSON.stringify(onPage));
  // In the dark header.
  await page.keyboard.press("Shift+Tab");
  const inHeader = await ring();
  assert.equal(inHeader.what, "BUTTON");
  assert.ok(contrast(inHeader.color, inHeader.bg) >= 3, JSON.stringify(inHeader));
  // Warning text (a task's "Timed out" count) against white: 4.5:1 at least.
  const warn = await styleOf(page, "dd", "warn", "color");
  assert.ok(contrast(warn, "rgb(255, 255, 255)") >= 4.5, warn);
  // Reduced motion: the bars' segments jump, they do not slide.
  const transition = () => styleOf(page, "span", "seg", "transitionDuration");
  assert.equal(await transition(), "0.3s");
  await page.emulateMedia({ reducedMotion: "reduce" });
  assert.equal(await transition(), "0s");
  assert.deepEqual(problems, []);
});
