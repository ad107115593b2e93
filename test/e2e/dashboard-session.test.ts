// The dashboard's session in a real browser (Debian's chromium driven by playwright-core, a real
// `assay api` process; no worker: the tasks here stay queued): a token that cannot be one, a damaged
// sign-in link, a token revoked while the page is open, two tabs of one browser signing in and out,
// and where the keyboard's focus is on the new-task form. Waits on conditions, never on time.
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { after, before, beforeEach, test } from "node:test";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { tokenCreate, tokenRevoke } from "../../src/auth/tokens.ts";
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
import { waitFor } from "../helpers/queue.ts";
import { type RunnerEnv, runnerEnv } from "../helpers/runner.ts";

const skip = browserSkip;

let env: RunnerEnv;
let base: string;
let adminToken: string;
let api: { child: ChildProcess; done: Promise<unknown> } | undefined;
let browser: Browser;
/** Problems the pages reported: script errors, CSP violations, dialogs. */
const problems: string[] = [];

before(async () => {
  if (skip) return;
  env = await runnerEnv();
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  const started = await startDevApi(dashboardEnv(env, port));
  api = { child: started.child, done: started.done };
  adminToken = linkToken(started.link);
  browser = await launchBrowser();
});

beforeEach(() => {
  problems.length = 0;
});

after(async () => {
  if (skip) return;
  await browser?.close();
  api?.child.kill("SIGTERM");
  await api?.done;
  await env.close();
});

async function newContext(): Promise<BrowserContext> {
  return browser.newContext({ viewport: { width: 1280, height: 900 } });
}

async function open(ctx: BrowserContext, hash = "#/"): Promise<Page> {
  const page = await ctx.newPage();
  watchPage(page, problems);
  await page.goto(`${base}/${hash}`);
  return page;
}

async function signIn(page: Page, token: string): Promise<void> {
  await page.getByLabel("API token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
}

/** A queued summary task of `token`'s user over one file named `name`; its id. */
async function queuedTask(token: string, name: string): Promise<string> {
  const { fileId } = await uploadFile(base, token, name, "a,b\n1,2\n");
  const res = await fetch(`${base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileIds: [fileId] }),
  });
  assert.equal(res.status, 201);
  return ((await res.json()) as { data: { taskId: string } }).data.taskId;
}

test("a token pasted with a character no token has is refused as such, not as the server unreachable", {
  skip,
}, async () => {
  const ctx = await newContext();
  const page = await open(ctx);
  // Copied from a chat with a zero-width space inside: fetch cannot send it in a header at all.
  await signIn(page, `${adminToken.slice(0, 10)}\u200b${adminToken.slice(10)}`);
  const note = page.locator(".signin .error");
  await note.waitFor();
  assert.match((await note.textContent()) ?? "", /not a token: it holds U\+200B/);
  assert.doesNotMatch((await note.textContent()) ?? "", /NETWORK|could not be reached/);
  // Pasted again as it is, it signs in.
  await signIn(page, adminToken);
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  await ctx.close();

  // A sign-in link whose escapes were cut short: said, and the page still works (it threw before
  // rendering anything: a blank page).
  const damaged = await newContext();
  const again = await open(damaged, "#token=assay_%E2%80");
  await again.getByText("That sign-in link is damaged").waitFor();
  assert.equal(new URL(again.url()).hash, "#/", "the token left the address bar");
  await signIn(again, adminToken);
  await again.getByRole("heading", { name: "Tasks" }).waitFor();
  // A link whose token holds an ellipsis (U+2026) is refused the same way, and nothing is stored.
  await again.getByRole("button", { name: "Sign out" }).click();
  await again.goto(`${base}/#token=${encodeURIComponent("assay_abc\u2026")}`);
  await again.reload();
  await again.getByText("not a token: it holds U+2026").waitFor();
  assert.equal(await again.evaluate('localStorage.getItem("assay.token")'), null);
  await damaged.close();
  assert.deepEqual(problems, []);
});

test("a token revoked while the page is open: the next request signs out and the form says why", {
  skip,
}, async () => {
  const carol = await tokenCreate(env.db.sql, "carol ☂", "user");
  const ctx = await newContext();
  const page = await open(ctx, `#token=${encodeURIComponent(carol.token)}`);
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  assert.ok(await tokenRevoke(env.db.sql, carol.tokenId));
  // The API's token cache drops the token when the revoke's notification arrives: the page's next
  // request must come after that, or it is served and nothing on the page asks again.
  await waitFor(
    async () =>
      (await fetch(`${base}/api/me`, { headers: { authorization: `Bearer ${carol.token}` } })).status === 401,
    30_000,
    "the API to refuse the revoked token",
  );
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Files" }).click();
  await page.getByLabel("API token").waitFor();
  assert.match(
    (await page.locator(".signin .error").textContent()) ?? "",
    /Your token is no longer valid: sign in again/,
  );
  // Revoked while no page was open: the page opened with it says the same.
  const dave = await tokenCreate(env.db.sql, "dave", "user");
  await page.goto(`${base}/#token=${encodeURIComponent(dave.token)}`);
  await page.reload();
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  assert.ok(await tokenRevoke(env.db.sql, dave.tokenId));
  await page.reload();
  await page.getByText("Your token is no longer valid: sign in again.").waitFor();
  // A sign-out by the button says nothing.
  await signIn(page, adminToken);
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByLabel("API token").waitFor();
  assert.equal(await page.locator(".signin .error").count(), 0);
  await ctx.close();
  assert.deepEqual(problems, []);
});

test("two tabs: signing out in one signs the other out; signing in as another user there shows that user", {
  skip,
}, async () => {
  const alice = await tokenCreate(env.db.sql, "alice", "user");
  const bob = await tokenCreate(env.db.sql, "bob ✓", "user");
  const alicesTask = await queuedTask(alice.token, "alice-1.csv");
  const bobsTask = await queuedTask(bob.token, "bob-1.csv");
  const ctx = await newContext();
  const a = await open(ctx, `#token=${encodeURIComponent(alice.token)}`);
  await a.getByRole("heading", { name: "Tasks" }).waitFor();
  const b = await open(ctx, "#/");
  await b.locator(`tr[data-task="${alicesTask}"]`).waitFor();
  assert.equal(await b.locator(".who").textContent(), "alice");

  await a.getByRole("button", { name: "Sign out" }).click();
  // The other tab follows without a request of its own: it shows the form, not alice's tasks.
  await b.getByLabel("API token").waitFor();

  await signIn(a, bob.token);
  await a.getByRole("heading", { name: "Tasks" }).waitFor();
  // The other tab is signed in as bob, and what it shows is bob's.
  await b.locator(".who", { hasText: "bob ✓" }).waitFor();
  await b.locator(`tr[data-task="${bobsTask}"]`).waitFor();
  assert.equal(await b.locator(`tr[data-task="${alicesTask}"]`).count(), 0);

  // Signed in as alice again in the other tab, while this one shows bob's task: it changes user too.
  await a.goto(`${base}/#/tasks/${bobsTask}`);
  await a.locator(".task header .badge", { hasText: "queued" }).waitFor();
  await b.getByRole("button", { name: "Sign out" }).click();
  await a.getByLabel("API token").waitFor();
  await signIn(b, alice.token);
  await a.locator(".who", { hasText: "alice" }).waitFor();
  await a.getByRole("heading", { name: "Task not found" }).waitFor();
  await ctx.close();
  assert.deepEqual(problems, []);
});

test("the keyboard's focus on the hidden file picker shows on its button", { skip }, async () => {
  const ctx = await newContext();
  const page = await open(ctx, `#token=${encodeURIComponent(adminToken)}`);
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  await page.goto(`${base}/#/new`);
  await page.getByRole("radio", { name: /summary/ }).waitFor();
  await page.getByRole("radio", { name: /summary/ }).focus();
  await page.keyboard.press("Tab");
  const focused = page.locator(":focus");
  assert.equal(await focused.getAttribute("type"), "file");
  // Its label is the button seen: the outline is drawn there (the input's own is clipped away).
  const label = page.locator("label.button", { has: focused });
  assert.equal((await label.textContent())?.trim(), "Choose files");
  const outline = "getComputedStyle(document.querySelector('label.button')).outlineStyle";
  assert.equal(await page.evaluate(outline), "solid");
  // A click elsewhere (no keyboard) shows none.
  await page.getByRole("heading", { name: "New task" }).click();
  assert.equal(await page.evaluate(outline), "none");
  await ctx.close();
  assert.deepEqual(problems, []);
});
