// What the dashboard reads beside the seed contract: the task's owner, the analysisType filter of the
// task list, the run's latest progress message and the status filter of a task's runs.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { runClaim, runComplete, runProgress } from "../../src/queue/sql.ts";
import { bearer, startTestApp, type TestApp } from "../helpers/app.ts";
import { createTask, seedUser } from "../helpers/queue.ts";

let t: TestApp;
let alice: Principal;
let aliceToken: string;
let bobToken: string;
let adminToken: string;

before(async () => {
  t = await startTestApp();
  [aliceToken, bobToken, adminToken] = await Promise.all([
    t.token("alice"),
    t.token("bob"),
    t.token("root", "admin"),
  ]);
  alice = await seedUser(t.db.sql, "alice");
});
after(() => t.close());

const get = (url: string, token = aliceToken) => t.app.inject({ url, headers: bearer(token) });

test("the task body names its owner, for the owner and for an admin", async () => {
  const taskId = await createTask(t.db.sql, alice, "summary", 1);
  assert.equal((await get(`/api/analysis-tasks/${taskId}`)).json().data.owner, "alice");
  assert.equal((await get(`/api/analysis-tasks/${taskId}`, adminToken)).json().data.owner, "alice");
  const listed = (await get("/api/analysis-tasks?limit=100", adminToken)).json().data.items;
  assert.equal(listed.find((i: { taskId: string }) => i.taskId === taskId)?.owner, "alice");
  assert.equal((await get(`/api/analysis-tasks/${taskId}`, bobToken)).statusCode, 404);
});

test("GET /api/analysis-tasks?analysisType= lists only that type (with status and paging)", async () => {
  const stats = [
    await createTask(t.db.sql, alice, "python-stats", 1, { parameters: { method: "mean" } }),
    await createTask(t.db.sql, alice, "python-stats", 1, { parameters: { method: "max" } }),
  ];
  await createTask(t.db.sql, alice, "r-report", 1);
  const seen: string[] = [];
  let cursor: string | null = null;
  do {
    const res = await get(
      `/api/analysis-tasks?analysisType=python-stats&limit=1${cursor ? `&cursor=${cursor}` : ""}`,
    );
    assert.equal(res.statusCode, 200);
    const page: { items: { taskId: string; analysisType: string }[]; nextCursor: string | null } =
      res.json().data;
    for (const i of page.items) assert.equal(i.analysisType, "python-stats");
    seen.push(...page.items.map((i) => i.taskId));
    cursor = page.nextCursor;
  } while (cursor);
  assert.deepEqual(seen, [...stats].reverse());
  const both = (await get("/api/analysis-tasks?analysisType=python-stats&status=queued")).json().data;
  assert.equal(both.items.length, 2);
  assert.deepEqual((await get("/api/analysis-tasks?analysisType=python-stats&status=failed")).json().data, {
    items: [],
    nextCursor: null,
  });
  assert.deepEqual((await get("/api/analysis-tasks?analysisType=nobody-runs-this")).json().data, {
    items: [],
    nextCursor: null,
  });
  // Another user's tasks of the type stay invisible.
  assert.deepEqual(
    (await get("/api/analysis-tasks?analysisType=python-stats", bobToken)).json().data.items,
    [],
  );
  for (const q of ["analysisType=", "analysisType=Bad%20Type", `analysisType=${"x".repeat(65)}`]) {
    const res = await get(`/api/analysis-tasks?${q}`);
    assert.equal(res.statusCode, 400, q);
    assert.equal(res.json().code, "VALIDATION_FAILED");
  }
});

test("a run's message is its latest progress message; a progress without one keeps it", async () => {
  const taskId = await createTask(t.db.sql, alice, "msg-type", 1);
  const [run] = await runClaim(t.db.sql, {
    workerId: "w",
    analysisType: "msg-type",
    limit: 1,
    globalLimit: 0,
    leaseTtlMs: 30_000,
  });
  assert.ok(run);
  // Each read follows a worker's statement at once: the process's cache could still answer from
  // before it until the statement's notification arrives (milliseconds; see task-cache.ts), so the
  // reads here go to the database. The cache has its own tests (task-cache.test.ts).
  const runs = async () => {
    t.app.services.tasks?.invalidate(taskId);
    return (await get(`/api/analysis-tasks/${taskId}/runs`)).json().data.items;
  };
  const message = async () => (await runs())[0].message;
  assert.equal(await message(), null);
  const lease = { id: run.id, token: run.leaseToken };
  await runProgress(t.db.sql, [{ ...lease, progress: null }]);
  assert.equal(await message(), null);
  await runProgress(t.db.sql, [{ ...lease, progress: 10, message: "reading input" }]);
  assert.equal(await message(), "reading input");
  await runProgress(t.db.sql, [{ ...lease, progress: 40 }]);
  const [body] = await runs();
  assert.equal(body.message, "reading input");
  assert.equal(body.progressPercent, 40);
  await runProgress(t.db.sql, [{ ...lease, progress: 90, message: "writing ✓ report" }]);
  assert.equal(await message(), "writing ✓ report");
  // Fenced like the progress: a stale token writes nothing.
  await runProgress(t.db.sql, [
    { id: run.id, token: "00000000-0000-4000-8000-000000000000", progress: 95, message: "stale" },
  ]);
  assert.equal(await message(), "writing ✓ report");
  // The message outlives the run's ending.
  await runComplete(t.db.sql, [
    { ...lease, status: "succeeded", result: { outputFileName: "out.json", metrics: {} } },
  ]);
  const [done] = await runs();
  assert.deepEqual([done.status, done.message], ["succeeded", "writing ✓ report"]);
});

test("GET /api/analysis-tasks/:taskId/runs?status= lists only runs in that status, in id order, paged", async () => {
  const taskId = await createTask(t.db.sql, alice, "status-type", 5);
  const claimed = await runClaim(t.db.sql, {
    workerId: "w",
    analysisType: "status-type",
    limit: 3,
    globalLimit: 0,
    leaseTtlMs: 30_000,
  });
  assert.equal(claimed.length, 3);
  const [a, b] = claimed as [(typeof claimed)[number], (typeof claimed)[number]];
  await runComplete(t.db.sql, [
    {
      id: a.id,
      token: a.leaseToken,
      status: "failed",
      errorCode: "ANALYSIS_DATA_INVALID",
      errorMessage: "bad",
    },
    {
      id: b.id,
      token: b.leaseToken,
      status: "failed",
      errorCode: "ANALYSIS_DATA_INVALID",
      errorMessage: "bad",
    },
  ]);
  const all: { runId: string; status: string }[] = (
    await get(`/api/analysis-tasks/${taskId}/runs?limit=100`)
  ).json().data.items;
  const ids = (status: string) => all.filter((r) => r.status === status).map((r) => r.runId);
  assert.deepEqual(ids("failed"), [String(a.id), String(b.id)]);
  for (const status of ["failed", "starting", "queued"]) {
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const res = await get(
        `/api/analysis-tasks/${taskId}/runs?status=${status}&limit=1${cursor ? `&cursor=${cursor}` : ""}`,
      );
      assert.equal(res.statusCode, 200);
      const page: { items: { runId: string; status: string }[]; nextCursor: string | null } = res.json().data;
      for (const r of page.items) assert.equal(r.status, status);
      seen.push(...page.items.map((r) => r.runId));
      cursor = page.nextCursor;
    } while (cursor);
    assert.deepEqual(seen, ids(status), status);
  }
  assert.deepEqual((await get(`/api/analysis-tasks/${taskId}/runs?status=succeeded`)).json().data, {
    items: [],
    nextCursor: null,
  });
  const bad = await get(`/api/analysis-tasks/${taskId}/runs?status=bogus`);
  assert.equal(bad.statusCode, 400);
  assert.equal(bad.json().code, "VALIDATION_FAILED");
  const foreign = await get(`/api/analysis-tasks/${taskId}/runs?status=failed`, bobToken);
  assert.equal(foreign.statusCode, 404);
  assert.equal(foreign.json().code, "ANALYSIS_TASK_NOT_FOUND");
});
