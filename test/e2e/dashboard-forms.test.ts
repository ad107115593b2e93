// The dashboard's new-task form, file picking and results in a real browser (Debian's chromium driven
// by playwright-core, a real `assay api` process): a submit whose answer was lost, sent again; the API's
// refusal of a parameter shown at its field; a zero-byte upload; files chosen on a later page of the
// files page; the results table of names the API guarded against spreadsheets. Each test opens its own
// browser context, signed in as a user of its own, and waits on conditions, never on time. Runs are
// done by a worker in this process whose "summary" is a test program (metric keys a user's columns
// could give: a bidi override, a zero-width space, a formula), and whose "r-report" is one that echoes
// its title in its progress and error messages, as programs echo what users give them.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { browserSkip, dashboardSuite, uploadFile } from "../helpers/browser.ts";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, writeProgram } from "../helpers/runner.ts";

const skip = browserSkip;

/** Lets the "r-report" program end. */
const RELEASE = () => path.join(s.env.dataDir, "release-echo");

const s = dashboardSuite(
  {},
  {
    setup: async () => {
      // "summary" here is a program of this test's: one output, and metric keys as hostile as a CSV's
      // column names can make them.
      const program = writeProgram(
        s.env.dataDir,
        "hostile-metrics",
        `fs.writeFileSync(path.join(out, "table.csv"), "a,b\\n1,2\\n");
say({ type: "result", outputFileName: "table.csv", metrics: { "-delta": -3, "\\u202Esj.exe": 5, "=SUM(A1)": 2, "a\\u200Bb": 1 } });`,
      );
      // It fails once the test has seen its progress (RELEASE exists).
      const echo = writeProgram(
        s.env.dataDir,
        "echo-title",
        `const { title } = JSON.parse(arg("--params"));
say({ type: "progress", percent: 50, message: \`drawing \${title}\` });
while (!fs.existsSync(${JSON.stringify(RELEASE())})) await new Promise((r) => setTimeout(r, 50));
say({ type: "error", message: \`no numeric column for \${title}\` });
process.exit(3);`,
      );
      await s.env.worker([fixtureProgram("summary", program), fixtureProgram("r-report", echo)]).start();
    },
  },
);
/** Problems the pages reported: script errors, CSP violations, dialogs. */
const { problems } = s;

let users = 0;
/** A user of the test's own (a token for a new user): their files and tasks are only the test's. */
async function newUser(): Promise<string> {
  users++;
  return (await tokenCreate(s.env.db.sql, `forms-${users}-Ünïcode`, "user")).token;
}

const upload = async (token: string, name: string, content: string) =>
  (await uploadFile(s.base, token, name, content)).fileId;

/** Files on disk for the browser's file picker. */
function localFiles(files: Record<string, string>): string[] {
  const dir = fs.mkdtempSync(path.join(s.env.dataDir, "picked-"));
  return Object.entries(files).map(([name, content]) => {
    const file = path.join(dir, name);
    fs.writeFileSync(file, content);
    return file;
  });
}

/** The tasks whose inputs include `fileId`. */
async function tasksOver(fileId: string): Promise<string[]> {
  const rows = await s.env.db.sql<{ id: string }[]>`
    select distinct task_id, task_id::text as id from runs where input_file_id = ${fileId} order by task_id`;
  return rows.map((r) => r.id);
}

test("a submit whose answer was lost, sent again, gets the task it created, not a second one", {
  skip,
}, async () => {
  const token = await newUser();
  const fileId = await upload(token, "lost-answer.csv", "a,b\n1,2\n");
  const page = await s.signedIn(token);
  // The first request reaches the API, which creates the task; its answer never reaches the page
  // (the connection drops), so the page cannot know.
  const keys: (string | undefined)[] = [];
  let dropped = false;
  await page.route(/\/api\/analysis-tasks$/, async (route) => {
    if (route.request().method() !== "POST") return route.continue();
    keys.push(route.request().headers()["idempotency-key"]);
    if (dropped) return route.continue();
    dropped = true;
    await route.fetch();
    await route.abort("connectionreset");
  });
  await page.goto(`${s.base}/#/new?files=${fileId}`);
  await page.getByLabel("summary").check();
  const submit = page.getByRole("button", { name: "Start summary over 1 file" });
  await submit.click();
  // Said plainly, and the form is there to try again.
  await page.getByRole("alert").filter({ hasText: "NETWORK" }).waitFor();
  assert.match((await page.getByRole("alert").textContent()) ?? "", /could not be reached/);
  assert.equal((await tasksOver(fileId)).length, 1, "the request whose answer was lost made its task");
  await submit.click();
  await page.waitForURL(/#\/tasks\/\d+$/);
  const created = await tasksOver(fileId);
  assert.equal(created.length, 1, `one task, not ${created.length}`);
  assert.equal(page.url().split("#/tasks/")[1], created[0], "the page shows the task the first request made");
  assert.equal(keys.length, 2);
  assert.match(keys[0] ?? "", /^[0-9a-f]{32}$/);
  assert.equal(keys[1], keys[0], "sent again with the same Idempotency-Key");
  // A double click sends one request.
  const other = await upload(token, "double-click.csv", "a,b\n1,2\n");
  await page.goto(`${s.base}/#/new?files=${other}`);
  await page.getByLabel("summary").check();
  await page.getByRole("button", { name: "Start summary over 1 file" }).dblclick();
  await page.waitForURL(/#\/tasks\/\d+$/);
  assert.equal((await tasksOver(other)).length, 1);
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("the API's refusal of a parameter is shown at its field, which is focused; an edit clears it", {
  skip,
}, async () => {
  const token = await newUser();
  const [file] = localFiles({ "paramètres.csv": "a,b\n1,2\n" });
  const page = await s.signedIn(token);
  await page.goto(`${s.base}/#/new`);
  await page.getByLabel("python-stats").check();
  await page.locator('input[type="file"]').setInputFiles([file as string]);
  await page.locator("li.upload.done").waitFor();
  await page.locator("#param-method").selectOption("median");
  // The form does not check a column's length: the API does, and names the field.
  const columns = page.locator("#param-columns");
  await columns.fill(`a\n${"é".repeat(201)}`);
  await page.getByRole("button", { name: "Start python-stats over 1 file" }).click();
  const field = page.locator(".field", { has: columns });
  const note = field.getByRole("alert");
  await note.waitFor();
  assert.equal(
    await note.textContent(),
    "VALIDATION_FAILED body/parameters/columns/1 must NOT have more than 200 characters",
  );
  assert.equal(await columns.getAttribute("aria-invalid"), "true");
  assert.match((await columns.getAttribute("aria-describedby")) ?? "", /param-columns-problem/);
  await waitFor(
    async () =>
      columns.evaluate(
        (el) => el === (el as { ownerDocument: { activeElement: unknown } }).ownerDocument.activeElement,
      ),
    5_000,
    "focus",
  );
  // Shown once, at the field: no second copy by the button.
  assert.equal(await page.getByRole("alert").count(), 1);
  await columns.fill("a\nb");
  await note.waitFor({ state: "detached" });
  assert.equal(await columns.getAttribute("aria-invalid"), null);
  await page.getByRole("button", { name: "Start python-stats over 1 file" }).click();
  await page.waitForURL(/#\/tasks\/\d+$/);
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("a zero-byte file's finished upload shows a full bar", { skip }, async () => {
  const token = await newUser();
  const files = localFiles({ "vide — 空.csv": "", "one.csv": "a\n1\n" });
  const page = await s.signedIn(token);
  await page.goto(`${s.base}/#/new`);
  await page.locator('input[type="file"]').setInputFiles(files);
  const empty = page.locator("li.upload.done", { hasText: "vide — 空.csv" });
  await empty.waitFor();
  await page.locator("li.upload.done", { hasText: "one.csv" }).waitFor();
  assert.equal(await empty.getByRole("progressbar").getAttribute("aria-valuenow"), "100");
  assert.equal(await empty.locator(".size").textContent(), "0 B");
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("files chosen on a later page of the files page are listed, by name, on the new-task form", {
  skip,
}, async () => {
  const token = await newUser();
  // 51 files: the oldest is on the second page of 50, and not among the form's first 50.
  const oldest = await upload(token, "ältest <b>1 #?%.csv", "a\n1\n");
  for (let i = 0; i < 50; i++) await upload(token, `neu-${i}.csv`, `a\n${i}\n`);
  const page = await s.signedIn(token);
  await page.goto(`${s.base}/#/files`);
  await page.locator("tr[data-file]").first().waitFor();
  await page.getByRole("button", { name: "Older" }).click();
  await page.locator(`tr[data-file="${oldest}"]`).getByRole("checkbox").check();
  await page.getByRole("link", { name: "New task with 1 selected" }).click();
  await page.getByText("Or choose uploaded files (1 chosen)").waitFor();
  const listed = page.locator("ul.known li", { hasText: "ältest <b>1 #?%.csv" });
  await listed.waitFor();
  assert.equal(await listed.getByRole("checkbox").isChecked(), true);
  // It can be unchosen there.
  await listed.getByRole("checkbox").uncheck();
  await page.getByText("Or choose uploaded files (0 chosen)").waitFor();
  // An id that names no file of this user's says so, where it can be unchosen. The files page is
  // shown in between, so the form is a new one (a form still shown keeps the files it was opened with).
  await page.goto(`${s.base}/#/files`);
  await page.locator("tr[data-file]").first().waitFor();
  await page.goto(`${s.base}/#/new?files=${oldest},99999999999`);
  const missing = page.locator("ul.known li", { hasText: "file 99999999999" });
  await missing.filter({ hasText: "The file does not exist." }).waitFor();
  await missing.getByRole("checkbox").uncheck();
  await page.getByText("Or choose uploaded files (1 chosen)").waitFor();
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("the results table shows names as they are, not as guarded for spreadsheets; metric keys cannot reorder", {
  skip,
}, async () => {
  const token = await newUser();
  const fileId = await upload(token, "-data @home.csv", "a,b\n1,2\n");
  const res = await fetch(`${s.base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileIds: [fileId] }),
  });
  const taskId = ((await res.json()) as { data: { taskId: string } }).data.taskId;
  assert.equal((await waitForTerminal(s.env.db.sql, taskId, 60_000)).succeeded, 1);
  // The file itself keeps its guard.
  const csv = await (
    await fetch(`${s.base}/api/analysis-tasks/${taskId}/results.csv`, {
      headers: { authorization: `Bearer ${token}` },
    })
  ).text();
  assert.match(csv, /,'-data @home\.csv,/);
  assert.match(csv, /,'-delta,'=SUM\(A1\),a\u200bb,\u202esj\.exe\r\n/);
  const page = await s.signedIn(token);
  await page.goto(`${s.base}/#/tasks/${taskId}`);
  await page.getByRole("tab", { name: "Results" }).click();
  const table = page.locator("table.results");
  await table.waitFor();
  const head = (await table.locator("thead th").allTextContents()).map((t) => t.replace(/ [▲▼]$/, ""));
  assert.deepEqual(head.slice(9), ["-delta", "=SUM(A1)", "a⟨U+200B⟩b", "⟨U+202E⟩sj.exe"]);
  assert.deepEqual((await table.locator("tbody td").allTextContents()).slice(1, 3), [
    "-data @home.csv",
    "succeeded",
  ]);
  // Sorted by a metric, it is charted under its key.
  await table.getByRole("button", { name: "-delta" }).click();
  await page.locator("figure.chart figcaption", { hasText: "-delta" }).waitFor();
  // The run's metrics: the keys with an override or a zero-width space show them as code points.
  await page.getByRole("tab", { name: "Runs" }).click();
  await page.locator("tr[data-run]").getByRole("button", { name: "results" }).click();
  const metrics = page.getByRole("table", { name: "Metrics" });
  await metrics.waitFor();
  // (Stored as JSONB, whose keys come shortest first.)
  assert.deepEqual(await metrics.locator("th").allTextContents(), [
    "a⟨U+200B⟩b",
    "-delta",
    "=SUM(A1)",
    "⟨U+202E⟩sj.exe",
  ]);
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("names, a title and a program's messages with invisible or bidi characters show them as code points", {
  skip,
}, async () => {
  const token = await newUser();
  // "a\u200bb.csv" read "ab.csv", another file's name; the override reversed the text after it.
  const lookAlike = await upload(token, "a\u200bb.csv", "a,b\n1,2\n");
  await upload(token, "ab.csv", "a,b\n1,3\n");
  const title = "Q1 \u202efdp.exe\u200b";
  const res = await fetch(`${s.base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "r-report", inputFileIds: [lookAlike], parameters: { title } }),
  });
  assert.equal(res.status, 201);
  const taskId = ((await res.json()) as { data: { taskId: string } }).data.taskId;
  const page = await s.signedIn(token);
  await page.goto(`${s.base}/#/files`);
  await page.locator("tr[data-file] td.name").nth(1).waitFor();
  assert.deepEqual(await page.locator("tr[data-file] td.name").allTextContents(), [
    "ab.csv",
    "a⟨U+200B⟩b.csv",
  ]);
  await page.goto(`${s.base}/#/tasks/${taskId}`);
  const run = page.locator("tr[data-run]");
  const shownTitle = "Q1 ⟨U+202E⟩fdp.exe⟨U+200B⟩";
  // The program's progress message while it runs, then its error.
  await run.locator(".message", { hasText: "drawing" }).waitFor({ timeout: 30_000 });
  assert.equal(await run.locator(".message").textContent(), `drawing ${shownTitle}`);
  fs.writeFileSync(RELEASE(), "");
  assert.equal((await waitForTerminal(s.env.db.sql, taskId, 60_000)).failed, 1);
  await run.locator(".badge", { hasText: "failed" }).waitFor();
  assert.equal(await run.locator("td.name").textContent(), "a⟨U+200B⟩b.csv");
  assert.match(
    (await run.locator(".bad").textContent()) ?? "",
    new RegExp(`for ${shownTitle.replace(/[+]/g, "\\+")}`),
  );
  assert.equal(
    await page.locator("p", { hasText: "Parameters:" }).locator("code").textContent(),
    JSON.stringify({ title: shownTitle }),
  );
  await page.getByRole("tab", { name: "Event log" }).click();
  const progress = page.locator("ol.log li", { hasText: "run.progress" }).locator(".detail");
  assert.equal(await progress.textContent(), `50% drawing ${shownTitle}`);
  // Nothing unseen is left on the page.
  const text = await page.evaluate<string>("document.body.innerText");
  assert.ok(!/[\u200b\u202e]/.test(text), "no invisible or bidi character on the page");
  await page.context().close();
  assert.deepEqual(problems, []);
});

test("analysis types the API failed to give: the form says so instead of offering nothing", {
  skip,
}, async () => {
  const token = await newUser();
  const page = await s.signedIn(token);
  await page.route(/\/api\/analysis-types$/, (route) =>
    route.fulfill({
      status: 503,
      contentType: "application/json",
      body: JSON.stringify({ code: "NOT_READY", message: "The service is not ready." }),
    }),
  );
  // Loaded afresh on the form: its one read of the types is the one that fails.
  await page.goto(`${s.base}/#/new`);
  await page.reload();
  await page.getByRole("alert").filter({ hasText: "The analysis types could not be read" }).waitFor();
  assert.equal(await page.getByRole("radio").count(), 0);
  // Read again once the API answers: leaving the form and coming back is enough.
  await page.unroute(/\/api\/analysis-types$/);
  await page.goto(`${s.base}/#/files`);
  // Rendered before coming back: two hash changes in one render would never leave the form, and the
  // types would not be read again (seen under load in make test).
  await page.getByRole("heading", { name: "Files" }).waitFor();
  await page.goto(`${s.base}/#/new`);
  await page.getByRole("radio", { name: /summary/ }).waitFor();
  assert.equal(await page.getByRole("alert").count(), 0);
  await page.context().close();
  assert.deepEqual(problems, []);
});
