// GET /api/analysis-types: every whitelisted type with its description and parameter schema, and its
// availability from live workers (heartbeat younger than the reaper's limit), with the reasons the
// others gave.
import assert from "node:assert/strict";
import { after, before, beforeEach, test } from "node:test";
import { ANALYSIS_TYPES, PARAMETER_SCHEMAS } from "../../src/analyses/types.ts";
import { startWorkerRuntime } from "../../src/cli/worker-runtime.ts";
import { createLogger } from "../../src/log.ts";
import { processRegistry } from "../../src/metrics/registry.ts";
import { WORKER_STALE_TTLS, workerRegister } from "../../src/queue/sql.ts";
import { bearer, startTestApp, type TestApp } from "../helpers/app.ts";

let t: TestApp;
let token: string;

before(async () => {
  t = await startTestApp();
  token = await t.token("alice");
});
after(() => t.close());
beforeEach(async () => {
  await t.db.sql`delete from workers`;
});

interface TypeItem {
  name: string;
  description: string;
  parameters: unknown;
  available: boolean;
  reason: string | null;
  workers: number;
}

async function types(): Promise<Record<string, TypeItem>> {
  const res = await t.app.inject({ url: "/api/analysis-types", headers: bearer(token) });
  assert.equal(res.statusCode, 200);
  const body = res.json();
  assert.equal(body.code, "OK");
  const items: TypeItem[] = body.data.items;
  assert.deepEqual(
    items.map((i) => i.name),
    [...ANALYSIS_TYPES],
  );
  return Object.fromEntries(items.map((i) => [i.name, i]));
}

const state = (i: TypeItem | undefined) =>
  i && { available: i.available, reason: i.reason, workers: i.workers };

const register = (id: string, analysisTypes: string[], unavailable: { type: string; reason: string }[]) =>
  workerRegister(t.db.sql, { id, host: "h", pid: 1, analysisTypes, concurrency: 2, unavailable });

test("every type has a one-line description and the schema the create route validates with", async () => {
  const items = await types();
  for (const name of ANALYSIS_TYPES) {
    const item = items[name] as TypeItem;
    assert.ok(item.description.length > 10 && !item.description.includes("\n"), name);
    assert.deepEqual(item.parameters, JSON.parse(JSON.stringify(PARAMETER_SCHEMAS[name])), name);
  }
  const unauthenticated = await t.app.inject({ url: "/api/analysis-types" });
  assert.equal(unauthenticated.statusCode, 401);
  assert.equal(unauthenticated.json().code, "UNAUTHORIZED");
});

test("no live worker: every type is unavailable because no worker is running", async () => {
  for (const item of Object.values(await types())) {
    assert.deepEqual(state(item), { available: false, reason: "no worker is running", workers: 0 });
  }
});

test("available with the count of live workers offering it; otherwise the distinct reasons of live workers", async () => {
  await register("w1", ["python-stats", "summary"], [{ type: "r-report", reason: "Rscript not found" }]);
  await register(
    "w2",
    ["summary"],
    [
      { type: "python-stats", reason: "python3 not found" },
      { type: "r-report", reason: "Rscript not found" },
    ],
  );
  await register("w3", ["summary"], [{ type: "r-report", reason: "/opt/R/bin/Rscript not found" }]);
  let items = await types();
  assert.deepEqual(state(items.summary), { available: true, reason: null, workers: 3 });
  assert.deepEqual(state(items["python-stats"]), { available: true, reason: null, workers: 1 });
  assert.deepEqual(state(items["r-report"]), {
    available: false,
    reason: "/opt/R/bin/Rscript not found (1 worker); Rscript not found (2 workers)",
    workers: 0,
  });

  // A worker whose heartbeat is older than the reaper allows is not live: it neither offers nor explains.
  await t.db.sql`
    update workers set heartbeat_at = now() - ${t.config.leaseTtlMs * WORKER_STALE_TTLS + 1000} * interval '1 millisecond'
    where id in ('w1', 'w3')`;
  items = await types();
  assert.deepEqual(state(items.summary), { available: true, reason: null, workers: 1 });
  assert.deepEqual(state(items["python-stats"]), {
    available: false,
    reason: "python3 not found (1 worker)",
    workers: 0,
  });
  assert.deepEqual(state(items["r-report"]), {
    available: false,
    reason: "Rscript not found (1 worker)",
    workers: 0,
  });

  // A re-registration (the heartbeat) replaces what the worker reported.
  await register("w2", ["python-stats", "summary"], [{ type: "r-report", reason: "Rscript not found" }]);
  assert.deepEqual(state((await types())["python-stats"]), { available: true, reason: null, workers: 1 });

  await t.db.sql`update workers set heartbeat_at = now() - interval '1 day'`;
  for (const item of Object.values(await types())) {
    assert.equal(item.reason, "no worker is running");
  }
});

test("a live worker that neither offers a type nor says why: unavailable, and says so", async () => {
  await register("old", ["summary"], []);
  assert.deepEqual(state((await types())["r-report"]), {
    available: false,
    reason: "no live worker offers this analysis type",
    workers: 0,
  });
});

test("the production worker stores why it will not claim a type, and its row goes when it stops", async () => {
  const config = { ...t.config, rscript: "/nonexistent/bin/Rscript" };
  const runtime = await startWorkerRuntime(
    config,
    t.db,
    t.storage,
    createLogger({ level: "silent" }),
    1,
    processRegistry(),
  );
  try {
    const items = await types();
    assert.deepEqual(state(items.summary), { available: true, reason: null, workers: 1 });
    assert.deepEqual(state(items["r-report"]), {
      available: false,
      reason: "/nonexistent/bin/Rscript not found (1 worker)",
      workers: 0,
    });
  } finally {
    await runtime.stop();
  }
  assert.equal((await types()).summary?.reason, "no worker is running");
});
