// The dashboard's session in a real browser (Debian's chromium driven by playwright-core, a real
// `assay api` process; no worker: the tasks here stay queued): a token that cannot be one, a damaged
// sign-in link, a token revoked while the page is open, two tabs of one browser signing in and out,
// and where the keyboard's focus is on the new-task form. Waits on conditions, never on time.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { BrowserContext } from "playwright-core";
import { tokenCreate, tokenRevoke } from "../../src/auth/tokens.ts";
import { browserSkip, dashboardSuite, tokenRefused, uploadFile } from "../helpers/browser.ts";
import { waitFor } from "../helpers/queue.ts";

const skip = browserSkip;

const s = dashboardSuite();
const { problems } = s;

async function newContext(): Promise<BrowserContext> {
  return s.browser.newContext({ viewport: { width: 1280, height: 900 } });
}

/** Once the API refuses revoked `token` (its token cache has heard of the revoke). */
const refused = (token: string) => tokenRefused(s.base, token);

/** A queued summary task of `token`'s user over one file named `name`; its id. */
async function queuedTask(token: string, name: string): Promise<string> {
  const { fileId } = await uploadFile(s.base, token, name, "a,b\n1,2\n");
  const res = await fetch(`${s.base}/api/analysis-tasks`, {
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
  const page = await s.open("#/", ctx);
  // Copied from a chat with a zero-width space inside: fetch cannot send it in a header at all.
  await s.signIn(page, `${s.adminToken.slice(0, 10)}\u200b${s.adminToken.slice(10)}`);
  const note = page.locator(".signin .error");
  await note.waitFor();
  assert.match((await note.textContent()) ?? "", /not a token: it holds U\+200B/);
  assert.doesNotMatch((await note.textContent()) ?? "", /NETWORK|could not be reached/);
  // Pasted again as it is, it signs in.
  await s.signIn(page, s.adminToken);
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  await ctx.close();

  // A sign-in link whose escapes were cut short: said, and the page still works (it threw before
  // rendering anything: a blank page).
  const damaged = await newContext();
  const again = await s.open("#token=assay_%E2%80", damaged);
  await again.getByText("That sign-in link is damaged").waitFor();
  assert.equal(new URL(again.url()).hash, "#/", "the token left the address bar");
  await s.signIn(again, s.adminToken);
  await again.getByRole("heading", { name: "Tasks" }).waitFor();
  // A link whose token holds an ellipsis (U+2026) is refused the same way, and nothing is stored.
  await again.getByRole("button", { name: "Sign out" }).click();
  await again.goto(`${s.base}/#token=${encodeURIComponent("assay_abc\u2026")}`);
  await again.reload();
  await again.getByText("not a token: it holds U+2026").waitFor();
  assert.equal(await again.evaluate('localStorage.getItem("assay.token")'), null);
  await damaged.close();
  assert.deepEqual(problems, []);
});

test("a token revoked while the page is open: the next request signs out and the form says why", {
  skip,
}, async () => {
  const carol = await tokenCreate(s.env.db.sql, "carol ☂", "user");
  const ctx = await newContext();
  const page = await s.signedIn(carol.token, ctx);
  assert.ok(await tokenRevoke(s.env.db.sql, carol.tokenId));
  await refused(carol.token);
  // The next request signs out: the click's, or the task list's own read (every POLL_MS), which may
  // come first and take the link away before the click (a CI run waited 30 s for it).
  await page
    .getByRole("navigation", { name: "Main" })
    .getByRole("link", { name: "Files" })
    .click({ timeout: 5_000 })
    .catch(() => {});
  await page.getByLabel("API token").waitFor();
  assert.match(
    (await page.locator(".signin .error").textContent()) ?? "",
    /Your token is no longer valid: sign in again/,
  );
  // Revoked while no page was open: the page opened with it says the same.
  const dave = await tokenCreate(s.env.db.sql, "dave", "user");
  await page.goto(`${s.base}/#token=${encodeURIComponent(dave.token)}`);
  await page.reload();
  await page.getByRole("heading", { name: "Tasks" }).waitFor();
  // No page open while it is revoked: an open one's own next read could find out first, and sign out
  // before a reload (which then had no token to say anything about).
  await page.close();
  assert.ok(await tokenRevoke(s.env.db.sql, dave.tokenId));
  await refused(dave.token);
  const later = await s.open("#/", ctx);
  await later.getByText("Your token is no longer valid: sign in again.").waitFor();
  // A sign-out by the button says nothing.
  await s.signIn(later, s.adminToken);
  await later.getByRole("heading", { name: "Tasks" }).waitFor();
  await later.getByRole("button", { name: "Sign out" }).click();
  await later.getByLabel("API token").waitFor();
  assert.equal(await later.locator(".signin .error").count(), 0);
  await ctx.close();
  assert.deepEqual(problems, []);
});

test("two tabs: signing out in one signs the other out; signing in as another user there shows that user", {
  skip,
}, async () => {
  const alice = await tokenCreate(s.env.db.sql, "alice", "user");
  const bob = await tokenCreate(s.env.db.sql, "bob ✓", "user");
  const alicesTask = await queuedTask(alice.token, "alice-1.csv");
  const bobsTask = await queuedTask(bob.token, "bob-1.csv");
  const ctx = await newContext();
  const a = await s.signedIn(alice.token, ctx);
  const b = await s.open("#/", ctx);
  await b.locator(`tr[data-task="${alicesTask}"]`).waitFor();
  assert.equal(await b.locator(".who").textContent(), "alice");

  await a.getByRole("button", { name: "Sign out" }).click();
  // The other tab follows without a request of its own: it shows the form, not alice's tasks.
  await b.getByLabel("API token").waitFor();

  await s.signIn(a, bob.token);
  await a.getByRole("heading", { name: "Tasks" }).waitFor();
  // The other tab is signed in as bob, and what it shows is bob's.
  await b.locator(".who", { hasText: "bob ✓" }).waitFor();
  await b.locator(`tr[data-task="${bobsTask}"]`).waitFor();
  assert.equal(await b.locator(`tr[data-task="${alicesTask}"]`).count(), 0);

  // Signed in as alice again in the other tab, while this one shows bob's task: it changes user too.
  await a.goto(`${s.base}/#/tasks/${bobsTask}`);
  await a.locator(".task header .badge", { hasText: "queued" }).waitFor();
  await b.getByRole("button", { name: "Sign out" }).click();
  await a.getByLabel("API token").waitFor();
  await s.signIn(b, alice.token);
  await a.locator(".who", { hasText: "alice" }).waitFor();
  await a.getByRole("heading", { name: "Task not found" }).waitFor();
  await ctx.close();
  assert.deepEqual(problems, []);
});

test("the keyboard's focus on the hidden file picker shows on its button", { skip }, async () => {
  const ctx = await newContext();
  const page = await s.signedIn(s.adminToken, ctx);
  await page.goto(`${s.base}/#/new`);
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

test("a sign-in link of another account while one is signed in asks first; the same token's link does not", {
  skip,
}, async () => {
  const gina = await tokenCreate(s.env.db.sql, "gina", "user");
  const hugo = await tokenCreate(s.env.db.sql, "hugo <b>✓</b>", "user");
  const ginasTask = await queuedTask(gina.token, "gina-1.csv");
  const ctx = await newContext();
  const a = await s.signedIn(gina.token, ctx);
  await a.locator(`tr[data-task="${ginasTask}"]`).waitFor();
  const stored = () => a.evaluate('localStorage.getItem("assay.token")');

  // Someone sends gina a link of hugo's: nothing changes until she chooses, in either tab.
  const b = await s.open(`#token=${encodeURIComponent(hugo.token)}`, ctx);
  const ask = b.getByRole("alertdialog", { name: "Sign in with this link?" });
  await ask.getByText("You opened a sign-in link for hugo <b>✓</b>").waitFor();
  assert.equal(new URL(b.url()).hash, "#/", "the token left the address bar");
  assert.equal(await b.locator(".who").textContent(), "gina");
  await b.locator(`tr[data-task="${ginasTask}"]`).waitFor();
  assert.equal(await stored(), gina.token);
  assert.equal(await a.locator(".who").textContent(), "gina");
  // Focused, as a dialog is.
  assert.equal(await b.evaluate("document.activeElement?.getAttribute('role')"), "alertdialog");
  await ask.getByRole("button", { name: "Stay signed in as gina" }).click();
  await ask.waitFor({ state: "detached" });
  assert.equal(await stored(), gina.token);
  assert.equal(await b.locator(".who").textContent(), "gina");
  // The focus goes to the view's heading, not to <body>.
  await waitFor(
    async () => (await b.evaluate("document.activeElement?.tagName")) === "H1" || undefined,
    5000,
    "the focus on the heading",
  );

  // The check of gina's token fails without a refusal (a 502 while the API restarts): the link is
  // not taken for her (it switched unasked so).
  const down = await ctx.newPage();
  await down.route("**/api/me", (route) =>
    route.fulfill({ status: 502, contentType: "text/html", body: "<html>502 Bad Gateway</html>" }),
  );
  await down.goto(`${s.base}/#token=${encodeURIComponent(hugo.token)}`);
  await down.getByLabel("API token").waitFor();
  assert.equal(await stored(), gina.token);
  // Offered on the form, not lost (the address bar no longer has it): the user's choice.
  await down.getByText("You opened a sign-in link.").waitFor();
  await down.getByRole("button", { name: "Sign in with the link" }).waitFor();
  await down.close();

  // Asked again, she switches: both tabs are hugo's.
  await b.goto(`${s.base}/#token=${encodeURIComponent(hugo.token)}`);
  await b.reload();
  await b.getByRole("button", { name: "Sign in as hugo <b>✓</b>" }).click();
  await b.locator(".who", { hasText: "hugo <b>✓</b>" }).waitFor();
  await a.locator(".who", { hasText: "hugo <b>✓</b>" }).waitFor();
  assert.equal(await a.locator(`tr[data-task="${ginasTask}"]`).count(), 0);
  assert.equal(await stored(), hugo.token);
  assert.equal(await b.getByRole("alertdialog").count(), 0);

  // A link of the token signed in: nothing to ask.
  const same = await s.open(`#token=${encodeURIComponent(hugo.token)}`, ctx);
  await same.getByRole("heading", { name: "Tasks" }).waitFor();
  assert.equal(await same.getByRole("alertdialog").count(), 0);

  // A link whose token is not valid: said, and the session stays.
  const revoked = await tokenCreate(s.env.db.sql, "ivan", "user");
  assert.ok(await tokenRevoke(s.env.db.sql, revoked.tokenId));
  await refused(revoked.token);
  const bad = await s.open(`#token=${encodeURIComponent(revoked.token)}`, ctx);
  await bad.getByText("The sign-in link's token is not valid").waitFor();
  await bad.getByRole("button", { name: "Dismiss" }).click();
  assert.equal(await stored(), hugo.token);
  assert.equal(await bad.locator(".who").textContent(), "hugo <b>✓</b>");
  await ctx.close();

  // The token signed in is no longer valid when a link comes: the link signs in, with nothing to ask.
  const other = await newContext();
  const g = await s.signedIn(gina.token, other);
  await g.close();
  assert.ok(await tokenRevoke(s.env.db.sql, gina.tokenId));
  await refused(gina.token);
  const next = await s.open(`#token=${encodeURIComponent(hugo.token)}`, other);
  await next.locator(".who", { hasText: "hugo <b>✓</b>" }).waitFor();
  assert.equal(await next.getByRole("alertdialog").count(), 0);
  await other.close();
  assert.deepEqual(problems, []);
});
