// Reads of a task whose cost must not grow with the task's size: a queued 100,000-run task's queue
// estimate (queued tasks are not cached, so it is read on every GET of the task and in every list).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import type { Sql } from "../../src/db/client.ts";
import { ESTIMATE_CAP, taskQueueEstimates } from "../../src/tasks/read.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser } from "../helpers/queue.ts";

let db: TestDatabase;
let alice: Principal;
let bob: Principal;
let admin: Principal;

before(async () => {
  db = await createTestDatabase();
  alice = await seedUser(db.sql, "reads-alice");
  bob = await seedUser(db.sql, "reads-bob");
  admin = await seedUser(db.sql, "reads-admin", "admin");
});
after(() => db.drop());

/**
 * The estimate by its definition (docs/architecture.md, "Where a queued task stands"), from every
 * queued run: the owner's queued runs ahead of the task's first in the claim's order (type, priority,
 * then turn and id), up to ESTIMATE_CAP; each other owner at that priority up to m + 1; every queued
 * run of a higher priority, up to ESTIMATE_CAP.
 */
async function expected(taskId: string) {
  const queued = await db.sql<
    { id: string; task: string; owner: string; type: string; priority: number; turn: number }[]
  >`
    select r.id::text as id, r.task_id::text as task, r.owner_id::text as owner, r.analysis_type as type,
           r.priority, r.turn::float8 as turn
    from runs r where r.status = 'queued' order by r.turn, r.id`;
  const mine = queued.find((r) => r.task === taskId);
  assert.ok(mine, "the task has a run queued");
  const before = (r: (typeof queued)[number]) =>
    r.turn < mine.turn || (r.turn === mine.turn && BigInt(r.id) < BigInt(mine.id));
  const level = queued.filter((r) => r.type === mine.type && r.priority === mine.priority);
  const m = Math.min(ESTIMATE_CAP, level.filter((r) => r.owner === mine.owner && before(r)).length);
  const others = new Map<string, number>();
  for (const r of level) if (r.owner !== mine.owner) others.set(r.owner, (others.get(r.owner) ?? 0) + 1);
  const fromOthers = [...others.values()].reduce((n, q) => n + Math.min(q, m + 1), 0);
  const higher = Math.min(
    ESTIMATE_CAP,
    queued.filter((r) => r.type === mine.type && r.priority < mine.priority).length,
  );
  return {
    runsAhead: m + fromOthers + higher,
    usersWaiting: others.size,
    higherPriority: higher,
    estimate: true,
    noWorker: null,
  };
}

/**
 * The estimates, and how many blocks of `runs` (its heap) the statement fetched: the difference of
 * the session's pending counts around it, in one transaction (they also hold earlier transactions'
 * until the session reports them).
 */
async function estimateCost(taskIds: string[]) {
  return db.sql.begin(async (tx) => {
    const fetched = async () => {
      const [row] = await tx<{ blocks: number }[]>`
        select pg_stat_get_xact_blocks_fetched('runs'::regclass)::int as blocks`;
      return row?.blocks ?? Number.NaN;
    };
    const before = await fetched();
    const estimates = await taskQueueEstimates(tx as unknown as Sql, taskIds);
    return { estimates, blocks: (await fetched()) - before };
  });
}

describe("a queued task's estimate", () => {
  test("of a 100,000-run task reads a few of its runs, not all of them, and is the documented estimate", {
    timeout: 180_000,
  }, async () => {
    // Alice: a small task, then the big one (its runs interleave with the small one's), then
    // another small one. Bob waits at the same priority; an admin's task waits at a higher one.
    const first = await createTask(db.sql, alice, "reads", 3);
    const big = await createTask(db.sql, alice, "reads", 100_000);
    const last = await createTask(db.sql, alice, "reads", 2);
    await createTask(db.sql, bob, "reads", 5);
    await createTask(db.sql, admin, "reads", 4, { priority: 1 });
    // Another type's queue is not this one's.
    await createTask(db.sql, bob, "reads-other", 7);
    await db.sql`analyze runs`;
    const { estimates, blocks } = await estimateCost([big]);
    assert.ok(blocks < 200, `the estimate read ${blocks} blocks of runs (the task has 100,000 runs)`);
    assert.deepEqual(estimates.get(big), await expected(big));
    // The first of the big task's runs claimed (it is still queued: none is running yet): nothing is
    // ahead of its first run any more — no estimate, and still no read of its 100,000 runs.
    await db.sql`
        update runs set status = 'starting', attempt = 1, lease_token = gen_random_uuid(), lease_owner = 'w',
                        lease_expires_at = now() + interval '1 hour'
        where id in (select id from runs where task_id = ${big} order by turn, id limit 20)`;
    const claimed = await estimateCost([big]);
    assert.ok(claimed.blocks < 200, `the estimate read ${claimed.blocks} blocks of runs`);
    assert.equal(claimed.estimates.get(big), undefined);
    // A one-run task whose run is claimed: none of its runs queued, and still no read of the table
    // (its look for a queued run was a sequential scan of runs: 3,239 blocks, 70–100 ms a read).
    const single = await createTask(db.sql, alice, "reads", 1);
    await db.sql`
        update runs set status = 'starting', attempt = 1, lease_token = gen_random_uuid(), lease_owner = 'w',
                        lease_expires_at = now() + interval '1 hour'
        where task_id = ${single}`;
    await db.sql`analyze runs`;
    const one = await estimateCost([single]);
    assert.ok(one.blocks < 200, `the estimate of a claimed one-run task read ${one.blocks} blocks of runs`);
    assert.equal(one.estimates.get(single), undefined);
    for (const id of [first, last])
      assert.deepEqual((await estimateCost([id])).estimates.get(id), await expected(id));
  });
});
