// A run's JSON output previewed in a real browser (Debian's chromium driven by playwright-core),
// against real `assay api` and `assay worker` processes running the real summary program: the column
// names a user's CSV gives reach summary.json as they are, and the preview shows what in them is not
// seen as itself as its code point, line by line. Waits on conditions, never on time.
import assert from "node:assert/strict";
import { test } from "node:test";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { browserSkip, dashboardSuite, uploadFile } from "../helpers/browser.ts";
import { waitForTerminal } from "../helpers/queue.ts";

const skip = browserSkip;

const s = dashboardSuite({ ASSAY_POLL_INTERVAL_MS: "200" }, { worker: true });
const { problems } = s;

test("a JSON output's preview shows a column name's bidi override and zero-width space as code points", {
  skip,
}, async () => {
  const { token } = await tokenCreate(s.env.db.sql, "préview \u202euser", "user");
  // Column names as a hostile CSV gives them: an override that would make "invoicefdp.exe" read as
  // "invoiceexe.pdf" and reverse the rest of its line, and a zero-width space.
  const csv = "invoice\u202efdp.exe,to\u200btal,نام\r\nx,1,2\r\ny,3,4\r\n";
  const { fileId } = await uploadFile(s.base, token, "<i>résumé</i>.csv", csv);
  const res = await fetch(`${s.base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileIds: [fileId] }),
  });
  assert.equal(res.status, 201);
  const taskId = ((await res.json()) as { data: { taskId: string } }).data.taskId;
  assert.equal((await waitForTerminal(s.env.db.sql, taskId, 60_000)).succeeded, 1);

  const page = await s.signedIn(token);
  await page.goto(`${s.base}/#/tasks/${taskId}`);
  await page.locator("tr[data-run]").getByRole("button", { name: "results" }).click();
  // summary.json, the run's one output, opens previewed.
  const preview = page.locator("pre.preview");
  await preview.waitFor();
  const text = (await preview.textContent()) ?? "";
  assert.match(text, /"invoice⟨U\+202E⟩fdp\.exe"/);
  assert.match(text, /"to⟨U\+200B⟩tal"/);
  // Letters of a right-to-left script are letters: shown as they are.
  assert.match(text, /"نام"/);
  assert.ok(!/[\u200b\u202e]/.test(text), "no invisible or bidi character in the preview");
  // Still the indented JSON, a line each.
  assert.ok(text.split("\n").length > 10, text);
  assert.match(text, /\n {2}"columns": \[/);
  assert.deepEqual(problems, []);
});
