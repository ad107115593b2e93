// The dashboard for someone using a keyboard only, or a screen reader: every flow by the keyboard,
// the focus put somewhere sensible after a move, a question, a deletion, a cancel (never lost to
// <body>), the task page's tabs as a tab list (one Tab stop, the arrows between them), controls named
// by what they act on, what matters said by live regions, a title per view, and the focus ring, text
// colours and motion as the user needs them. Real API and worker processes, Debian's chromium. Waits
// on conditions, never on time.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import type { Locator, Page } from "playwright-core";
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

/** The focused element's outline, and the background it is drawn on (the first ancestor's that has one). */
const ring = (page: Page): Promise<{ what: string; outline: string; color: string; bg: string }> =>
  page.evaluate(`(() => {
    const at = document.activeElement;
    const style = getComputedStyle(at);
    let bg = "rgba(0, 0, 0, 0)";
    for (let el = at.parentElement; el && /rgba\\(0, 0, 0, 0\\)|transparent/.test(bg); el = el.parentElement)
      bg = getComputedStyle(el).backgroundColor;
    return { what: at.tagName, outline: style.outlineStyle, color: style.outlineColor, bg };
  })()`);

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
  // The field's hint names a command that works (until 2026-12-07: `assay token create &lt;name&gt;`,
  // the entities shown as they were, and a command that exits 2 without --user).
  assert.equal(
    await page.locator("#token-help").textContent(),
    "Kept in this browser only. Create one with assay token create --user <name>.",
  );
  await page.keyboard.press("Tab");
  await focusIs(page, "BUTTON Skip to main content");
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
  // How to sort, said for every user (it said "Click a column to sort" until 2026-12-06).
  const how =
    (await page.getByRole("tabpanel", { name: "Results" }).locator("p.muted").first().textContent()) ?? "";
  assert.match(how, /Choose a column's heading to sort by it \(again to reverse\)/);
  assert.doesNotMatch(how, /click|mouse|hover/i);
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
  const onPage = await ring(page);
  assert.equal(onPage.outline, "solid", JSON.stringify(onPage));
  assert.ok(contrast(onPage.color, onPage.bg) >= 3, JSON.stringify(onPage));
  // In the dark header.
  await page.keyboard.press("Shift+Tab");
  const inHeader = await ring(page);
  assert.equal(inHeader.what, "BUTTON");
  assert.ok(contrast(inHeader.color, inHeader.bg) >= 3, JSON.stringify(inHeader));
  // Coloured text (a task's "Succeeded", "Failed" and "Timed out" counts, muted notes) against white:
  // 4.5:1 at least. The green was 4.4:1 until 2026-12-07.
  for (const kind of ["warn", "ok", "bad", "muted"]) {
    const color = await styleOf(page, "dd", kind, "color");
    assert.ok(contrast(color, "rgb(255, 255, 255)") >= 4.5, `${kind}: ${color}`);
  }
  // Reduced motion: the bars' segments jump, they do not slide.
  const transition = () => styleOf(page, "span", "seg", "transitionDuration");
  assert.equal(await transition(), "0.3s");
  await page.emulateMedia({ reducedMotion: "reduce" });
  assert.equal(await transition(), "0s");
  assert.deepEqual(problems, []);
});

/** The width of `locator`'s box: 1 or less for what is out of sight (visually hidden). */
const widthOf = async (locator: Locator): Promise<number> => (await locator.boundingBox())?.width ?? 0;

test("a skip link is every view's first Tab stop, seen only while focused, with the focus ring; it moves the focus to the main region and leaves the address alone", {
  skip,
}, async () => {
  const token = await newUser();
  const fileId = (await uploadFile(s.base, token, "skipped.csv", "a,b\n1,2\n")).fileId;
  const taskId = await createTask(token, [fileId]);
  await waitForTerminal(s.env.db.sql, taskId, 60_000);
  const page = await s.open("#/");
  // Each view (reloaded: the focus starts from the top of the page), and what the first Tab after the
  // skip reaches: the view's first control, past the header's.
  const views: [string, string, string | RegExp][] = [
    ["#/", "Assay", "INPUT"],
    ["#/", "Tasks", "A New task"],
    ["#/files", "Files", "INPUT"],
    ["#/new", "New task", /^INPUT/],
    [`#/tasks/${taskId}`, `Task #${taskId}`, /^BUTTON Download all/],
    ["#/nowhere", "Not found", "A All tasks"],
  ];
  for (const [i, [hash, heading, first]] of views.entries()) {
    if (i === 1) await s.signIn(page, token);
    await page.goto(`${s.base}/${hash}`);
    await page.reload();
    await page.getByRole("heading", { name: heading }).first().waitFor();
    const link = page.getByRole("button", { name: "Skip to main content" });
    assert.ok((await widthOf(link)) <= 1, `${hash}: the skip link is out of sight until focused`);
    const title = await page.title();
    await page.keyboard.press("Tab");
    await focusIs(page, "BUTTON Skip to main content");
    assert.ok((await widthOf(link)) > 20, `${hash}: the focused skip link is seen`);
    const seen = await ring(page);
    assert.equal(seen.outline, "solid", JSON.stringify(seen));
    assert.ok(contrast(seen.color, seen.bg) >= 3, JSON.stringify(seen));
    await page.keyboard.press("Enter");
    assert.equal(await page.evaluate("document.activeElement.id"), "main", hash);
    // Not a move of the hash router's: the same address, view and title.
    assert.equal(new URL(page.url()).hash, hash === "#/" && i === 0 ? "#/" : hash);
    assert.equal(await page.title(), title);
    await page.getByRole("heading", { name: heading }).first().waitFor();
    assert.ok((await widthOf(link)) <= 1, `${hash}: out of sight again`);
    await page.keyboard.press("Tab");
    await focusIs(page, first);
    // The main region takes the focus from the skip link only: a click on its text does not.
    assert.equal(await page.locator("main").getAttribute("tabindex"), null);
  }
  // Back from a view whose main region has the focus: the focus goes to the heading of the view shown.
  await page.goto(`${s.base}/#/`);
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Files" }).focus();
  await page.keyboard.press("Enter");
  await focusIs(page, "H1 Files");
  await page.getByRole("button", { name: "Skip to main content" }).focus();
  await page.keyboard.press("Enter");
  assert.equal(await page.evaluate("document.activeElement.id"), "main");
  await page.goBack();
  await focusIs(page, "H1 Tasks");
  assert.deepEqual(problems, []);
});

/**
 * Why `control` is disabled, as a keyboard or screen-reader user gets it: the text of the elements its
 * aria-describedby names, each one seen on the page ("" when none). A `title` (a tooltip, which the
 * keyboard and touch never show) fails.
 */
async function whyDisabled(control: Locator): Promise<string> {
  assert.equal(await control.getAttribute("title"), null, "a reason only in a tooltip");
  return control.evaluate((el) =>
    (el.getAttribute("aria-describedby") ?? "")
      .split(" ")
      .filter(Boolean)
      .map((id: string) => {
        const note = el.ownerDocument.getElementById(id);
        if (!note?.checkVisibility() || note.getBoundingClientRect().width <= 1) return `(${id}: not seen)`;
        return (note.textContent ?? "").trim();
      })
      .join(" "),
  );
}

test("a disabled control says why, in text seen next to it and tied to it (aria-describedby), not in a tooltip", {
  skip,
}, async () => {
  const token = await newUser();
  const fileId = (await uploadFile(s.base, token, "why.csv", "a,b\n1,2\n")).fileId;
  const page = await s.signedIn(token);

  // New task: "Start" without files.
  await page.goto(`${s.base}/#/new`);
  await page.getByRole("radio", { name: /^summary/ }).waitFor();
  const start = page.getByRole("button", { name: /^Start summary over/ });
  assert.equal(await start.isDisabled(), true);
  assert.equal(await whyDisabled(start), "Add files, or choose uploaded ones.");
  await page.locator("summary").click();
  await page.getByRole("checkbox", { name: /why\.csv/ }).check();
  assert.equal(await start.isDisabled(), false);
  assert.equal(await whyDisabled(start), "");

  // Files: the two buttons over the list with nothing selected.
  await page.goto(`${s.base}/#/files`);
  await page.locator("tr[data-file]").first().waitFor();
  const del = page.getByRole("button", { name: "Delete 0 selected" });
  assert.equal(await del.isDisabled(), true);
  assert.equal(await whyDisabled(del), "Select files in the list first.");
  const newTask = page.locator("a.button", { hasText: "New task with 0 selected" });
  assert.equal(await newTask.getAttribute("aria-disabled"), "true");
  assert.equal(await whyDisabled(newTask), "Select files in the list first.");
  await page.getByRole("checkbox", { name: "why.csv" }).check();
  assert.equal(await whyDisabled(page.getByRole("button", { name: "Delete 1 selected" })), "");

  // A task: "Download all" while it waits, then once it ended with nothing to download.
  s.worker?.kill("SIGSTOP");
  try {
    const taskId = await createTask(token, [fileId]);
    await page.goto(`${s.base}/#/tasks/${taskId}`);
    await page.locator(".task header .badge", { hasText: "queued" }).waitFor();
    const all = page.getByRole("button", { name: "Download all" });
    assert.equal(await all.isDisabled(), true);
    assert.equal(await whyDisabled(all), "Available when the task has finished.");
    const cancelled = await fetch(`${s.base}/api/analysis-tasks/${taskId}/cancel`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
    });
    assert.equal(cancelled.status, 202);
    await page.locator(".task header .badge", { hasText: "cancelled" }).waitFor();
    assert.equal(await all.isDisabled(), true);
    assert.equal(await whyDisabled(all), "No run succeeded: there is nothing to download.");
  } finally {
    s.worker?.kill("SIGCONT");
  }

  // "Cancel task" while the task is being cancelled: a run under way (python-stats' median over
  // 300,000 rows takes seconds) whose worker is paused, so the cancel cannot end it yet.
  const rows = Array.from({ length: 300_000 }, (_, i) => `${i % 977},${i % 13}`).join("\n");
  const bigId = (await uploadFile(s.base, token, "long.csv", `a,b\n${rows}\n`)).fileId;
  const res = await fetch(`${s.base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({
      analysisType: "python-stats",
      inputFileIds: [bigId],
      parameters: { method: "median" },
    }),
  });
  assert.equal(res.status, 201);
  const longTask = ((await res.json()) as { data: { taskId: string } }).data.taskId;
  await waitFor(
    async () =>
      (
        await s.env.db
          .sql`select 1 from runs where task_id = ${longTask} and status in ('starting', 'running')`
      ).length > 0,
    60_000,
    "the run under way",
  );
  s.worker?.kill("SIGSTOP");
  try {
    const asked = await fetch(`${s.base}/api/analysis-tasks/${longTask}/cancel`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
    });
    assert.equal(asked.status, 202);
    await page.goto(`${s.base}/#/tasks/${longTask}`);
    await page.locator(".task header .badge", { hasText: "cancelling" }).waitFor();
    const cancel = page.getByRole("button", { name: "Cancel task" });
    assert.equal(await cancel.isDisabled(), true);
    assert.equal(await whyDisabled(cancel), "The task is being cancelled.");
    assert.equal(
      await whyDisabled(page.getByRole("button", { name: "Download all" })),
      "Available when the task has finished.",
    );
  } finally {
    s.worker?.kill("SIGCONT");
  }
  await waitForTerminal(s.env.db.sql, longTask, 60_000);
  assert.deepEqual(problems, []);
});

test("a task that ends while the keyboard is on its Cancel button (which goes) moves the focus to Download all", {
  skip,
}, async () => {
  const token = await newUser();
  const fileId = (await uploadFile(s.base, token, "ends.csv", "a,b\n1,2\n")).fileId;
  let page: Page;
  let taskId: string;
  s.worker?.kill("SIGSTOP");
  try {
    taskId = await createTask(token, [fileId]);
    page = await s.signedIn(token);
    await page.goto(`${s.base}/#/tasks/${taskId}`);
    await page.locator(".task header .badge", { hasText: "queued" }).waitFor();
    await page.getByRole("button", { name: "Cancel task" }).focus();
    await focusIs(page, "BUTTON Cancel task");
  } finally {
    s.worker?.kill("SIGCONT");
  }
  await page.locator(".task header .badge", { hasText: "succeeded" }).waitFor({ timeout: 60_000 });
  assert.equal(await page.getByRole("button", { name: "Cancel task" }).count(), 0);
  await focusIs(page, "BUTTON Download all");
  assert.deepEqual(problems, []);
});

/** Whether `locator` is seen: rendered, and wider than a visually hidden element's 1 px. */
const seen = (locator: Locator): Promise<boolean> =>
  locator.evaluate((el) => el.checkVisibility() && el.getBoundingClientRect().width > 1);

test("a queued task's place says why in text: seen under it on the task page, in a disclosure the keyboard opens in the list", {
  skip,
}, async () => {
  const token = await newUser();
  const other = await newUser();
  const mine = (await uploadFile(s.base, token, "waits.csv", "a,b\n1,2\n")).fileId;
  const theirs = (await uploadFile(s.base, other, "theirs.csv", "a,b\n1,2\n")).fileId;
  const urgent = (await uploadFile(s.base, s.adminToken, "urgent.csv", "a,b\n1,2\n")).fileId;
  s.worker?.kill("SIGSTOP");
  try {
    // A run of a higher priority (only an admin may set one) and another user's at the same: both
    // are reasons the estimate gives.
    const first = await fetch(`${s.base}/api/analysis-tasks`, {
      method: "POST",
      headers: { authorization: `Bearer ${s.adminToken}`, "content-type": "application/json" },
      body: JSON.stringify({ analysisType: "summary", inputFileIds: [urgent], priority: 0 }),
    });
    assert.equal(first.status, 201);
    await createTask(other, [theirs]);
    const taskId = await createTask(token, [mine]);
    const why =
      /An estimate: \d+ of a higher priority; \d+ other users? served in turn\. What arrives or finishes meanwhile changes it\./;

    // The task page: the why is text seen under the number, not a tooltip.
    const page = await s.signedIn(token);
    await page.goto(`${s.base}/#/tasks/${taskId}`);
    const place = page.locator(".counts .queue-place");
    await place.filter({ hasText: /runs? ahead \(estimate\)/ }).waitFor();
    assert.equal(await place.getAttribute("title"), null, "the why only in a tooltip");
    const reasons = place.locator(".queue-why");
    await reasons.filter({ hasText: why }).waitFor();
    assert.equal(await seen(reasons), true, "the why is seen");

    // The task list: a disclosure, closed, that the keyboard opens.
    await page.goto(`${s.base}/#/?status=queued`);
    const row = page.locator(`tr[data-task="${taskId}"]`);
    const listed = row.locator(".queue-place");
    await listed.waitFor();
    assert.equal(await listed.getAttribute("title"), null, "the why only in a tooltip");
    const listedWhy = listed.locator(".queue-why");
    assert.match((await listedWhy.textContent()) ?? "", why);
    assert.equal(await seen(listedWhy), false, "closed at first");
    await row.getByRole("link").focus();
    await page.keyboard.press("Tab");
    await focusIs(page, /^SUMMARY ≈ \d+ runs? ahead \(estimate\)/);
    await page.keyboard.press("Enter");
    await waitFor(() => seen(listedWhy), 10_000, "the why seen once opened");
    // Still open after the list's next re-reads (every 2 s while a task on it is going).
    await page.waitForResponse((r) => r.url().includes("/api/analysis-tasks?"));
    await page.waitForResponse((r) => r.url().includes("/api/analysis-tasks?"));
    assert.equal(await seen(listedWhy), true, "still open");
  } finally {
    s.worker?.kill("SIGCONT");
  }
  assert.deepEqual(problems, []);
});

test("a file's whole SHA-256: a button shows it in a field the keyboard selects and copies, Escape hides it again", {
  skip,
}, async () => {
  const token = await newUser();
  const content = "a,b\n1,2\n";
  const sha = createHash("sha256").update(content).digest("hex");
  await uploadFile(s.base, token, "hashed.csv", content);
  const page = await s.signedIn(token);
  await page.goto(`${s.base}/#/files`);
  const row = page.locator("tr[data-file]", { hasText: "hashed.csv" });
  await row.waitFor();
  // Its start is seen, and the button that shows it whole says which file's it is (its description:
  // a name holding the file's would answer a search for another button, "Keep" for "keep.csv").
  const button = row.getByRole("button", { name: `${sha.slice(0, 12)}…, SHA-256`, exact: true });
  assert.equal(await button.getAttribute("aria-expanded"), "false");
  assert.equal(
    await button.evaluate(
      (el) => el.ownerDocument.getElementById(el.getAttribute("aria-describedby") ?? "")?.textContent,
    ),
    "hashed.csv",
  );
  assert.equal(await row.locator("[title]").count(), 0, "the whole value only in a tooltip");
  await button.focus();
  await page.keyboard.press("Enter");
  assert.equal(await button.getAttribute("aria-expanded"), "true");
  await page.keyboard.press("Tab");
  await focusIs(page, "INPUT SHA-256 of hashed.csv");
  const field = row.getByRole("textbox", { name: "SHA-256 of hashed.csv" });
  assert.equal(await field.inputValue(), sha);
  assert.equal(await seen(field), true);
  // Selected whole: Ctrl+C copies it.
  assert.deepEqual(
    await field.evaluate((el) => {
      const input = el as unknown as { selectionStart: number; selectionEnd: number };
      return [input.selectionStart, input.selectionEnd];
    }),
    [0, 64],
  );
  // Selected by the field itself, not only by Tab's own habit: focused again with the caret at its start.
  assert.deepEqual(
    await field.evaluate((el) => {
      const input = el as unknown as {
        selectionStart: number;
        selectionEnd: number;
        setSelectionRange(a: number, b: number): void;
        blur(): void;
        focus(): void;
      };
      input.setSelectionRange(0, 0);
      input.blur();
      input.focus();
      return [input.selectionStart, input.selectionEnd];
    }),
    [0, 64],
  );
  // Escape hides it, and the focus goes back to the button.
  await page.keyboard.press("Escape");
  await focusIs(page, `BUTTON ${sha.slice(0, 12)}…, SHA-256`);
  await field.waitFor({ state: "detached" });
  assert.equal(await button.getAttribute("aria-expanded"), "false");
  assert.deepEqual(problems, []);
});

test("a task's row that a re-read takes away (a status filter) while the keyboard is on it passes the focus to the next row, then to the heading", {
  skip,
}, async () => {
  const token = await newUser();
  const fileId = (await uploadFile(s.base, token, "filtered.csv", "a,b\n1,2\n")).fileId;
  const cancel = async (taskId: string) => {
    const res = await fetch(`${s.base}/api/analysis-tasks/${taskId}/cancel`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
    });
    assert.equal(res.status, 202);
  };
  s.worker?.kill("SIGSTOP");
  try {
    const older = await createTask(token, [fileId]);
    const newer = await createTask(token, [fileId]);
    const page = await s.signedIn(token);
    await page.goto(`${s.base}/#/?status=queued`);
    await page.locator(`tr[data-task="${older}"]`).waitFor();
    // Newest first: the keyboard on the first row's link.
    await page.locator(`tr[data-task="${newer}"]`).getByRole("link").focus();
    await focusIs(page, `A #${newer}`);
    await cancel(newer);
    await page.locator(`tr[data-task="${newer}"]`).waitFor({ state: "detached", timeout: 15_000 });
    await focusIs(page, `A #${older}`);
    // The last row goes: the list's heading.
    await cancel(older);
    await page.getByText("No tasks match these filters").waitFor({ timeout: 15_000 });
    await focusIs(page, "H1 Tasks");
  } finally {
    s.worker?.kill("SIGCONT");
  }
  assert.deepEqual(problems, []);
});

test("a run's row that a re-read takes away (a status filter) while the keyboard is on it passes the focus to the Runs tab", {
  skip,
}, async () => {
  const token = await newUser();
  const ids = [
    (await uploadFile(s.base, token, "run-1.csv", "a,b\n1,2\n")).fileId,
    (await uploadFile(s.base, token, "run-2.csv", "a,b\n1,2\n")).fileId,
  ];
  let page: Page;
  s.worker?.kill("SIGSTOP");
  try {
    const taskId = await createTask(token, ids);
    page = await s.signedIn(token);
    await page.goto(`${s.base}/#/tasks/${taskId}`);
    await page.locator(".task header .badge", { hasText: "queued" }).waitFor();
    await page.getByLabel("Run status").selectOption("queued");
    await page.locator("tr[data-run]").nth(1).waitFor();
    const results = page.getByRole("button", { name: "results of run-2.csv", exact: true });
    await results.focus();
    await focusIs(page, "BUTTON results of run-2.csv");
  } finally {
    s.worker?.kill("SIGCONT");
  }
  // The runs start and end: neither is queued any more, and the re-read after their end shows none.
  await page.locator(".task header .badge", { hasText: "succeeded" }).waitFor({ timeout: 60_000 });
  await page.locator("tr[data-run]").first().waitFor({ state: "detached", timeout: 15_000 });
  await focusIs(page, "BUTTON Runs");
  assert.deepEqual(problems, []);
});
