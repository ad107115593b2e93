// The hot queue statements are planned once per connection, not on every execution: PostgreSQL keeps
// a prepared statement's generic plan only when it is as good as one made for the values at hand, and
// a statement whose generic plan is worse is re-planned every call (which was half of PostgreSQL's CPU
// per run). pg_prepared_statements counts both kinds of plan per statement.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { createDatabase, type Database } from "../../src/db/client.ts";
import { runClaim, runComplete, runHeartbeat, runProgress } from "../../src/queue/sql.ts";
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

test("claim, progress, heartbeat and completion reuse a generic plan", async () => {
  const owner = await seedUser(db.sql, "plans");
  const taskId = await createTask(db.sql, owner, "plans", RUNS);
  await db.sql`analyze runs`;
  for (let i = 0; i < CALLS; i++) {
    const [run] = await runClaim(one.sql, {
      workerId: "w",
      analysisType: "plans",
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
    assert.ok(run, `claim ${i} found a run`);
    const lease = { id: run.id, token: run.leaseToken };
    assert.equal((await runProgress(one.sql, [{ ...lease, progress: 50 }])).length, 1);
    assert.equal((await runHeartbeat(one.sql, [lease], 30_000)).length, 1);
    const done = await runComplete(one.sql, [{ ...lease, status: "succeeded", result: { metrics: {} } }]);
    assert.deepEqual(done.completed, [run.id]);
  }
  const [task] = await db.sql`select status, succeeded_count from tasks where id = ${taskId}`;
  assert.deepEqual(task, { status: "running", succeeded_count: CALLS });

  const plans = await one.sql<{ statement: string; generic: number; custom: number }[]>`
    select statement, generic_plans::int as generic, custom_plans::int as custom
    from pg_prepared_statements where from_sql = false`;
  const find = (pattern: RegExp) => {
    const found = plans.filter((p) => pattern.test(p.statement));
    assert.equal(found.length, 1, `one prepared statement matches ${pattern}`);
    return found[0] as (typeof plans)[number];
  };
  const statements = {
    claim: find(/with candidates as/),
    progress: find(/with i as \(/),
    heartbeat: find(/update runs r set lease_expires_at/),
    completion: find(/with done as/),
  };
  for (const [name, p] of Object.entries(statements)) {
    // PostgreSQL makes custom plans for the first five executions, then compares.
    assert.ok(p.custom <= 5, `${name}: ${p.custom} custom plans for ${CALLS} executions`);
    assert.equal(p.generic + p.custom, CALLS, `${name}: every execution counted`);
  }
});
