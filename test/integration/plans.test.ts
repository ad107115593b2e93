// The hot queue statements are planned once per connection, not on every execution: PostgreSQL keeps
// a prepared statement's generic plan only when it is as good as one made for the values at hand, and
// a statement whose generic plan is worse is re-planned every call (which was half of PostgreSQL's CPU
// per run). pg_prepared_statements counts both kinds of plan per statement.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { createDatabase, type Database } from "../../src/db/client.ts";
import {
  runClaim,
  runClaimSole,
  runClaimTurn,
  runComplete,
  runHeartbeat,
  runProgress,
} from "../../src/queue/sql.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser } from "../helpers/queue.ts";

let db: TestDatabase;
let one: Database;
before(async () => {
  db = await createTestDatabase();
  // One connection, so every statement below is prepared and planned in the same session.
  one = createDatabase(db.url, { max: 1 });
});
after(async () => {
  await one.close();
  await db.drop();
});

const CALLS = 20;
/** Enough rows that a bad generic plan (a sequential scan) costs more than planning per call. */
const RUNS = 2000;

/** How each hot statement is told apart in pg_prepared_statements. */
const STATEMENTS = {
  claim: /walk as materialized/,
  progress: /prev as \(/,
  heartbeat: /update runs r set lease_expires_at/,
  completion: /done as \(\s*update runs/,
};

/** The one prepared statement matching `pattern` on the test's connection. */
async function prepared(pattern: RegExp) {
  const rows = await one.sql<{ statement: string; generic: number; custom: number }[]>`
    select statement, generic_plans::int as generic, custom_plans::int as custom
    from pg_prepared_statements where from_sql = false`;
  const found = rows.filter((p) => pattern.test(p.statement));
  assert.equal(found.length, 1, `one prepared statement matches ${pattern}`);
  return found[0] as (typeof rows)[number];
}

/** Skips `t` (and says so) on a server without EXPLAIN (GENERIC_PLAN), before PostgreSQL 16. */
async function noGenericExplain(t: { skip(message: string): void }): Promise<boolean> {
  const [row] = await db.sql<
    { version: number }[]
  >`select current_setting('server_version_num')::int as version`;
  const version = row?.version ?? 0;
  if (version >= 160000) return false;
  t.skip(`EXPLAIN (GENERIC_PLAN) needs PostgreSQL 16 or later (server is ${version})`);
  return true;
}

/** The generic plan of a prepared statement, as text. */
async function genericPlan(statement: string): Promise<string> {
  const plan = await db.sql.unsafe(`explain (generic_plan) ${statement}`);
  return plan.map((row) => String(Object.values(row)[0])).join("\n");
}

/**
 * Owners A (RUNS runs queued, pass 100) and B (its one run claimed, nothing queued, pass 0) at
 * `type`: B is first in line with nothing to give, far below A.
 */
async function ownerBehind(type: string): Promise<void> {
  const a = await seedUser(db.sql, `${type}-a`);
  const b = await seedUser(db.sql, `${type}-b`);
  await createTask(db.sql, b, type, 1);
  await createTask(db.sql, a, type, RUNS);
  await db.sql`update runs set status = 'starting', attempt = 1, lease_token = gen_random_uuid(), lease_owner = 'w',
                 lease_expires_at = now() + interval '1 minute' where owner_id = ${b.userId}`;
  await db.sql`update queue_owners set pass = case when owner_id = ${b.userId} then 0 else 100 end
               where analysis_type = ${type}`;
}

const claimOne = (analysisType: string) =>
  runClaim(one.sql, { workerId: "w", analysisType, limit: 1, globalLimit: 0, leaseTtlMs: 30_000 });

test("claim, progress, heartbeat and completion reuse a generic plan", async () => {
  const owner = await seedUser(db.sql, "plans");
  const taskId = await createTask(db.sql, owner, "plans", RUNS);
  await db.sql`analyze runs`;
  for (let i = 0; i < CALLS; i++) {
    const [run] = await claimOne("plans");
    assert.ok(run, `claim ${i} found a run`);
    const lease = { id: run.id, token: run.leaseToken };
    assert.equal((await runProgress(one.sql, [{ ...lease, progress: 50 }])).length, 1);
    assert.equal((await runHeartbeat(one.sql, [lease], 30_000)).length, 1);
    const done = await runComplete(one.sql, [{ ...lease, status: "succeeded", result: { metrics: {} } }]);
    assert.deepEqual(done.completed, [run.id]);
  }
  const [task] = await db.sql`select status, succeeded_count from tasks where id = ${taskId}`;
  assert.deepEqual(task, { status: "running", succeeded_count: CALLS });

  for (const [name, pattern] of Object.entries(STATEMENTS)) {
    const p = await prepared(pattern);
    // PostgreSQL makes custom plans for the first five executions, then compares.
    assert.ok(p.custom <= 5, `${name}: ${p.custom} custom plans for ${CALLS} executions`);
    assert.equal(p.generic + p.custom, CALLS, `${name}: every execution counted`);
  }
});

test("the sole owner's claim reuses a generic plan that takes the owner's runs by the claim index", async (t) => {
  const owner = await seedUser(db.sql, "sole-plans");
  await createTask(db.sql, owner, "sole-plans", RUNS);
  await db.sql`analyze runs`;
  for (let i = 0; i < CALLS; i++) {
    const { runs, owners } = await runClaimSole(one.sql, {
      workerId: "w",
      analysisType: "sole-plans",
      limit: 2,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
    assert.equal(owners, 1);
    assert.equal(runs.length, 2, `claim ${i} found two runs`);
  }
  const p = await prepared(/with sole as materialized/);
  assert.ok(p.custom <= 5, `${p.custom} custom plans for ${CALLS} executions`);
  assert.equal(p.generic + p.custom, CALLS);
  if (await noGenericExplain(t)) return;
  const text = await genericPlan(p.statement);
  assert.doesNotMatch(text, /Seq Scan on runs/, `no sequential scan of runs:\n${text}`);
  assert.match(text, /runs_claim_idx/, `the owner's runs by runs_claim_idx:\n${text}`);
});

test("the next owner's claim (a turn of the whole claim) reuses a generic plan that takes runs by the claim index", async (t) => {
  const owners = await Promise.all(
    ["turn-plans-a", "turn-plans-b", "turn-plans-c"].map((n) => seedUser(db.sql, n)),
  );
  for (const o of owners) await createTask(db.sql, o, "turn-plans", RUNS / 2);
  await db.sql`analyze runs`;
  for (let i = 0; i < CALLS; i++) {
    const { runs, owners } = await runClaimTurn(one.sql, {
      workerId: "w",
      analysisType: "turn-plans",
      limit: 2,
      globalLimit: 0,
      leaseTtlMs: 30_000,
      quantum: 2,
    });
    assert.equal(owners, 3);
    assert.equal(runs.length, 2, `claim ${i} found two runs`);
  }
  const p = await prepared(/with nxt as materialized/);
  assert.ok(p.custom <= 5, `${p.custom} custom plans for ${CALLS} executions`);
  assert.equal(p.generic + p.custom, CALLS);
  if (await noGenericExplain(t)) return;
  const text = await genericPlan(p.statement);
  assert.doesNotMatch(text, /Seq Scan on runs/, `no sequential scan of runs:\n${text}`);
  assert.match(text, /runs_claim_idx/, `the owner's runs by runs_claim_idx:\n${text}`);
});

// A statement that looks runs up by id reads them by primary key. Matched to runs_live_idx (few live
// rows by the statistics), it read every entry that index had collected since the last vacuum — one
// per state change or heartbeat of every run — and their heap pages.
test("progress, heartbeat and completion find their runs by primary key, not the live-runs index", async (t) => {
  if (await noGenericExplain(t)) return;
  const owner = await seedUser(db.sql, "lookups");
  await createTask(db.sql, owner, "lookups", 500);
  // Live runs, as the statistics will see them: a few (every claim leaves one more index entry).
  for (let i = 0; i < 3; i++) await claimOne("lookups");
  await db.sql`analyze runs`;
  const [run] = await claimOne("lookups");
  assert.ok(run);
  const lease = { id: run.id, token: run.leaseToken };
  await runProgress(one.sql, [{ ...lease, progress: 10 }]);
  await runHeartbeat(one.sql, [lease], 30_000);
  await runComplete(one.sql, [{ ...lease, status: "succeeded", result: { metrics: {} } }]);
  const { progress, heartbeat, completion } = STATEMENTS;
  for (const [name, pattern] of Object.entries({ progress, heartbeat, completion })) {
    const { statement } = await prepared(pattern);
    const text = await genericPlan(statement);
    assert.doesNotMatch(text, /runs_live_idx/, `${name} does not use runs_live_idx:\n${text}`);
    assert.match(text, /runs_pkey/, `${name} uses runs_pkey:\n${text}`);
  }
});

// A claim that walked past an owner asks, per owner walked past, whether it has anything queued (to
// know whether the fair-share tidy has work). As NOT EXISTS under an OR, PostgreSQL could run that as
// one hashed scan of every queued run of the type, on every such claim: B's pickup behind A's 20,000
// runs went from ~7 to ~19 ms at the median. It is a lateral probe by the owner's keys.
test("a claim that walked past an owner probes that owner's queue by index, not every queued run", async (t) => {
  if (await noGenericExplain(t)) return;
  // B first in line with nothing queued: every claim walks past it to A.
  await ownerBehind("walk");
  const [run] = await claimOne("walk");
  assert.ok(run);
  const { statement } = await prepared(STATEMENTS.claim);
  const text = await genericPlan(statement);
  assert.doesNotMatch(text, /hashed SubPlan/, `no hashed subplan:\n${text}`);
  assert.doesNotMatch(text, /Seq Scan on runs/, `no sequential scan of runs:\n${text}`);
  // The tidy that followed (B has nothing queued) probes the same way.
  const tidy = await prepared(/left_rotation as \(/);
  const tidyPlan = await genericPlan(tidy.statement);
  assert.doesNotMatch(tidyPlan, /Seq Scan on runs/, `the tidy: no sequential scan of runs:\n${tidyPlan}`);
});

// The same under the per-user limit, where the claim also looks over the level for rows far below
// the rotation with runs queued: as EXISTS that probe became one scan of every queued run.
test("under the per-user limit, the claim's look over the level probes each owner's queue by index", async (t) => {
  if (await noGenericExplain(t)) return;
  // B far below A with nothing queued: every claim's look over the level finds it.
  await ownerBehind("limit-walk");
  const [run] = await runClaim(one.sql, {
    workerId: "w",
    analysisType: "limit-walk",
    limit: 1,
    globalLimit: 0,
    userLimit: 5,
    leaseTtlMs: 30_000,
  });
  assert.ok(run);
  const { statement } = await prepared(/as c\(owner_id bigint/);
  const text = await genericPlan(statement);
  // As EXISTS it was a bitmap scan of every queued run of the type (runs_claim_idx, then the heap).
  assert.doesNotMatch(text, /(Seq|Bitmap Heap) Scan on runs/, `no scan of every queued run:\n${text}`);
});
