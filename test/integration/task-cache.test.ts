// The per-process cache of GET /api/analysis-tasks/:id and its runs pages (src/tasks/task-cache.ts),
// against a real database: who may see a cached task, invalidation by the task's own notifications
// and by a cancel through the same process, reads in flight, and the bound on staleness.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { EVENTS_CHANNEL } from "../../src/queue/sql.ts";
import { pageKey, TASK_CACHE_TTL_MS, TaskCache, taskIdOf } from "../../src/tasks/task-cache.ts";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";

let t: TestApp;
let alice: string;
let bob: string;
let admin: string;
let aliceFile: string;

before(async () => {
  t = await startTestApp();
  [alice, bob, admin] = await Promise.all([t.token("alice"), t.token("bob"), t.token("root", "admin")]);
  const { payload, headers } = multipart("file", "a,b\n1,2\n");
  const res = await t.app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { ...headers, ...bearer(alice) },
  });
  aliceFile = res.json().data.fileId;
});
after(() => t.close());

/** A new task of alice's, queued. */
async function queuedTask(): Promise<string> {
  const res = await t.app.inject({
    method: "POST",
    url: "/api/analysis-tasks",
    payload: { analysisType: "summary", inputFileId: aliceFile },
    headers: bearer(alice),
  });
  return res.json().data.taskId as string;
}

/** A task of alice's, marked running (a queued task's view is never cached). */
async function runningTask(): Promise<string> {
  const taskId = await queuedTask();
  await t.db.sql`update tasks set status = 'running', started_at = now() where id = ${taskId}`;
  return taskId;
}

const get = (url: string, token: string) => t.app.inject({ url, headers: bearer(token) });
const taskUrl = (id: string) => `/api/analysis-tasks/${id}`;
const runsUrl = (id: string) => `/api/analysis-tasks/${id}/runs?limit=20`;
const doorbell = (taskId: string) =>
  t.db
    .sql`select pg_notify(${EVENTS_CHANNEL}, json_build_object('taskId', ${taskId}::text, 'eventId', '1')::text)`;

/** Until the clock the cache reads (performance.now(), monotonic) has passed `ms`. */
async function clockPast(ms: number): Promise<void> {
  while (performance.now() <= ms)
    await new Promise((r) => setTimeout(r, Math.max(1, ms + 1 - performance.now())));
}

/** Polls `read` until `done` holds; returns the milliseconds it took. */
async function until(read: () => Promise<boolean>, limitMs: number): Promise<number> {
  const start = performance.now();
  while (!(await read())) {
    if (performance.now() - start > limitMs) throw new Error(`not within ${limitMs} ms`);
    await new Promise((r) => setTimeout(r, 10));
  }
  return performance.now() - start;
}

describe("task cache", () => {
  test("a cached task is never shown to another user; an admin sees the same body", async () => {
    const taskId = await runningTask();
    for (const url of [taskUrl(taskId), runsUrl(taskId)]) {
      const own = await get(url, alice);
      assert.equal(own.statusCode, 200);
      // Served from the cache now: bob still gets the 404 the statement would give him.
      const again = await get(url, alice);
      assert.equal(again.body, own.body);
      const foreign = await get(url, bob);
      assert.equal(foreign.statusCode, 404);
      assert.deepEqual(foreign.json(), {
        code: "ANALYSIS_TASK_NOT_FOUND",
        message: "The analysis task does not exist.",
      });
      const root = await get(url, admin);
      assert.equal(root.statusCode, 200);
      assert.equal(root.body, own.body);
    }
    assert.ok(t.app.services.tasks?.get(taskId), "the task was cached");
    assert.ok(t.app.services.tasks?.getPage(taskId, pageKey({ limit: 20 })), "its runs page was cached");
  });

  test("runs pages: each query its own answer; a notification drops them all, a claim shows within the expiry", async () => {
    const taskId = await runningTask();
    const page = async (query: string) =>
      (await get(`/api/analysis-tasks/${taskId}/runs?${query}`, alice)).json().data;
    assert.equal((await page("limit=20")).items[0].status, "queued");
    assert.deepEqual((await page("status=starting")).items, []);
    // Both answers were stored by now (each expires a TTL after it was stored).
    const cachedBy = performance.now();
    // A claim sends no notification: both answers are still the cached ones...
    await t.db.sql`update runs set status = 'starting', attempt = 1, lease_token = gen_random_uuid(),
      lease_owner = 'w', lease_expires_at = now() + interval '1 minute' where task_id = ${taskId}`;
    assert.equal((await page("limit=20")).items[0].status, "queued");
    assert.deepEqual((await page("status=starting")).items, []);
    assert.equal((await page("limit=19")).items[0].status, "starting", "another query is another page");
    // ...until they expire: one expiry after they were stored, the next read shows the claim.
    // (Waiting on the clock, not timing a poll: a loaded machine makes polls slow, not caches stale.)
    await clockPast(cachedBy + TASK_CACHE_TTL_MS);
    assert.equal((await page("limit=20")).items[0].status, "starting");
    // The task's notification drops every page of it at once. With the clock the cache is asked
    // with held still, no answer can expire: only the notification can remove them.
    assert.equal((await page("status=starting")).items.length, 1);
    const held = performance.now();
    assert.ok(t.app.services.tasks?.getPage(taskId, pageKey({ limit: 20 }), held));
    assert.ok(t.app.services.tasks?.getPage(taskId, pageKey({ status: "starting", limit: 20 }), held));
    await t.db.sql`update runs set progress = 40 where task_id = ${taskId}`;
    await doorbell(taskId);
    await until(
      async () => t.app.services.tasks?.getPage(taskId, pageKey({ limit: 20 }), held) === undefined,
      5_000,
    );
    assert.equal(
      t.app.services.tasks?.getPage(taskId, pageKey({ status: "starting", limit: 20 }), held),
      undefined,
    );
    assert.equal((await page("status=starting")).items[0].progressPercent, 40);
    assert.equal((await page("limit=20")).items[0].progressPercent, 40);
  });

  test("the task's own notification drops its answers at once; other tasks keep theirs", async () => {
    const taskId = await runningTask();
    const other = await runningTask();
    await get(taskUrl(taskId), alice);
    await get(taskUrl(other), alice);
    const held = performance.now();
    // A change that sends no notification is not seen yet: the answers are cached.
    await t.db.sql`update tasks set succeeded_count = 1 where id = ${taskId}`;
    assert.equal((await get(taskUrl(taskId), alice)).json().data.succeededCount, 0);
    // Its notification (the doorbell form, as for a large batch) drops them. The cache is asked
    // with the clock held still, so no answer can expire meanwhile: only the notification removes it.
    await doorbell(taskId);
    await until(async () => t.app.services.tasks?.get(taskId, held) === undefined, 5_000);
    assert.ok(t.app.services.tasks?.get(other, held), "another task's answer is kept");
    assert.equal((await get(taskUrl(taskId), alice)).json().data.succeededCount, 1);
  });

  test("a cancel through this process is seen by the next read", async () => {
    const taskId = await runningTask();
    assert.equal((await get(taskUrl(taskId), alice)).json().data.status, "running");
    const cancel = await t.app.inject({
      method: "POST",
      url: `/api/analysis-tasks/${taskId}/cancel`,
      headers: bearer(alice),
    });
    assert.equal(cancel.statusCode, 202);
    const after = (await get(taskUrl(taskId), alice)).json().data;
    assert.equal(after.status, cancel.json().data.status);
    assert.equal((await get(runsUrl(taskId), alice)).json().data.items[0].status, "cancelled");
  });

  test("a change that sends no notification shows within the expiry", async () => {
    const taskId = await runningTask();
    await get(taskUrl(taskId), alice);
    const cachedBy = performance.now();
    await t.db.sql`update tasks set failed_count = 1 where id = ${taskId}`;
    // One expiry after the answer was stored, the next read shows the change.
    await clockPast(cachedBy + TASK_CACHE_TTL_MS);
    assert.equal((await get(taskUrl(taskId), alice)).json().data.failedCount, 1);
  });

  test("a queued task's view is not cached (its queue estimate depends on others)", async () => {
    const taskId = await queuedTask();
    assert.equal((await get(taskUrl(taskId), alice)).json().data.status, "queued");
    assert.equal(t.app.services.tasks?.get(taskId), undefined);
  });

  test("a read in flight when its task is invalidated is not stored; a reconnect empties the cache", async () => {
    const cache = new TaskCache(60_000);
    const logger = t.app.log as unknown as Parameters<TaskCache["start"]>[1];
    await cache.start(t.db.sql, logger);
    try {
      const ticket = cache.begin();
      cache.invalidate("7");
      cache.set("7", 1, { stale: true }, ticket);
      assert.equal(cache.get("7"), undefined, "an answer older than the invalidation");
      cache.set("7", 1, { fresh: true }, cache.begin());
      assert.deepEqual(cache.get("7")?.value, { fresh: true });
      // Another task's invalidation does not affect it; a clear drops it and reads begun before.
      const before = cache.begin();
      cache.invalidate("8");
      cache.set("9", 1, {}, before);
      assert.ok(cache.get("9"));
      cache.clear();
      cache.set("9", 1, {}, before);
      assert.equal(cache.get("9"), undefined);
      // A notification from PostgreSQL, in the form that carries events, drops the task's answers.
      cache.set("7", 1, { fresh: true }, cache.begin());
      await t.db
        .sql`select pg_notify(${EVENTS_CHANNEL}, json_build_object('taskId', '7', 'events', json_build_array())::text)`;
      await until(async () => cache.get("7") === undefined, 5_000);
      // Expired answers are not served.
      cache.set("7", 1, {}, cache.begin(), performance.now() - 60_001);
      assert.equal(cache.get("7"), undefined);
      cache.setPage("7", "a", 1, {}, 0, cache.begin(), performance.now() - 60_001);
      assert.equal(cache.getPage("7", "a"), undefined);
      // Pages follow the same generation rule, and are bounded over all tasks (oldest task first).
      const early = cache.begin();
      cache.invalidate("7");
      cache.setPage("7", "a", 1, { stale: true }, 0, early);
      assert.equal(cache.getPage("7", "a"), undefined);
      for (let i = 0; i < 1_001; i++) cache.setPage(String(1_000 + i), "a", 1, { i }, 1, cache.begin());
      assert.equal(cache.pagesSize, 1_000);
      assert.equal(cache.getPage("1000", "a"), undefined, "the oldest task's page went first");
      assert.deepEqual(cache.getPage("2000", "a")?.value, { i: 1_000 });
      // One task paged past the bound (a client reading 100,000 runs 100 at a time): its own pages
      // go to make room, and the next page is kept and counted once.
      cache.invalidate("3000");
      for (let i = 0; i < 1_001; i++) cache.setPage("3000", `p${i}`, 1, { i }, 1, cache.begin());
      assert.equal(cache.pagesSize, 1);
      assert.deepEqual(cache.getPage("3000", "p1000")?.value, { i: 1_000 });
      for (let i = 0; i < 50; i++) cache.setPage("3001", `p${i}`, 1, { i }, 1, cache.begin());
      assert.equal(cache.pagesSize, 51, "the count is the pages kept");
      for (let i = 0; i < 50; i++) assert.ok(cache.getPage("3001", `p${i}`), `page ${i} of the next task`);
      // Bounded by runs too: pages of 200 runs (twice the largest a client may ask for) keep 20,000 runs at
      // most, the oldest task's going first; a page stored again under its key is counted once.
      cache.clear();
      for (let i = 0; i < 150; i++) cache.setPage(String(5_000 + i), "a", 1, { i }, 200, cache.begin());
      assert.equal(cache.pageRunsSize, 20_000);
      assert.equal(cache.pagesSize, 100);
      assert.equal(cache.getPage("5049", "a"), undefined, "the oldest tasks' pages went first");
      assert.deepEqual(cache.getPage("5050", "a")?.value, { i: 50 });
      cache.setPage("5149", "a", 1, { again: true }, 100, cache.begin());
      assert.equal(cache.pagesSize, 100);
      assert.equal(cache.pageRunsSize, 19_900);
      assert.deepEqual(cache.getPage("5149", "a")?.value, { again: true });
      // Expired answers nobody reads again are swept: a client that paged through a large task once
      // left its pages (up to 45 MiB of runs) in the heap until other answers pushed them out.
      const past = performance.now() - 60_001;
      cache.setPage("6000", "a", 1, {}, 100, cache.begin(), past);
      cache.setPage("6000", "b", 1, {}, 100, cache.begin());
      cache.set("6000", 1, {}, cache.begin(), past);
      cache.set("6001", 1, {}, cache.begin());
      // The second page pushed the oldest task's page (200 runs) out: 19,900 + 100 + 100 - 200 runs.
      assert.equal(cache.pagesSize, 101);
      assert.equal(cache.pageRunsSize, 19_900);
      cache.sweep();
      assert.equal(cache.pagesSize, 100);
      assert.equal(cache.pageRunsSize, 19_800);
      assert.equal(cache.size, 1);
      assert.equal(cache.get("6000"), undefined);
      assert.ok(cache.get("6001"), "a fresh view stays");
      assert.ok(cache.getPage("6000", "b"), "a fresh page of the same task stays");
      cache.sweep(performance.now() + 60_001);
      assert.equal(cache.pagesSize, 0);
      assert.equal(cache.pageRunsSize, 0);
      assert.equal(cache.size, 0);
    } finally {
      await cache.stop();
    }
    // A listening cache sweeps by itself: pages no one reads again go within a second or so.
    const swept = new TaskCache(300);
    await swept.start(t.db.sql, logger);
    try {
      swept.setPage("7", "a", 1, {}, 100, swept.begin());
      swept.set("7", 1, {}, swept.begin());
      assert.equal(swept.pageRunsSize, 100);
      await until(async () => swept.pagesSize === 0 && swept.size === 0, 5_000);
      assert.equal(swept.pageRunsSize, 0);
    } finally {
      await swept.stop();
    }
    // Until it listens, nothing is cached.
    const idle = new TaskCache();
    idle.set("1", 1, {}, idle.begin());
    assert.equal(idle.get("1"), undefined);
    assert.equal(taskIdOf('{"taskId" : "12", "events" : []}'), "12");
    assert.equal(taskIdOf("not json"), undefined);
  });
});
