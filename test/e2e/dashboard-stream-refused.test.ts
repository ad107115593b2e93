// A task page whose event stream is refused, in a real browser (Debian's chromium driven by
// playwright-core) against a real `assay api` process, reached through a TCP proxy that the test cuts:
// the network drops, the token is revoked meanwhile, and the stream's reconnect is the page's only
// request (a running task's page reads nothing else until an event comes). No worker: the test starts
// the task itself, in the database, as a worker's claim does. Waits on conditions, never on time.
import assert from "node:assert/strict";
import { test } from "node:test";
import { tokenCreate, tokenRevoke } from "../../src/auth/tokens.ts";
import {
  browserSkip,
  dashboardSuite,
  summaryTask,
  tokenRefused,
  uploadFile,
  watchPage,
} from "../helpers/browser.ts";
import { waitFor } from "../helpers/queue.ts";
import { startTcpProxy } from "../helpers/tcp-proxy.ts";

const skip = browserSkip;

const s = dashboardSuite({ ASSAY_SSE_HEARTBEAT_MS: "1000" });
const { problems } = s;

/** Once the API refuses revoked `token` (its token cache has heard of the revoke). */
const refused = (token: string) => tokenRefused(s.base, token);

test("a stream refused on reconnect (the token revoked while the network was down) signs out and says why", {
  skip,
}, async () => {
  const erin = await tokenCreate(s.env.db.sql, "erin \u202egnp.exe", "user");
  const { fileId } = await uploadFile(s.base, erin.token, "<b>données</b>\u202evsc.exe", "a,b\n1,2\n");
  const taskId = await summaryTask(s.base, erin.token, fileId);
  // Started, as a worker's claim starts it: the page does not re-read a running task by itself.
  await s.env.db.sql`update tasks set status = 'running', started_at = now() where id = ${taskId}`;

  // While `down`, every connection through the proxy is cut at its first bytes.
  let down = false;
  const proxy = await startTcpProxy(s.base, { fromClient: () => (down ? "cut" : "pass") });
  const ctx = await s.browser.newContext({ viewport: { width: 1280, height: 900 } });
  try {
    const page = await ctx.newPage();
    watchPage(page, problems);
    const origin = new URL(proxy.url).origin;
    await page.goto(`${origin}/#token=${encodeURIComponent(erin.token)}`);
    await page.getByRole("heading", { name: "Tasks" }).waitFor();
    // The task is read when the page opens, and again after the first events (its log so far).
    let taskReads = 0;
    page.on("response", (r) => {
      if (new URL(r.url()).pathname === `/api/analysis-tasks/${taskId}`) taskReads++;
    });
    await page.goto(`${origin}/#/tasks/${taskId}`);
    await page.locator(".task header .badge", { hasText: "running" }).waitFor();
    await page.locator(".task header .stream", { hasText: "live" }).waitFor();
    await waitFor(async () => taskReads >= 2, 10_000, "the task's re-read after its first events");
    // The network drops: the stream fails (it does not end), and the page tries again.
    down = true;
    assert.ok(proxy.dropAll() > 0);
    await page.locator(".task header .stream", { hasText: "reconnecting" }).waitFor({ timeout: 15_000 });
    assert.ok(await tokenRevoke(s.env.db.sql, erin.tokenId));
    await refused(erin.token);
    down = false;
    // The stream's reconnect is refused: signed out, and the form says why (it showed the task,
    // "unavailable", signed in, until 2026-12-06).
    await page.getByLabel("API token").waitFor({ timeout: 30_000 });
    assert.match(
      (await page.locator(".signin .error").textContent()) ?? "",
      /Your token is no longer valid: sign in again/,
    );
    assert.equal(await page.evaluate('localStorage.getItem("assay.token")'), null);
    assert.deepEqual(problems, []);
  } finally {
    await ctx.close();
    await proxy.close();
  }
});

test("a stream refused with 429 (too many of the user's streams) is asked again, not before its Retry-After", {
  skip,
}, async () => {
  const fay = await tokenCreate(s.env.db.sql, "fay", "user");
  const { fileId } = await uploadFile(s.base, fay.token, "größe.csv", "a,b\n1,2\n");
  const taskId = await summaryTask(s.base, fay.token, fileId);
  const ctx = await s.browser.newContext({ viewport: { width: 1280, height: 900 } });
  try {
    const page = await ctx.newPage();
    watchPage(page, problems);
    // The first two reads of the stream are refused as the API refuses a user's 101st stream.
    const asked: number[] = [];
    await page.route(new RegExp(`/api/analysis-tasks/${taskId}/events$`), async (route) => {
      asked.push(Date.now());
      if (asked.length > 2) return route.continue();
      await route.fulfill({
        status: 429,
        headers: { "retry-after": "2" },
        contentType: "application/json",
        body: JSON.stringify({ code: "TOO_MANY_STREAMS", message: "You have too many event streams open." }),
      });
    });
    await page.goto(`${s.base}/#token=${encodeURIComponent(fay.token)}`);
    await page.getByRole("heading", { name: "Tasks" }).waitFor();
    await page.goto(`${s.base}/#/tasks/${taskId}`);
    await page.locator(".task header .stream", { hasText: "live" }).waitFor({ timeout: 15_000 });
    assert.ok(asked.length >= 3);
    // Until 2026-12-07 the page asked again after its drop backoff: 1 s, then 2 s.
    const gaps = [(asked[1] ?? 0) - (asked[0] ?? 0), (asked[2] ?? 0) - (asked[1] ?? 0)];
    for (const gap of gaps) assert.ok(gap >= 1900, `asked again after ${gaps.join(", ")} ms`);
    assert.deepEqual(
      problems.filter((p) => !/429/.test(p)),
      [],
    );
  } finally {
    await ctx.close();
  }
});
