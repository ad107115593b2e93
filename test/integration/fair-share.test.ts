// Fair share: the claim serves users in turn (least served first), a user's tasks in turn, and
// priority before both. A real worker with two slots and short handlers that record the order in
// which runs start; the database's own timestamps say what had finished when.
import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { NO_OBSERVER } from "../../src/queue/observer.ts";
import { Reaper } from "../../src/queue/reaper.ts";
import {
  CLAIM_QUANTUM,
  type CreatedTask,
  claimQuantum,
  queueOwnersPrune,
  queueOwnersPruneIdle,
  queueOwnersTidy,
  runClaim,
  runClaimNewcomer,
  runClaimSole,
  runClaimTurn,
  runComplete,
  runRetry,
  SHORT_ATTEMPT_SECONDS,
  TASK_CREATED_CHANNEL,
  walkHead,
} from "../../src/queue/sql.ts";
import { type Handler, Worker, type WorkerOptions } from "../../src/queue/worker.ts";
import { taskCancel } from "../../src/tasks/cancel.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser, taskRow, waitFor, waitForTerminal } from "../helpers/queue.ts";

const logger = createLogger({ level: "silent" });
let db: TestDatabase;
let running: Worker | undefined;
/** Task ids in the order their runs started, across the whole file. */
const starts: string[] = [];

before(async () => {
  db = await createTestDatabase();
});
afterEach(async () => {
  await running?.stop();
  running = undefined;
});
after(() => db.drop());

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    });
  });

function handler(ms: number): Handler {
  return async (run, { signal }) => {
    starts.push(String(run.taskId));
    await sleep(ms, signal);
    return { status: "succeeded", result: { metrics: {} } };
  };
}

async function startWorker(type: string, ms = 4, concurrency = 2): Promise<Worker> {
  return startHandler(type, handler(ms), concurrency);
}

/** A worker of `type` running `h`, stopped after the test. */
async function startHandler(
  type: string,
  h: Handler,
  concurrency: number,
  sql = db.sql,
  extra: Partial<WorkerOptions> = {},
): Promise<Worker> {
  const w = new Worker({
    sql,
    logger,
    types: { [type]: { handler: h } },
    concurrency,
    leaseTtlMs: 30_000,
    pollIntervalMs: 100,
    retryBaseMs: 20,
    ...extra,
  });
  await w.start();
  running = w;
  return w;
}

/** How many of `taskId`'s runs had finished when `otherTaskId` finished (from the database's clock). */
async function doneWhenFinished(taskId: string, otherTaskId: string): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`
    select count(*)::int as n from runs r
    where r.task_id = ${taskId} and r.finished_at <= (select t.finished_at from tasks t where t.id = ${otherTaskId})`;
  return row?.n ?? -1;
}

/**
 * How many runs of `otherTaskId` were claimed after `visibleAt` (see visibleNow) and before `taskId`'s first run was
 * (the database's clock): the slots that went to others although `taskId` was waiting.
 */
async function claimedBeforeFirst(taskId: string, otherTaskId: string, visibleAt: string): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`
    select count(*)::int as n from runs r
    where r.task_id = ${otherTaskId}
      and r.started_at > ${visibleAt}::timestamptz
      and r.started_at < (select min(q.started_at) from runs q where q.task_id = ${taskId})`;
  return row?.n ?? -1;
}

/**
 * How many runs of `others` were claimed after `visibleAt` (see visibleNow) and before `taskId`'s last run was: what
 * went to them although `taskId` still had runs waiting.
 */
async function claimedWhileWaiting(taskId: string, others: string[], visibleAt: string): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`
    select count(*)::int as n from runs r
    where r.task_id = any(${db.sql.array(others, 20)}::bigint[])
      and r.started_at > ${visibleAt}::timestamptz
      and r.started_at < (select max(q.started_at) from runs q where q.task_id = ${taskId})`;
  return row?.n ?? -1;
}

/**
 * The database's clock now: called right after a create returns, a time by which its runs were
 * visible to every claim. (Not the task's created_at: that is when the create statement began, and
 * on a loaded machine the worker went on claiming the other task's runs while it ran.)
 */
async function visibleNow(): Promise<string> {
  const [r] = await db.sql<{ t: string }[]>`select clock_timestamp()::text as t`;
  return r?.t ?? "";
}

/** The owner's pass at `type`'s default priority, or -1 without a row. */
async function passOf(type: string, u: Principal): Promise<number> {
  const [r] = await db.sql<{ pass: number }[]>`
    select pass::int from queue_owners where analysis_type = ${type} and owner_id = ${u.userId}`;
  return r?.pass ?? -1;
}

/** How many rows `type` has in the rotation. */
async function rowsOf(type: string): Promise<number> {
  const [r] = await db.sql<
    { n: number }[]
  >`select count(*)::int as n from queue_owners where analysis_type = ${type}`;
  return r?.n ?? -1;
}

/** Claims the queued runs of `owner` at `type` directly (as a claim serving only them would). */
async function claimOwned(type: string, owner: Principal): Promise<number[]> {
  const rows = await db.sql<{ id: number }[]>`
    update runs set status = 'starting', attempt = attempt + 1, lease_token = gen_random_uuid(),
                    lease_owner = 'w-direct', lease_expires_at = now() + interval '30 seconds'
    where analysis_type = ${type} and owner_id = ${owner.userId} and status = 'queued'
    returning id::float8 as id`;
  return rows.map((r) => r.id);
}

/**
 * Until a claim statement waits for a lock of this kind (`advisory`, `tuple`, ...): the fair claim's
 * (its walk), or with `turn` also the claim of the owner next in turn (runClaimTurn), which a worker's
 * loop may send instead (not right after a wake-up): a worker's claim may be either.
 */
async function claimWaiting(waitEvent: string, turn = false): Promise<void> {
  await waitFor(async () => {
    const [w] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from pg_stat_activity
      where datname = current_database() and wait_event_type = 'Lock' and wait_event = ${waitEvent}
        and (query like '%with walk as%' or (${turn} and query like '%with nxt as materialized%'))`;
    return (w?.n ?? 0) > 0;
  }, 10_000);
}

/** Claims up to `limit` due runs of `analysisType` (fair share, no global limit). */
function claimRuns(analysisType: string, limit: number, userLimit = 0, quantum?: number) {
  return runClaim(db.sql, {
    workerId: "w-fair",
    analysisType,
    limit,
    globalLimit: 0,
    userLimit,
    leaseTtlMs: 30_000,
    ...(quantum === undefined ? {} : { quantum }),
  });
}

/** runClaimSole: up to `limit` due runs while one owner alone waits at `analysisType`. */
function claimSole(analysisType: string, limit: number) {
  return runClaimSole(db.sql, {
    workerId: "w-sole",
    analysisType,
    limit,
    globalLimit: 0,
    leaseTtlMs: 30_000,
  });
}

/** db.sql, counting the statements made through it whose text contains `fragment`. */
function counting(fragment: string): { sql: typeof db.sql; count: () => number } {
  let n = 0;
  const sql = new Proxy(db.sql, {
    apply(target, self, args) {
      const strings = args[0] as unknown;
      if (Array.isArray(strings) && strings.join("").includes(fragment)) n++;
      return Reflect.apply(target, self, args);
    },
  });
  return { sql, count: () => n };
}

/** How many of `runs` each owner got, largest first. */
async function shares(runs: { id: number }[]): Promise<number[]> {
  const rows = await db.sql<{ n: number }[]>`
    select count(*)::int as n from runs r
    where r.id = any(${db.sql.array(
      runs.map((c) => c.id),
      20,
    )}::bigint[]) group by r.owner_id`;
  return rows.map((r) => r.n).sort((a, b) => b - a);
}

/** One user per name, seeded in order (ids ascending). */
async function seedUsers(...names: string[]): Promise<Principal[]> {
  const users: Principal[] = [];
  for (const name of names) users.push(await seedUser(db.sql, name));
  return users;
}

/** Fails a claimed run transiently with an hour's backoff. */
function backOff(c: { id: number; leaseToken: string }) {
  return runRetry(db.sql, [
    { id: c.id, token: c.leaseToken, delayMs: 3_600_000, refund: false, errorCode: "X", errorMessage: "x" },
  ]);
}

/** The owner of run `id`, as text ("" when there is no such run). */
async function ownerOf(id: number): Promise<string> {
  const [r] = await db.sql<{ o: string }[]>`select owner_id::text as o from runs where id = ${id}`;
  return r?.o ?? "";
}

/** Completes claimed runs as succeeded. */
function done(cs: { id: number; leaseToken: string }[]) {
  return runComplete(
    db.sql,
    cs.map((c) => ({ id: c.id, token: c.leaseToken, status: "succeeded" as const, result: { metrics: {} } })),
  );
}

/** Index in `starts` of each start of `taskId` at or after `from`. */
const startsOf = (taskId: string, from: number) =>
  starts.map((t, i) => (t === taskId && i >= from ? i : -1)).filter((i) => i >= 0);

test("B's 3 runs behind A's 300: they start at the next free slots and B ends before A is half done", async () => {
  const a = await seedUser(db.sql, "fair-a");
  const b = await seedUser(db.sql, "fair-b");
  await startWorker("fair1", 15);
  const big = await createTask(db.sql, a, "fair1", 300);
  await waitFor(async () => startsOf(big, 0).length >= 10, 20_000, "A's task to be running");
  const small = await createTask(db.sql, b, "fair1", 3);
  const smallVisible = await visibleNow();
  await waitForTerminal(db.sql, small);
  const bStarts = startsOf(small, 0);
  assert.equal(bStarts.length, 3);
  // Two slots; a claim may have been on its way while B's task was being created.
  const before = await claimedBeforeFirst(small, big, smallVisible);
  assert.ok(before <= 2, `${before} of A's runs were claimed while B's first waited`);
  // In turn with A: one of A's runs between B's, give or take a claim in flight.
  assert.ok(
    (bStarts[2] as number) - (bStarts[0] as number) <= 5,
    `B's runs were starts ${bStarts.join(", ")}`,
  );
  const aDone = await doneWhenFinished(big, small);
  assert.ok(aDone < 150, `A had ${aDone} of 300 done when B finished`);
  await waitForTerminal(db.sql, big, 60_000);
  assert.equal((await taskRow(db.sql, big)).succeeded, 300);
});

test("tasks of 200, 20 and 2 runs from three users, submitted in that order, finish 2, 20, 200", async () => {
  const users = await Promise.all(["fair-c1", "fair-c2", "fair-c3"].map((n) => seedUser(db.sql, n)));
  const [u1, u2, u3] = users as [Principal, Principal, Principal];
  const t200 = await createTask(db.sql, u1, "fair2", 200);
  const t20 = await createTask(db.sql, u2, "fair2", 20);
  const t2 = await createTask(db.sql, u3, "fair2", 2);
  // Started once all three are queued, so what the 200-run task has done when the 20-run one finishes
  // is the rotation's doing, not how long the other two creates took on a loaded machine.
  await startWorker("fair2");
  await waitForTerminal(db.sql, t200, 60_000);
  const finished = await db.sql<{ id: string }[]>`
    select t.id::text from tasks t where t.id in (${t200}, ${t20}, ${t2}) order by t.finished_at, t.id`;
  assert.deepEqual(
    finished.map((r) => r.id),
    [t2, t20, t200],
  );
  // Round robin: while the 20-run task ran, the 200-run task got about as many runs, not ten times more.
  const big = await doneWhenFinished(t200, t20);
  assert.ok(big <= 30, `the 200-run task had ${big} done when the 20-run task finished`);
});

test("a user's own tasks take turns: a new small task does not wait behind the user's big one", async () => {
  const u = await seedUser(db.sql, "fair-own");
  await startWorker("fair3", 15);
  const big = await createTask(db.sql, u, "fair3", 120);
  await waitFor(async () => startsOf(big, 0).length >= 10, 20_000, "the big task to be running");
  const small = await createTask(db.sql, u, "fair3", 5);
  const smallVisible = await visibleNow();
  await waitForTerminal(db.sql, small);
  const before = await claimedBeforeFirst(small, big, smallVisible);
  assert.ok(before <= 2, `${before} of the big task's runs were claimed while the small one's first waited`);
  const bigDone = await doneWhenFinished(big, small);
  assert.ok(bigDone < 40, `the big task had ${bigDone} of 120 done when the small one finished`);
  await waitForTerminal(db.sql, big, 60_000);
});

test("priority beats arrival: 0 before 5 before 9, whatever came first", async () => {
  const [p9, p5, p0] = await Promise.all(["prio-9", "prio-5", "prio-0"].map((n) => seedUser(db.sql, n)));
  await startWorker("fair4", 15);
  const low = await createTask(db.sql, p9 as Principal, "fair4", 60, { priority: 9 });
  await waitFor(async () => startsOf(low, 0).length >= 4, 20_000, "the priority-9 task to be running");
  const normal = await createTask(db.sql, p5 as Principal, "fair4", 30);
  const normalVisible = await visibleNow();
  await waitFor(async () => startsOf(normal, 0).length >= 4, 20_000, "the priority-5 task to be running");
  const urgent = await createTask(db.sql, p0 as Principal, "fair4", 3, { priority: 0 });
  const urgentVisible = await visibleNow();
  await waitForTerminal(db.sql, urgent);
  await waitForTerminal(db.sql, normal);
  // After the urgent task arrived, the others got only the claims in flight until its 3 had started.
  const urgentBefore = await claimedWhileWaiting(urgent, [normal, low], urgentVisible);
  assert.ok(urgentBefore <= 2, `${urgentBefore} other runs were claimed while the urgent task waited`);
  // After the normal task arrived, the priority-9 task got only the claims in flight until the normal
  // one had started every run.
  const lowBefore = await claimedWhileWaiting(normal, [low], normalVisible);
  assert.ok(lowBefore <= 2, `${lowBefore} priority-9 runs were claimed while the priority-5 task waited`);
  await waitForTerminal(db.sql, low, 60_000);
});

test("a claim of more runs than slots starts them in the order it served them: priority first, then the owners in turn", async () => {
  const [older, urgent, other] = await seedUsers("order-older", "order-urgent", "order-other");
  assert.ok(older && urgent && other);
  // The claim's statement: the priority-0 run first, then the owners at 5 in turn, each owner's runs
  // in turn order — not by id, which put the older task's runs first.
  const a = await createTask(db.sql, older, "order1", 4);
  const b = await createTask(db.sql, other, "order1", 2);
  const c = await createTask(db.sql, urgent, "order1", 1, { priority: 0 });
  const claimed = await claimRuns("order1", 7);
  assert.deepEqual(
    claimed.map((r) => String(r.taskId)),
    [c, a, a, a, a, b, b],
  );
  // A worker with one slot and a prefetch takes all five runs below in one claim and starts them in
  // the order they came: in id order the priority-0 run, created last, waited for the four others
  // (with runs of minutes, minutes in the buffer).
  const low = await createTask(db.sql, older, "order2", 4);
  const high = await createTask(db.sql, urgent, "order2", 1, { priority: 0 });
  const from = starts.length;
  await startHandler("order2", handler(20), 1, db.sql, { prefetch: 4 });
  await waitForTerminal(db.sql, low);
  await waitForTerminal(db.sql, high);
  assert.equal(starts.slice(from)[0], high, `started: ${starts.slice(from).join(", ")}`);
});

test("an owner whose only run went back to the queue after leaving the rotation is served again", async () => {
  const u = await seedUser(db.sql, "fair-rejoin");
  const taskId = await createTask(db.sql, u, "fair5", 1, { maxAttempts: 3 });
  const reaper = new Reaper({
    sql: db.sql,
    logger,
    intervalMs: 60_000,
    leaseTtlMs: 30_000,
    retryBaseMs: 1,
    workerWaitMs: 600_000,
  });
  let calls = 0;
  // Checked after the task ends: an assertion thrown in the handler would only fail the attempt.
  let rowsWhileClaimed = -1;
  const w = new Worker({
    sql: db.sql,
    logger,
    types: {
      fair5: {
        handler: async () => {
          calls++;
          if (calls === 1) {
            // Its only run is claimed: the owner has nothing queued and leaves the rotation.
            await reaper.runOnce();
            const [row] = await db.sql<{ n: number }[]>`
              select count(*)::int as n from queue_owners where owner_id = ${u.userId} and analysis_type = 'fair5'`;
            rowsWhileClaimed = row?.n ?? -1;
            return { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true };
          }
          return { status: "succeeded", result: { metrics: {} } };
        },
      },
    },
    concurrency: 1,
    leaseTtlMs: 30_000,
    pollIntervalMs: 100,
    retryBaseMs: 1,
  });
  await w.start();
  running = w;
  const row = await waitForTerminal(db.sql, taskId, 20_000);
  assert.equal(rowsWhileClaimed, 0, "the idle owner was pruned");
  assert.equal(row.status, "succeeded");
  assert.equal(calls, 2);
});

test("a claim of many slots serves users in turn, a quantum each, and leaves the backlog unscanned", async () => {
  const owners = await Promise.all(Array.from({ length: 12 }, (_, i) => seedUser(db.sql, `fair-many-${i}`)));
  for (const o of owners) await createTask(db.sql, o, "fair6", Math.max(50, 5 * CLAIM_QUANTUM));
  // Slots for two users' quanta and half of a third's.
  const slots = 2 * CLAIM_QUANTUM + Math.ceil(CLAIM_QUANTUM / 2);
  const claimed = await claimRuns("fair6", slots);
  assert.equal(claimed.length, slots);
  const byOwner = await db.sql<{ owner: string; n: number }[]>`
    select r.owner_id::text as owner, count(*)::int as n from runs r
    where r.id = any(${db.sql.array(
      claimed.map((c) => c.id),
      20,
    )}::bigint[]) group by r.owner_id`;
  // Up to CLAIM_QUANTUM runs per user in their turn: a quantum, a quantum, the rest.
  assert.deepEqual(
    byOwner.map((r) => r.n).sort((a, b) => b - a),
    [CLAIM_QUANTUM, CLAIM_QUANTUM, slots - 2 * CLAIM_QUANTUM],
  );
  // Users who got nothing are first in line next time, one turn each.
  const next = await claimRuns("fair6", 2);
  const nextOwners = await db.sql<{ owner: string }[]>`
    select distinct r.owner_id::text as owner from runs r where r.id = any(${db.sql.array(
      next.map((c) => c.id),
      20,
    )}::bigint[])`;
  const served = new Set(byOwner.map((r) => r.owner));
  assert.equal(nextOwners.length, 1, "two slots: one user's turn");
  assert.ok(
    nextOwners.every((o) => !served.has(o.owner)),
    "the next claim serves a user who waited",
  );
  const [one] = await db.sql<{ n: number }[]>`
    select count(*)::int as n from runs r where r.id = any(${db.sql.array(
      next.map((c) => c.id),
      20,
    )}::bigint[])`;
  assert.equal(one?.n, 2);
  // Only the runs it gives out are locked and written: slots + 2 runs out of the backlog.
  const [live] = await db.sql<{ n: number }[]>`
    select count(*)::int as n from runs where analysis_type = 'fair6' and status <> 'queued'`;
  assert.equal(live?.n, slots + 2);
});

test("the quantum: short attempts make the whole claim one owner's turn when more owners wait than it takes", () => {
  // Before any attempt has ended, and with attempts that are not short: the quantum.
  assert.equal(claimQuantum(undefined, 10), CLAIM_QUANTUM);
  assert.equal(claimQuantum(SHORT_ATTEMPT_SECONDS, 10), CLAIM_QUANTUM);
  assert.equal(claimQuantum(2, 10), CLAIM_QUANTUM);
  // Short: the claim's size (never below the quantum, which the claim caps at its size anyway).
  assert.equal(claimQuantum(0.001, 10), 10);
  assert.equal(claimQuantum(0.001, 2), CLAIM_QUANTUM);
  assert.equal(claimQuantum(0.001, 10, SHORT_ATTEMPT_SECONDS / 2), 10);
  // A live attempt already older than a short one: the mean is out of date.
  assert.equal(claimQuantum(0.001, 10, SHORT_ATTEMPT_SECONDS), CLAIM_QUANTUM);
  assert.equal(claimQuantum(0.001, 10, 30), CLAIM_QUANTUM);
});

test("attempts that fail at once do not make a type's runs look short: the slots they free go a quantum per owner", async () => {
  const owners = await seedUsers(...Array.from({ length: 12 }, (_, i) => `fair-qf-${i}`));
  for (const o of owners) await createTask(db.sql, o, "fair-qf", 10);
  let attempts = 0;
  // The first claim's 8 attempts fail at once (a program that cannot start); the rest take a while.
  const w = await startHandler(
    "fair-qf",
    async (_run, { signal }) => {
      if (++attempts <= 8)
        return { status: "failed", errorCode: "ANALYSIS_PROCESS_FAILED", errorMessage: "x" };
      await sleep(300, signal);
      return { status: "succeeded", result: { metrics: {} } };
    },
    8,
  );
  await waitFor(async () => attempts >= 16, 20_000, "the slots freed by the failures to be claimed again");
  await w.stop();
  running = undefined;
  const claims = await db.sql<{ runs: number; owners: number }[]>`
    select count(*)::int as runs, count(distinct owner_id)::int as owners
    from runs where analysis_type = 'fair-qf' and started_at is not null group by started_at order by started_at`;
  const big = claims.slice(1).filter((c) => c.runs >= 5);
  assert.ok(big.length > 0, `a claim of 5 or more after the failures: ${JSON.stringify(claims)}`);
  assert.ok(
    big.every((c) => c.owners >= 2),
    `with the quantum (4), a claim of 5+ serves 2+ owners: ${JSON.stringify(claims)}`,
  );
});

test("a claim with a quantum of its size serves the next owner with every slot; with fewer owners than slots, each a share", async () => {
  const owners = await seedUsers(...Array.from({ length: 12 }, (_, i) => `fair-qm-${i}`));
  for (const o of owners) await createTask(db.sql, o, "fair-qm", 40);
  const first = await claimRuns("fair-qm", 10, 0, 10);
  assert.deepEqual(await shares(first), [10], "one owner's turn, all ten slots");
  const second = await claimRuns("fair-qm", 10, 0, 10);
  assert.deepEqual(await shares(second), [10]);
  const firstOwner = await ownerOf(first[0]?.id ?? 0);
  assert.notEqual(await ownerOf(second[0]?.id ?? 0), firstOwner, "the next claim is the next owner's turn");
  // The default quantum on the same backlog: a quantum each, in turn.
  assert.deepEqual(await shares(await claimRuns("fair-qm", 10)), [
    CLAIM_QUANTUM,
    CLAIM_QUANTUM,
    10 - 2 * CLAIM_QUANTUM,
  ]);
  // Two owners and ten slots: fewer owners than the claim takes, so an even share each, whatever the quantum.
  const [a, b] = await seedUsers("fair-qm-a", "fair-qm-b");
  await createTask(db.sql, a as Principal, "fair-qm2", 20);
  await createTask(db.sql, b as Principal, "fair-qm2", 20);
  assert.deepEqual(await shares(await claimRuns("fair-qm2", 10, 0, 10)), [5, 5]);
});

test("a worker whose attempts are short gives each turn the whole claim; its first claim, before any ended, a quantum each", async () => {
  const owners = await seedUsers(...Array.from({ length: 20 }, (_, i) => `fair-qw-${i}`));
  for (const o of owners) await createTask(db.sql, o, "fair-qw", 30);
  await startWorker("fair-qw", 0, 10);
  await waitFor(
    async () => {
      const [r] = await db.sql<{ n: number }[]>`
        select count(*)::int as n from runs where analysis_type = 'fair-qw' and status <> 'succeeded'`;
      return r?.n === 0;
    },
    30_000,
    "every run to succeed",
  );
  // One claim statement, one started_at (its now()): the owners each claim served.
  const claims = await db.sql<{ at: string; runs: number; owners: number }[]>`
    select started_at::text as at, count(*)::int as runs, count(distinct owner_id)::int as owners
    from runs where analysis_type = 'fair-qw' group by started_at order by started_at`;
  const [opening, ...rest] = claims;
  assert.deepEqual({ ...opening, at: undefined }, { at: undefined, runs: 10, owners: 3 }, "4 + 4 + 2");
  // Later claims of many slots: one owner's turn each (two when that owner had fewer runs left).
  const big = rest.filter((c) => c.runs >= 5);
  const single = big.filter((c) => c.owners === 1).length;
  assert.ok(
    big.length > 0 && single * 2 > big.length,
    `${single} of ${big.length} claims of 5+ served one owner`,
  );
});

test("at the same pass the owner there first goes first, whatever the ids: a newcomer follows for one turn", async () => {
  // The newcomer has the lower id; the incumbent has a backlog and has been served.
  const newcomer = await seedUser(db.sql, "fair-newcomer");
  const incumbent = await seedUser(db.sql, "fair-incumbent");
  assert.ok(newcomer.userId < incumbent.userId);
  await createTask(db.sql, incumbent, "fair-new", 5 * CLAIM_QUANTUM);
  const claim = () => claimRuns("fair-new", CLAIM_QUANTUM);
  assert.equal((await claim()).length, CLAIM_QUANTUM);
  const newTask = await createTask(db.sql, newcomer, "fair-new", 3);
  const [joined] = await db.sql<{ pass: number }[]>`
    select pass::int from queue_owners where analysis_type = 'fair-new' and owner_id = ${newcomer.userId}`;
  assert.equal(joined?.pass, CLAIM_QUANTUM, "the newcomer joins at the back of the line");
  // Tied at that pass: the incumbent reached it first and takes this turn (by id it would not).
  const turn = await claim();
  assert.equal(turn.filter((c) => String(c.taskId) === String(newTask)).length, 0);
  // Then the newcomer is behind nobody.
  const next = await claim();
  assert.equal(next.filter((c) => String(c.taskId) === String(newTask)).length, 3);
});

test("newcomers join at the back of the line (none below) and are served in arrival order; a stream of them cannot keep an owner with a backlog waiting", async () => {
  // Ids in the opposite order of arrival: the order below is arrival, not id.
  const [c, b, a] = (await seedUsers("fair-new-c", "fair-new-b", "fair-new-a")) as [
    Principal,
    Principal,
    Principal,
  ];
  const incumbent = await seedUser(db.sql, "fair-inc2");
  assert.ok(c.userId < b.userId && b.userId < a.userId && a.userId < incumbent.userId);
  await createTask(db.sql, incumbent, "fair-two", 20);
  const claimOne = async () => {
    const [claimed] = await claimRuns("fair-two", 1);
    assert.ok(claimed);
    const [r] = await db.sql<
      { owner: string }[]
    >`select owner_id::text as owner from runs where id = ${claimed.id}`;
    return r?.owner;
  };
  const id = (u: Principal) => String(u.userId);
  for (let i = 0; i < 3; i++) assert.equal(await claimOne(), id(incumbent));
  for (const u of [a, b, c]) await createTask(db.sql, u, "fair-two", 2);
  const passes = await db.sql<{ pass: number }[]>`
    select pass::int from queue_owners where analysis_type = 'fair-two' order by owner_id`;
  assert.deepEqual(
    passes.map((p) => p.pass),
    [3, 3, 3, 3],
    "every newcomer at the back of the line, not below it or below each other",
  );
  // At pass 3: the incumbent got there first, then a, b and c as they came.
  const order = [await claimOne(), await claimOne(), await claimOne(), await claimOne()];
  assert.deepEqual(order, [incumbent, a, b, c].map(id));
  // All at pass 4 now; a fourth newcomer joins there and comes after every one of them.
  const d = await seedUser(db.sql, "fair-new-d");
  await createTask(db.sql, d, "fair-two", 2);
  const more = [await claimOne(), await claimOne(), await claimOne(), await claimOne(), await claimOne()];
  assert.deepEqual(more, [incumbent, a, b, c, d].map(id));
});

test("a newcomer joins where the owners being served stand, not at a row whose pass stopped; such an owner rejoins there", async () => {
  // Rows whose passes stopped below the rotation: `backoff` has only a run that is not due, and
  // `limited` stands for an owner the walk cannot serve (here: its row's pass set back by hand).
  const [backoff, limited, a, b] = (await seedUsers(
    "fair-stale-backoff",
    "fair-stale-limited",
    "fair-stale-a",
    "fair-stale-b",
  )) as [Principal, Principal, Principal, Principal];
  const type = "fair-stale";
  const claim = (limit: number) => claimRuns(type, limit);
  const backoffTask = await createTask(db.sql, backoff, type, 1);
  await db.sql`update runs set run_after = now() + interval '1 hour' where task_id = ${backoffTask}`;
  await createTask(db.sql, a, type, 200);
  for (let i = 0; i < 25; i++) assert.equal((await claim(CLAIM_QUANTUM)).length, CLAIM_QUANTUM);
  assert.equal(await passOf(type, a), 25 * CLAIM_QUANTUM);
  // Walked past and kept (it has a run queued); raised with the claims whenever it fell more than a
  // quantum behind where they served.
  const raisedTo = await passOf(type, backoff);
  assert.ok(raisedTo >= 23 * CLAIM_QUANTUM && raisedTo <= 24 * CLAIM_QUANTUM, `backoff's pass ${raisedTo}`);

  // B joins at A's pass, not at 0: it follows A's turn, and then they alternate.
  await createTask(db.sql, b, type, 50);
  assert.equal(await passOf(type, b), 25 * CLAIM_QUANTUM, "the newcomer joins where the served owner stands");
  const next: (string | undefined)[] = [];
  for (let i = 0; i < 10; i++) {
    const [c] = await claim(1);
    assert.ok(c);
    next.push(await ownerOf(c.id));
  }
  const ids = [a, b].map((u) => String(u.userId));
  assert.deepEqual(
    next,
    Array.from({ length: 10 }, (_, i) => ids[i % 2]),
    "A's turn, then B's, in turn",
  );

  // An owner whose row stopped below the rotation is lifted to it when it queues again, not given
  // the ~100 runs between.
  await createTask(db.sql, backoff, type, 20);
  const [pa, pb, pk] = [await passOf(type, a), await passOf(type, b), await passOf(type, backoff)];
  assert.equal(pk, Math.min(pa, pb));
  const after: (string | undefined)[] = [];
  for (let i = 0; i < 6; i++) {
    const [c] = await claim(1);
    assert.ok(c);
    after.push(await ownerOf(c.id));
  }
  for (const u of [a, b, backoff]) {
    const n = after.filter((o) => o === String(u.userId)).length;
    assert.equal(n, 2, `each of the three gets 2 of the next 6 claims: ${after.join(",")}`);
  }
  // An owner with a backlog keeps its place when it queues more.
  const before = await passOf(type, a);
  await createTask(db.sql, a, type, 1);
  assert.equal(await passOf(type, a), before);
  // And a row below the rotation (`limited`, its pass set back) does not pull a newcomer down.
  await createTask(db.sql, limited, type, 5);
  await db.sql`update queue_owners set pass = 0, since = now() - interval '1 hour'
               where analysis_type = ${type} and owner_id = ${limited.userId}`;
  const c = await seedUser(db.sql, "fair-stale-c");
  await createTask(db.sql, c, type, 5);
  assert.ok((await passOf(type, c)) >= Math.min(await passOf(type, a), await passOf(type, b)));
});

test("a claim drops the rows it walked past with nothing queued, keeps those with runs in backoff, and loses no owner to a create that commits while it runs", async () => {
  const type = "fair-left";
  const big = await seedUser(db.sql, "fair-left-big");
  const gone = await Promise.all(Array.from({ length: 30 }, (_, i) => seedUser(db.sql, `fair-left-${i}`)));
  const waiting = await seedUser(db.sql, "fair-left-backoff");
  const claim = (limit: number) => claimRuns(type, limit);
  // 30 owners served their one run each: their rows stay (the claim that served them keeps them).
  for (const u of gone) await createTask(db.sql, u, type, 1);
  const w = await createTask(db.sql, waiting, type, 1);
  await db.sql`update runs set run_after = now() + interval '1 hour' where task_id = ${w}`;
  assert.equal((await claim(30)).length, 30);
  assert.equal(await rowsOf(type), 31);
  await createTask(db.sql, big, type, 100);
  assert.equal(await passOf(type, big), 1, "big joins at the back of the line");
  // Tied at pass 1, the 30 got there first: the next claim walks past all 31, and the 30 with
  // nothing queued leave the rotation; the one with a run in backoff stays.
  assert.equal((await claim(CLAIM_QUANTUM)).length, CLAIM_QUANTUM);
  assert.equal(await rowsOf(type), 2);
  assert.equal(await passOf(type, waiting), 0, "kept; less than a quantum behind, not raised");

  // The race: a claim walks past `racer` (its queue empty) while a create of racer's commits after
  // the claim's snapshot and before the rows it passed are tidied (queueOwnersTidy, after the claim).
  // A test trigger holds the claim in its update of big's run (after the walk) until the create has
  // committed. (The tidy's own snapshot then sees the new run; the window its version condition
  // guards, between that snapshot and its lock, is checked in "the tidy after a claim drops...".)
  const racer = await seedUser(db.sql, "fair-left-racer");
  await createTask(db.sql, racer, type, 1);
  assert.equal((await claimOwned(type, racer)).length, 1);
  await db.sql`update queue_owners set pass = 0 where analysis_type = ${type} and owner_id = ${racer.userId}`;
  const HOLD = 0x686f6c64;
  const holder = await db.sql.reserve();
  try {
    await holder`select pg_advisory_lock(${HOLD})`;
    await db.sql.unsafe(`
      create function fair_left_hold() returns trigger language plpgsql as
        $$ begin perform pg_advisory_xact_lock(${HOLD}); return new; end $$;
      create trigger fair_left_hold before update on runs for each row
        when (old.owner_id = ${big.userId} and new.status = 'starting') execute function fair_left_hold();`);
    const claiming = claim(1);
    await claimWaiting("advisory");
    const racerTask = await createTask(db.sql, racer, type, 1);
    await holder`select pg_advisory_unlock(${HOLD})`;
    const claimed = await claiming;
    assert.equal(claimed.length, 1);
    assert.notEqual(String(claimed[0]?.taskId), String(racerTask));
    assert.ok((await passOf(type, racer)) >= 0, "racer's row survived the claim that walked past it");
    const [orphans] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from runs r
      where r.analysis_type = ${type} and r.status = 'queued'
        and not exists (select 1 from queue_owners q where q.analysis_type = r.analysis_type
                          and q.owner_id = r.owner_id and q.priority = r.priority)`;
    assert.equal(orphans?.n, 0, "a queued run without its owner's row is never claimed");
  } finally {
    // The lock first: the trigger's drop waits for a claim the lock may still hold.
    await holder`select pg_advisory_unlock_all()`;
    holder.release();
    await db.sql.unsafe(
      "drop trigger if exists fair_left_hold on runs; drop function if exists fair_left_hold()",
    );
  }
});

test("the tidy after a claim drops a walked-past row only at the version the walk read", async () => {
  const type = "fair-tidy";
  const u = await seedUser(db.sql, "fair-tidy-u");
  await createTask(db.sql, u, type, 1);
  assert.equal((await claimOwned(type, u)).length, 1); // nothing queued now; the row stays until tidied
  const [row] = await db.sql<{ version: string; pass: string }[]>`
    select version::text, pass::text from queue_owners where analysis_type = ${type} and owner_id = ${u.userId}`;
  assert.ok(row);
  const passed = (version: string) => ({
    passed: [{ priority: 5, ownerId: String(u.userId), version, pass: row.pass }],
    floor: [],
  });
  // The walk read an older version: a create has queued runs since (and committed); leave it.
  await queueOwnersTidy(db.sql, type, passed(String(Number(row.version) - 1)), CLAIM_QUANTUM, false, true);
  assert.equal(await rowsOf(type), 1, "a row at another version than the walk read stays");
  await queueOwnersTidy(db.sql, type, passed(row.version), CLAIM_QUANTUM, false, true);
  assert.equal(await rowsOf(type), 0, "at the version the walk read, with nothing queued, it leaves");
});

test("the tidy runs only after claims that leave it something to do, not after every claim that walks past an owner in backoff", async () => {
  const type = "fair-tidy-n";
  const { sql: counted, count } = counting("left_rotation as (");
  const claim1 = () =>
    runClaim(counted, {
      workerId: "w-tidy",
      analysisType: type,
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
  const [a, b, k] = await seedUsers("fair-tn-a", "fair-tn-b", "fair-tn-k");
  await createTask(db.sql, a as Principal, type, 40);
  await createTask(db.sql, b as Principal, type, 40);
  for (let i = 0; i < 20; i++) assert.equal((await claim1()).length, 1);
  assert.equal(count(), 0, "nothing walked past: no tidy");
  // K's only run is in backoff: K is walked past by every claim from now on.
  await createTask(db.sql, k as Principal, type, 1);
  const [kc] = await claimOwned(type, k as Principal).then((ids) => ids.map((id) => ({ id })));
  assert.ok(kc);
  await db.sql`update runs set status = 'queued', run_after = now() + interval '1 hour', lease_token = null,
                 lease_owner = null, lease_expires_at = null where id = ${kc.id}`;
  for (let i = 0; i < 20; i++) assert.equal((await claim1()).length, 1);
  // Called only when K has fallen more than the slack behind (then it is raised): every few claims.
  assert.ok(count() > 0 && count() <= 12, `${count()} tidies in 20 claims`);
});

test("a stream of newcomers does not keep an owner with a backlog waiting, even beside a row whose pass stopped", async () => {
  const type = "fair-stream";
  const b = await seedUser(db.sql, "fair-stream-b");
  const k = await seedUser(db.sql, "fair-stream-k");
  // K's pass stopped below B's (only a run in backoff); B has a backlog and was served last.
  const kt = await createTask(db.sql, k, type, 1);
  await db.sql`update runs set run_after = now() + interval '1 hour' where task_id = ${kt}`;
  await createTask(db.sql, b, type, 50);
  await db.sql`update queue_owners set pass = 11, since = now() - interval '1 hour'
               where analysis_type = ${type} and owner_id = ${k.userId}`;
  await db.sql`update queue_owners set pass = 12, since = now()
               where analysis_type = ${type} and owner_id = ${b.userId}`;
  const owners: string[] = [];
  for (let i = 0; i < 12; i++) {
    const n = await seedUser(db.sql, `fair-stream-n${i}`);
    await createTask(db.sql, n, type, 1);
    const [c] = await claimRuns(type, 1);
    assert.ok(c);
    const [r] = await db.sql<{ o: string }[]>`select owner_id::text as o from runs where id = ${c.id}`;
    owners.push(r?.o ?? "");
  }
  // Each newcomer joins at the back of the line, after those waiting there: B keeps a
  // turn in every round (B, N0, B, N1, N2, B, ...: each round has the newcomers that arrived during
  // the last, one turn each). Joining at the lowest pass from the last served owner's start up, K's
  // 11 anchored every newcomer below B, and B got none of the 12.
  const turns = owners.flatMap((o, i) => (o === String(b.userId) ? [i] : []));
  assert.ok(turns.length >= 4, `B got ${turns.length} of 12 claims: ${owners.join(",")}`);
});

test("a claim that walks past an owner does not deadlock with a retry of two owners", async () => {
  // The retry's upserts lock queue_owners rows in owner order (y, then x). The claim serves y and
  // walks past x (nothing queued): it must wait for y before it locks x, or the two wait for each
  // other.
  const type = "fair-deadlock";
  const y = await seedUser(db.sql, "fair-dl-y");
  const x = await seedUser(db.sql, "fair-dl-x");
  assert.ok(y.userId < x.userId);
  await createTask(db.sql, x, type, 1);
  assert.equal((await claimOwned(type, x)).length, 1);
  await createTask(db.sql, y, type, 10);
  await db.sql`update queue_owners set pass = case when owner_id = ${x.userId} then 0 else 10 end
               where analysis_type = ${type}`;
  const retry = await db.sql.reserve();
  try {
    await retry`begin`;
    await retry`update queue_owners set version = version + 1 where analysis_type = ${type} and owner_id = ${y.userId}`;
    const claiming = claimRuns(type, 1);
    await claimWaiting("transactionid");
    await retry`update queue_owners set version = version + 1 where analysis_type = ${type} and owner_id = ${x.userId}`;
    await retry`commit`;
    const claimed = await claiming;
    assert.equal(claimed.length, 1);
    assert.ok((await passOf(type, x)) >= 0, "x's row stays: its version moved while the claim ran");
  } finally {
    await retry`rollback`.catch(() => {});
    retry.release();
  }
});

test("an owner served again at a pass that stopped (a retry after its backoff, the per-user limit) does not take a newcomer down with it", async () => {
  // S's one run fails transiently and backs off while A is served 200 runs; then S's run is due and
  // S is served at its old pass, and N arrives.
  {
    const type = "fair-anchor-retry";
    const [a, s, n] = (await seedUsers("fair-anchor-a", "fair-anchor-s", "fair-anchor-n")) as [
      Principal,
      Principal,
      Principal,
    ];
    const claim = (limit: number) => claimRuns(type, limit);
    await createTask(db.sql, s, type, 1);
    await createTask(db.sql, a, type, 400);
    const [first] = await claim(1);
    assert.ok(first);
    assert.equal(await ownerOf(first.id), String(s.userId));
    await backOff(first);
    for (let i = 0; i < 50; i++) await claim(CLAIM_QUANTUM);
    await db.sql`update runs set run_after = now() where owner_id = ${s.userId} and status = 'queued'`;
    const [again] = await claim(1);
    assert.ok(again);
    assert.equal(await ownerOf(again.id), String(s.userId), "S is first in turn at its old pass");
    await createTask(db.sql, n, type, 100);
    assert.ok((await passOf(type, n)) >= (await passOf(type, a)), "N joins where A stands, not where S was");
    const next: (string | undefined)[] = [];
    for (let i = 0; i < 20; i++) {
      const [c] = await claim(1);
      assert.ok(c);
      next.push(await ownerOf(c.id));
    }
    // (With the pass of the one row served last, N joined at S's and took all 20.)
    assert.ok(
      next.filter((o) => o === String(a.userId)).length >= 9,
      `A's share of the next 20: ${next.join(",")}`,
    );
  }

  // U is held at the per-user limit (1) while A is served 40 runs; then U has room and is served at
  // its old pass, and N arrives.
  {
    const type = "fair-anchor-limit";
    const [a, u, n] = (await seedUsers("fair-anchor-la", "fair-anchor-lu", "fair-anchor-ln")) as [
      Principal,
      Principal,
      Principal,
    ];
    const claim = () => claimRuns(type, 1, 1);
    await createTask(db.sql, u, type, 100);
    await createTask(db.sql, a, type, 100);
    const held = await claim();
    assert.equal(await ownerOf(held[0]?.id ?? 0), String(u.userId));
    for (let i = 0; i < 40; i++) {
      const c = await claim();
      assert.equal(await ownerOf(c[0]?.id ?? 0), String(a.userId));
      await done(c);
    }
    await done(held);
    const c1 = await claim();
    assert.equal(await ownerOf(c1[0]?.id ?? 0), String(u.userId));
    await done(c1);
    await createTask(db.sql, n, type, 100);
    assert.ok((await passOf(type, n)) >= (await passOf(type, a)), "N joins where A stands, not where U was");
  }
});

test("an owner waiting for its turn keeps its place when it queues more; newcomers join at the back even after held owners are served", async () => {
  // B submits a one-run task after every claim, beside A and C with backlogs: B keeps a turn in
  // every round. (Lifted to the back of the line at each create, B got 0 of 30.)
  {
    const type = "fair-keep";
    const [a, c, b] = (await seedUsers("fair-keep-a", "fair-keep-c", "fair-keep-b")) as [
      Principal,
      Principal,
      Principal,
    ];
    for (const u of [a, c, b]) await createTask(db.sql, u, type, 50);
    const served: string[] = [];
    for (let i = 0; i < 30; i++) {
      const got = await claimRuns(type, 1);
      served.push(await ownerOf(got[0]?.id ?? 0));
      await done(got);
      await createTask(db.sql, b, type, 1);
    }
    const forB = served.filter((o) => o === String(b.userId)).length;
    assert.ok(forB >= 9, `B got ${forB} of 30 claims`);
  }
  // Per-user limit 2: eight owners hold their room while H is served 50 runs; their runs end and they
  // are served again, at their old passes, all at once; then newcomers come. Each joins at the back of
  // the line and H keeps its turns. (Anchored on the rows served last, the newcomers joined among the
  // eight and H got none of the next 40 claims.)
  {
    const type = "fair-held";
    const held = [];
    for (let i = 0; i < 8; i++) held.push(await seedUser(db.sql, `fair-held-${i}`));
    const h = await seedUser(db.sql, "fair-held-h");
    for (const u of held) await createTask(db.sql, u, type, 100);
    await createTask(db.sql, h, type, 300);
    const claim = (limit: number) => claimRuns(type, limit, 2);
    const holding = await claim(16);
    assert.equal(holding.length, 16);
    for (let i = 0; i < 50; i++) await done(await claim(1));
    await done(holding);
    await claim(16);
    const served: string[] = [];
    for (let i = 0; i < 40; i++) {
      if (i % 8 === 0) {
        const n = await seedUser(db.sql, `fair-held-n${i}`);
        await createTask(db.sql, n, type, 30);
        assert.ok(
          (await passOf(type, n)) >= (await passOf(type, h)),
          "a newcomer joins at the back of the line",
        );
      }
      const got = await claim(1);
      served.push(await ownerOf(got[0]?.id ?? 0));
      await done(got);
    }
    const forH = served.filter((o) => o === String(h.userId)).length;
    assert.ok(forH >= 8, `H got ${forH} of 40 claims: ${served.join(",")}`);
  }
});

test("an owner whose pass stopped with runs queued is raised with the rotation: served again, it takes no burst", async () => {
  const longestRun = (served: string[], who: string) => {
    let best = 0;
    let cur = 0;
    for (const o of served) {
      cur = o === who ? cur + 1 : 0;
      best = Math.max(best, cur);
    }
    return best;
  };
  // U is held at the per-user limit (4) by runs of another type while H is served 30 runs; then
  // those runs end and a newcomer comes. (Not raised, U took the next 30 claims in a row.)
  {
    const type = "fair-raise-limit";
    const [u, h, n] = (await seedUsers("fair-raise-u", "fair-raise-h", "fair-raise-n")) as [
      Principal,
      Principal,
      Principal,
    ];
    const claim = (analysisType: string, limit: number) => claimRuns(analysisType, limit, 4);
    await createTask(db.sql, u, `${type}-other`, 4);
    const other = await claim(`${type}-other`, 4);
    assert.equal(other.length, 4);
    await createTask(db.sql, u, type, 100);
    await createTask(db.sql, h, type, 100);
    for (let i = 0; i < 30; i++) {
      const got = await claim(type, 1);
      assert.equal(await ownerOf(got[0]?.id ?? 0), String(h.userId));
      await done(got);
    }
    await done(other);
    await createTask(db.sql, n, type, 100);
    const served: string[] = [];
    for (let i = 0; i < 30; i++) {
      const got = await claim(type, 1);
      served.push(await ownerOf(got[0]?.id ?? 0));
      await done(got);
    }
    assert.ok(longestRun(served, String(u.userId)) <= 2, `U's longest run of claims: ${served.join(",")}`);
    assert.ok(served.filter((o) => o === String(h.userId)).length >= 8, `H's share: ${served.join(",")}`);
  }
  // S's run backs off while A is served 50 runs; it comes due, unclaimed, and S creates 100 more.
  // (S kept the pass it stopped at and took the next 40 claims.)
  {
    const type = "fair-raise-retry";
    const [a, s] = [await seedUser(db.sql, "fair-raise-a"), await seedUser(db.sql, "fair-raise-s")] as [
      Principal,
      Principal,
    ];
    const claim = () => claimRuns(type, 1);
    await createTask(db.sql, s, type, 1);
    await createTask(db.sql, a, type, 200);
    const [first] = await claim();
    assert.ok(first);
    assert.equal(await ownerOf(first.id), String(s.userId));
    await backOff(first);
    for (let i = 0; i < 50; i++) await done(await claim());
    await db.sql`update runs set run_after = now() where owner_id = ${s.userId} and status = 'queued'`;
    await createTask(db.sql, s, type, 100);
    const served: string[] = [];
    for (let i = 0; i < 20; i++) {
      const got = await claim();
      served.push(await ownerOf(got[0]?.id ?? 0));
      await done(got);
    }
    assert.ok(served.filter((o) => o === String(a.userId)).length >= 9, `A's share: ${served.join(",")}`);
  }
});

test("under the per-user limit an owner is served at its best priority with a run due, not at one whose runs all back off", async () => {
  // X: one priority-0 run in a long backoff, 10 due at priority 1; Y: 10 due at priority 1. (Served
  // at its best priority of all, X's candidate row gave nothing and every claim came back empty.)
  const type = "fair-caps-priority";
  const [x, y] = [await seedUser(db.sql, "fair-cp-x"), await seedUser(db.sql, "fair-cp-y")] as [
    Principal,
    Principal,
  ];
  const backedOff = await createTask(db.sql, x, type, 1, { priority: 0 });
  await db.sql`update runs set run_after = now() + interval '1 hour' where task_id = ${backedOff}`;
  await createTask(db.sql, x, type, 10, { priority: 1 });
  await createTask(db.sql, y, type, 10, { priority: 1 });
  const owners: string[] = [];
  for (let i = 0; i < 6; i++) {
    const got = await claimRuns(type, 1, 4);
    assert.equal(got.length, 1, `claim ${i} came back empty`);
    const [r] = await db.sql<
      { o: string }[]
    >`select owner_id::text as o from runs where id = ${got[0]?.id ?? 0}`;
    owners.push(r?.o ?? "");
  }
  // X has 4 live runs at most: Y gets the rest.
  assert.ok(owners.filter((o) => o === String(x.userId)).length <= 4);
  assert.ok(owners.includes(String(y.userId)));
});

test("a claim sorts the owners next in turn first and reaches the rest when those have nothing due", async () => {
  const k = 1;
  const head = walkHead(k);
  const claimOne = () => claimRuns("fair-head", k);
  // More owners than the head, each with one run in backoff, all ahead in turn (pass 0)...
  const waiting = await Promise.all(
    Array.from({ length: head + 8 }, (_, i) => seedUser(db.sql, `fair-head-${i}`)),
  );
  for (const o of waiting) await createTask(db.sql, o, "fair-head", 1);
  await db.sql`update runs set run_after = now() + interval '1 hour' where analysis_type = 'fair-head'`;
  // ...and one owner far behind in turn, whose run is due.
  const late = await seedUser(db.sql, "fair-head-late");
  const lateTask = await createTask(db.sql, late, "fair-head", 1);
  await db.sql`update queue_owners set pass = 1000 where analysis_type = 'fair-head' and owner_id = ${late.userId}`;
  const [got] = await claimOne();
  assert.equal(String(got?.taskId), lateTask, "the due run behind the head is claimed");
  assert.equal((await claimOne()).length, 0, "nothing else is due");
  // Due again: one run per claim serves every owner once, in turn, across the head's boundary.
  await db.sql`update runs set run_after = now() where analysis_type = 'fair-head' and status = 'queued'`;
  const served: number[] = [];
  for (let i = 0; i < waiting.length; i++) {
    const [run] = await claimOne();
    assert.ok(run, `claim ${i} found a run`);
    const [r] = await db.sql<
      { owner: number }[]
    >`select owner_id::float8 as owner from runs where id = ${run.id}`;
    served.push(r?.owner as number);
  }
  assert.equal(new Set(served).size, waiting.length, "each waiting owner served once");
  assert.equal((await claimOne()).length, 0);
});

test("the per-user limit holds for an owner with queued runs at two priorities", async () => {
  const admin = await seedUser(db.sql, "fair-two-levels", "admin");
  await createTask(db.sql, admin, "fair7", 5, { priority: 3 });
  await createTask(db.sql, admin, "fair7", 5, { priority: 5 });
  const claim = (limit: number) => claimRuns("fair7", limit, 2);
  const first = await claim(4);
  assert.equal(first.length, 2, "two runs: the owner's room");
  assert.equal((await claim(4)).length, 0, "no room left");
  const [live] = await db.sql<{ n: number; best: number }[]>`
    select count(*)::int as n, min(priority)::int as best from runs
    where owner_id = ${admin.userId} and status in ('starting', 'running', 'cancelling')`;
  assert.deepEqual({ ...live }, { n: 2, best: 3 });
});

test("the sole owner's claim: one owner alone gets its due runs in turn order; with two owners it claims nothing and says so", async () => {
  const [a, b] = await seedUsers("sole-a", "sole-b");
  assert.ok(a && b);
  assert.deepEqual(await claimSole("sole1", 3), { runs: [], owners: 0, rows: 0 });
  const first = await createTask(db.sql, a, "sole1", 6);
  const second = await createTask(db.sql, a, "sole1", 2);
  const passBefore = await passOf("sole1", a);
  // Alone: what the fair claim would give it — its first runs in turn order (its tasks interleave).
  const next = await db.sql<{ id: number; taskId: string }[]>`
    select id::float8 as id, task_id::text as "taskId" from runs
    where owner_id = ${a.userId} and status = 'queued' order by turn, id limit 3`;
  assert.deepEqual(new Set(next.map((r) => r.taskId)), new Set([first, second]));
  const taken = await claimSole("sole1", 3);
  assert.equal(taken.owners, 1);
  // In turn order, as its turn takes them (the worker starts them in the order they come).
  assert.deepEqual(
    taken.runs.map((r) => r.id),
    next.map((r) => r.id),
  );
  for (const r of taken.runs) {
    assert.equal(r.attempt, 1);
    assert.match(r.leaseToken, /^[0-9a-f-]{36}$/);
    assert.deepEqual(r.parameters, {});
  }
  // Its pass is not advanced: alone, it orders nothing.
  assert.equal(await passOf("sole1", a), passBefore);
  // A run in backoff is not due: not claimed.
  const [backing] = (await claimSole("sole1", 1)).runs;
  assert.ok(backing);
  await backOff(backing);
  const rest = await claimSole("sole1", 10);
  assert.equal(rest.owners, 1);
  assert.equal(rest.runs.length, 4);
  assert.ok(!rest.runs.some((r) => r.id === backing.id));
  // Alone with only that run queued: nothing due, nothing claimed.
  assert.deepEqual(await claimSole("sole1", 10), { runs: [], owners: 1, rows: 1 });
  // Two owners: nothing claimed, and the answer says the fair claim decides.
  await createTask(db.sql, b, "sole1", 2);
  const queued = await db.sql<{ n: number }[]>`
    select count(*)::int as n from runs where analysis_type = 'sole1' and status = 'queued'`;
  assert.deepEqual(await claimSole("sole1", 3), { runs: [], owners: 2, rows: 2 });
  const after = await db.sql<{ n: number }[]>`
    select count(*)::int as n from runs where analysis_type = 'sole1' and status = 'queued'`;
  assert.deepEqual(after, queued);
  // Under a limit the claim is runClaim's.
  await assert.rejects(
    runClaimSole(db.sql, {
      workerId: "w",
      analysisType: "sole1",
      limit: 1,
      globalLimit: 2,
      leaseTtlMs: 30_000,
    }),
    /limit/,
  );
  await assert.rejects(claimSole("sole1", 0), /positive integer/);
});

test("beside a row whose owner's queue has emptied the sole owner's claim claims nothing and says so; the type's prune removes such rows only", async () => {
  const [a, b, c] = await seedUsers("sole6-a", "sole6-b", "sole6-c");
  assert.ok(a && b && c);
  await createTask(db.sql, a, "sole6", 5);
  await createTask(db.sql, b, "sole6", 1);
  // C's idle row at another type must stay.
  await createTask(db.sql, c, "sole6-other", 1);
  const [other] = await claimRuns("sole6-other", 1);
  assert.ok(other);
  await done([other]);
  assert.deepEqual(await claimSole("sole6", 3), { runs: [], owners: 2, rows: 2 });
  // B's one run taken and finished by fair claims: its row stays (nothing walked past it since).
  let bRun: { id: number; leaseToken: string } | undefined;
  while (!bRun) {
    const [r] = await claimRuns("sole6", 1);
    assert.ok(r);
    if ((await ownerOf(r.id)) === String(b.userId)) bRun = r;
  }
  await done([bRun]);
  assert.equal(await rowsOf("sole6"), 2);
  // A waits alone, but B's row would keep its old place: nothing claimed, and the answer says why.
  assert.deepEqual(await claimSole("sole6", 10), { runs: [], owners: 1, rows: 2 });
  assert.equal(await queueOwnersPruneIdle(db.sql, "sole6"), 1);
  assert.equal(await rowsOf("sole6"), 1);
  assert.equal(await rowsOf("sole6-other"), 1);
  // Alone now: the sole owner's claim serves A.
  const alone = await claimSole("sole6", 10);
  assert.equal(alone.owners, 1);
  assert.equal(alone.rows, 1);
  assert.ok(alone.runs.length > 0);
  for (const r of alone.runs) assert.equal(await ownerOf(r.id), String(a.userId));
  // Nothing queued: no owner, the row still listed (the worker prunes it).
  assert.deepEqual(await claimSole("sole6", 10), { runs: [], owners: 0, rows: 1 });
  // A run in backoff still counts its owner as waiting, and its row is not pruned.
  const [retried] = alone.runs;
  assert.ok(retried);
  await backOff(retried);
  assert.deepEqual(await claimSole("sole6", 10), { runs: [], owners: 1, rows: 1 });
  assert.equal(await queueOwnersPruneIdle(db.sql, "sole6"), 0);
  assert.equal(await rowsOf("sole6"), 1);
});

test("the reaper's prune removes idle rows at every type; it keeps owners with runs queued or in backoff, and a row a create holds", async () => {
  const [a, b, c, d, e] = await seedUsers("prune-a", "prune-b", "prune-c", "prune-d", "prune-e");
  assert.ok(a && b && c && d && e);
  const rowOf = async (type: string, u: Principal) => {
    const [r] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from queue_owners where analysis_type = ${type} and owner_id = ${u.userId}`;
    return r?.n;
  };
  /** An owner whose queue emptied (its task cancelled) and whose row stays: nothing walked past it. */
  const idle = async (type: string, u: Principal) => {
    const t = await createTask(db.sql, u, type, 1);
    assert.equal((await taskCancel(db.sql, u, t)).kind, "cancelling");
    assert.equal(await rowOf(type, u), 1);
  };
  // B: its run at prune-y backs off (still queued). C: two runs queued at prune-y.
  await createTask(db.sql, b, "prune-y", 1);
  const [rb] = await claimRuns("prune-y", 1);
  assert.ok(rb);
  await backOff(rb);
  await createTask(db.sql, c, "prune-y", 2);
  // Idle rows at both types: A and D at prune-x, E at prune-y.
  await idle("prune-x", a);
  await idle("prune-x", d);
  await idle("prune-y", e);
  await db.sql.begin(async (tx) => {
    // D's create, bringing D back, holds its row until this transaction commits: the prune skips it.
    await createTask(tx as unknown as typeof db.sql, d, "prune-x", 1);
    assert.ok((await queueOwnersPrune(db.sql)) >= 2);
  });
  assert.deepEqual(
    [
      await rowOf("prune-x", a),
      await rowOf("prune-y", e),
      await rowOf("prune-x", d),
      await rowOf("prune-y", b),
      await rowOf("prune-y", c),
    ],
    [0, 0, 1, 1, 1],
  );
  // Nothing idle at these types now: a second prune leaves them all.
  await queueOwnersPrune(db.sql);
  assert.deepEqual(
    [await rowOf("prune-x", d), await rowOf("prune-y", b), await rowOf("prune-y", c)],
    [1, 1, 1],
  );
});

test("the type's prune skips a row that a create bringing its owner back holds, and the row stays", async () => {
  const type = "sole9";
  const [b] = await seedUsers("sole9-b");
  assert.ok(b);
  const gone = await createTask(db.sql, b, type, 2);
  assert.equal((await taskCancel(db.sql, b, gone)).kind, "cancelling");
  assert.equal(await rowsOf(type), 1);
  let pruned = -1;
  await db.sql.begin(async (tx) => {
    // The create's upsert holds B's row until this transaction commits.
    await createTask(tx as unknown as typeof db.sql, b, type, 2);
    pruned = await queueOwnersPruneIdle(db.sql, type);
  });
  assert.equal(pruned, 0);
  assert.equal(await rowsOf(type), 1);
  const back = await claimSole(type, 5);
  assert.equal(back.runs.length, 2);
  assert.equal(back.owners, 1);
  assert.equal(back.rows, 1);
});

test("an owner served alone by the sole owner's claim and a newcomer then take turns from the first fair claim", async () => {
  const [a, b] = await seedUsers("sole2-a", "sole2-b");
  assert.ok(a && b);
  await createTask(db.sql, a, "sole2", 40);
  // A alone for 20 runs (its pass stays where it was).
  for (let i = 0; i < 4; i++) assert.equal((await claimSole("sole2", 5)).runs.length, 5);
  await createTask(db.sql, b, "sole2", 10);
  // Fair claims of one slot: A (there first, at the same pass) then B, in turn — neither takes a burst.
  const order: string[] = [];
  for (let i = 0; i < 10; i++) {
    const [c] = await claimRuns("sole2", 1);
    assert.ok(c);
    order.push((await ownerOf(c.id)) === String(a.userId) ? "A" : "B");
  }
  assert.deepEqual(order, ["A", "B", "A", "B", "A", "B", "A", "B", "A", "B"]);
});

test("a worker claims with the sole owner's claim while one user waits, and serves a newcomer at the next free slots", async () => {
  const [a, b] = await seedUsers("sole3-a", "sole3-b");
  assert.ok(a && b);
  await db.sql`select pg_stat_reset()`;
  const big = await createTask(db.sql, a, "sole3", 120);
  await startWorker("sole3", 10);
  await waitFor(async () => (await taskRow(db.sql, big)).succeeded >= 20);
  // While A was alone the rotation was never advanced: every claim was the sole owner's.
  assert.equal(await passOf("sole3", a), 0);
  const small = await createTask(db.sql, b, "sole3", 2);
  const visibleAt = await visibleNow();
  await waitForTerminal(db.sql, small);
  // B's runs took the next free slots (at most one claim of A's per slot in between: two slots, each
  // of which may have been claimed just before B's runs were visible).
  assert.ok((await claimedBeforeFirst(small, big, visibleAt)) <= 2);
  await waitForTerminal(db.sql, big);
});

test("after a sole owner's claim finds a newcomer waiting, the worker's next statement is the fair claim, not the next owner's claim", async () => {
  const type = "sole10";
  // The claim statements the worker sends, in order, by kind.
  const kinds: string[] = [];
  const kindOf: [string, string][] = [
    ["with sole as materialized", "sole"],
    ["with nxt as materialized", "turn"],
    ["with walk as materialized", "fair"],
  ];
  const recorded = new Proxy(db.sql, {
    apply(target, self, args) {
      const strings = args[0] as unknown;
      if (Array.isArray(strings)) {
        const text = strings.join("");
        const kind = kindOf.find(([fragment]) => text.includes(fragment));
        if (kind) kinds.push(kind[1]);
      }
      return Reflect.apply(target, self, args);
    },
  });
  const [a, b] = await seedUsers("sole10-a", "sole10-b");
  assert.ok(a && b);
  const big = await createTask(db.sql, a, type, 3000);
  let small = "";
  // Marks the first start of B's runs among the statements.
  const marking: Handler = async (run) => {
    if (String(run.taskId) === small) kinds.push("B");
    return { status: "succeeded", result: { metrics: {} } };
  };
  // Short attempts on 4 slots: the worker's quantum is its whole claim, so it has the next owner's
  // claim to choose from.
  await startHandler(type, marking, 4, recorded);
  await waitFor(async () => (await taskRow(db.sql, big)).succeeded >= 40);
  // B's runs come due 300 ms after its create: the claim its create's wake-up makes finds none due,
  // and the sole owner's claims after it find B waiting (its runs back off) without a wake-up.
  // From before the create: the worker may claim before this test sees the commit. And from the
  // statement before that, which may still be on its way: sent before the create, it can run after
  // the create's commit and find B (the pair then straddled the mark, and the window held only its
  // second half: "fair fair turn fair …", under two test files' load).
  const from = Math.max(0, kinds.length - 1);
  small = await db.sql.begin(async (tx) => {
    const id = await createTask(tx as unknown as typeof db.sql, b, type, 2);
    await tx`update runs set run_after = now() + interval '300 milliseconds' where task_id = ${id}`;
    return id;
  });
  await waitForTerminal(db.sql, small);
  // A still had runs queued (so every sole owner's claim until B's first start found both owners).
  assert.ok((await taskRow(db.sql, big)).succeeded < 3000, "A was still draining");
  const end = kinds.indexOf("B", from);
  assert.ok(end > from, kinds.slice(from).join(" "));
  const window = kinds.slice(from, end);
  const pairs = window.slice(1).map((k, i) => `${window[i]}→${k}`);
  // The case arose (the check below can fail), and every time the next statement was the fair claim.
  assert.ok(pairs.includes("sole→fair"), window.join(" "));
  assert.ok(!pairs.includes("sole→turn"), window.join(" "));
  assert.equal((await taskCancel(db.sql, a, big)).kind, "cancelling");
});

test("a claim hands its upkeep to tidyAside, which runs it; a tidyAside that throws gets it done in the claim", async () => {
  const type = "tidy-aside";
  const [a, k, j] = await seedUsers("aside-a", "aside-k", "aside-j");
  assert.ok(a && k && j);
  const rowOf = async (u: Principal) => {
    const [r] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from queue_owners where analysis_type = ${type} and owner_id = ${u.userId}`;
    return r?.n;
  };
  /** An owner whose queue emptied, its row at priority 0: every claim at priority 5 walks past it. */
  const idle = async (u: Principal) => {
    const t = await createTask(db.sql, u, type, 1, { priority: 0 });
    assert.equal((await taskCancel(db.sql, u, t)).kind, "cancelling");
    assert.equal(await rowOf(u), 1);
  };
  const claim = (tidyAside: (upkeep: () => Promise<void>) => void) =>
    runClaim(db.sql, {
      workerId: "w-aside",
      analysisType: type,
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 30_000,
      tidyAside,
    });
  await createTask(db.sql, a, type, 5);
  await idle(k);
  let upkeep: (() => Promise<void>) | undefined;
  const first = await claim((u) => {
    upkeep = u;
  });
  assert.equal(first.length, 1);
  assert.equal(await ownerOf((first[0] as { id: number }).id), String(a.userId));
  assert.ok(upkeep, "the claim handed its upkeep over");
  assert.equal(await rowOf(k), 1, "not done before the caller runs it");
  await upkeep();
  assert.equal(await rowOf(k), 0);
  await idle(j);
  const second = await claim(() => {
    throw new Error("injected: the caller cannot take it");
  });
  assert.equal(second.length, 1, "the claimed run reached the caller");
  assert.equal(await rowOf(j), 0, "done in the claim instead");
});

test("a worker's next claim of a type waits for its last claim's upkeep, which does not hold back the runs claimed", async () => {
  const type = "aside-w";
  // The worker's statements, in order; each upkeep (queueOwnersTidy) takes 30 ms more.
  const events: string[] = [];
  const delayed = new Proxy(db.sql, {
    apply(target, self, args) {
      const strings = args[0] as unknown;
      const text = Array.isArray(strings) ? strings.join("") : "";
      if (text.includes("left_rotation as (")) {
        events.push("tidy");
        return (async () => {
          await new Promise((resolve) => setTimeout(resolve, 30));
          const result = await Reflect.apply(target, self, args);
          events.push("tidied");
          return result;
        })();
      }
      if (/with (walk|sole|nxt) as materialized/.test(text)) events.push("claim");
      return Reflect.apply(target, self, args);
    },
  });
  const [a, k] = await seedUsers("aside-w-a", "aside-w-k");
  assert.ok(a && k);
  // K's only run backs off for an hour: every claim walks past K, and K is raised every few claims.
  const kt = await createTask(db.sql, k, type, 1);
  await db.sql`update runs set run_after = now() + interval '1 hour' where task_id = ${kt}`;
  const big = await createTask(db.sql, a, type, 40);
  const h = handler(5);
  const startedAt: number[] = [];
  await startHandler(
    type,
    async (run, ctx) => {
      startedAt.push(events.length);
      return h(run, ctx);
    },
    1,
    delayed,
  );
  await waitForTerminal(db.sql, big);
  assert.ok(events.includes("tidied"), events.join(" "));
  // No claim while an upkeep runs; and some run started while one did (it did not wait for it).
  let inUpkeep = false;
  let startedBeside = false;
  for (const [i, e] of events.entries()) {
    if (e === "tidy") inUpkeep = true;
    if (e === "tidied") inUpkeep = false;
    if (e === "claim") assert.ok(!inUpkeep, `a claim during an upkeep: ${events.slice(0, i + 1).join(" ")}`);
    if (inUpkeep && startedAt.includes(i + 1)) startedBeside = true;
  }
  assert.ok(startedBeside, "a run claimed before an upkeep started while it ran");
});

test("a worker whose sole owner has nothing left prunes its row out of the rotation", async () => {
  const walks = counting("with walk as materialized");
  let prunes = 0;
  // The prune is the only transaction of a claim without limits: count them.
  const counted = new Proxy(walks.sql, {
    get(target, prop, receiver) {
      if (prop === "begin") prunes++;
      return Reflect.get(target, prop, receiver);
    },
  });
  const [a] = await seedUsers("sole4-a");
  assert.ok(a);
  const task = await createTask(db.sql, a, "sole4", 10);
  await startHandler("sole4", handler(2), 2, counted);
  await waitForTerminal(db.sql, task);
  // No reaper runs here and the sole owner's claim never tidies: the worker's prune removes it. A
  // claim while the prune is in flight goes to the fair claim: one per slot freed meanwhile (two) or
  // a poll (every 100 ms), a few at most.
  await waitFor(async () => (await rowsOf("sole4")) === 0);
  assert.ok(prunes >= 1, "the worker pruned");
  assert.ok(walks.count() <= 3, `${walks.count()} fair claims`);
});

test("a worker serving a sole owner beside a row whose owner has nothing queued prunes that row at once", async () => {
  const type = "sole7";
  const walks = counting("with walk as materialized");
  const [a, b] = await seedUsers("sole7-a", "sole7-b");
  assert.ok(a && b);
  const big = await createTask(db.sql, a, type, 40);
  const gone = await createTask(db.sql, b, type, 3);
  assert.equal((await taskCancel(db.sql, b, gone)).kind, "cancelling");
  assert.equal((await taskRow(db.sql, gone)).status, "cancelled");
  // B's queue is empty but its row stays: nothing has walked past it, and no reaper runs here.
  assert.equal(await rowsOf(type), 2);
  await startHandler(type, handler(10), 2, walks.sql);
  await waitFor(async () => (await rowsOf(type)) === 1);
  const whilePruning = walks.count();
  // Pruned while A's task was still draining. The cycle that found the row claims the fair way, and so
  // does every claim before the prune beside it has committed; after it, only the one claim that may
  // have been in flight (before, the fair claim served for a second: all ~20 claims of this drain).
  assert.ok((await taskRow(db.sql, big)).succeeded < 40);
  await waitForTerminal(db.sql, big);
  assert.ok(whilePruning >= 1, "the cycle that found the row claimed the fair way");
  assert.ok(
    walks.count() <= whilePruning + 1,
    `${walks.count()} fair claims, ${whilePruning} before the prune`,
  );
});

test("a prune that fails leaves the worker claiming the fair way; the task still drains", async () => {
  const type = "sole8";
  let begins = 0;
  // The prune is the only transaction of a claim without limits: every sql.begin fails.
  const failing = new Proxy(db.sql, {
    get(target, prop, receiver) {
      if (prop === "begin")
        return async () => {
          begins++;
          throw new Error("injected: the prune's transaction failed");
        };
      return Reflect.get(target, prop, receiver);
    },
  });
  const [a, b] = await seedUsers("sole8-a", "sole8-b");
  assert.ok(a && b);
  const big = await createTask(db.sql, a, type, 60);
  // At a worse priority: no fair claim serving A walks past B's row (and tidies it).
  const gone = await createTask(db.sql, b, type, 3, { priority: 9 });
  assert.equal((await taskCancel(db.sql, b, gone)).kind, "cancelling");
  const began = performance.now();
  await startHandler(type, handler(5), 2, failing);
  await waitForTerminal(db.sql, big);
  const seconds = (performance.now() - began) / 1000;
  assert.equal((await taskRow(db.sql, big)).succeeded, 60);
  // Tried, and after a prune that removed nothing not again for SOLE_RECHECK_MS (~30 claims here).
  assert.ok(begins >= 1, "the prune was tried");
  assert.ok(begins <= Math.ceil(seconds) + 1, `${begins} prunes in ${seconds.toFixed(1)} s`);
});

test("with two owners waiting the worker tries the sole owner's claim at most once a second (SOLE_RECHECK_MS)", async () => {
  const type = "sole5";
  const { sql: counted, count } = counting("with sole as materialized");
  const [a, b] = await seedUsers("sole5-a", "sole5-b");
  assert.ok(a && b);
  const ta = await createTask(db.sql, a, type, 30);
  const tb = await createTask(db.sql, b, type, 30);
  const began = performance.now();
  await startHandler(type, handler(5), 2, counted);
  await waitForTerminal(db.sql, ta);
  await waitForTerminal(db.sql, tb);
  const seconds = (performance.now() - began) / 1000;
  // ~30 claims of a slot each; without the recheck interval every one would have tried it first.
  assert.ok(count() <= Math.ceil(seconds) + 2, `${count()} sole claims in ${seconds.toFixed(1)} s`);
});

test("a turn that takes the whole claim is the next owner's claim; an owner short of due runs gets them and the fair claim gives the rest", async () => {
  const type = "turn1";
  const { sql: counted, count } = counting("with nxt as materialized");
  /** How many runs each next owner's claim took. */
  const took: number[] = [];
  // As the worker claims (Worker.claim): the next owner's claim, and the fair claim for what it left.
  const claim = async (limit: number) => {
    const o = {
      workerId: "w-turn",
      analysisType: type,
      limit,
      globalLimit: 0,
      leaseTtlMs: 30_000,
      quantum: limit,
    };
    const turn = await runClaimTurn(counted, o);
    assert.ok(turn.owners > limit, `${turn.owners} owners wait`);
    took.push(turn.runs.length);
    if (turn.runs.length === limit) return turn.runs;
    return [...turn.runs, ...(await runClaim(db.sql, { ...o, limit: limit - turn.runs.length }))];
  };
  const owners = await seedUsers(...Array.from({ length: 5 }, (_, i) => `turn1-${i}`));
  for (const o of owners) await createTask(db.sql, o, type, 6);
  const ids = owners.map((o) => String(o.userId));
  const servedBy = async (cs: { id: number }[]) => Promise.all(cs.map((c) => ownerOf(c.id)));
  // Five owners wait, claims of two with a quantum of two: each claim is the next owner's, in turn.
  for (let i = 0; i < 5; i++) {
    const got = await claim(2);
    assert.deepEqual(await servedBy(got), [ids[i], ids[i]], `claim ${i}`);
  }
  assert.equal(count(), 5, "each was the next owner's claim");
  assert.deepEqual(took, [2, 2, 2, 2, 2], "and took the whole claim");
  for (let i = 0; i < 5; i++) assert.equal(await passOf(type, owners[i] as Principal), 2);
  // Owner 0, next in turn again, has one due run left (the rest back off): it gets that one, and
  // the fair claim gives the other slot to the next owner in turn.
  const [o0, o1] = owners as [Principal, Principal];
  const o0Queued = await db.sql<{ id: number; token: string }[]>`
    select id::float8 as id from runs where owner_id = ${o0.userId} and status = 'queued' order by turn, id`;
  await db.sql`update runs set run_after = now() + interval '1 hour'
               where id = any(${db.sql.array(
                 o0Queued.slice(1).map((r) => r.id),
                 20,
               )}::bigint[])`;
  const mixed = await claim(2);
  assert.deepEqual((await servedBy(mixed)).sort(), [String(o0.userId), String(o1.userId)].sort());
  assert.ok(mixed.some((c) => c.id === o0Queued[0]?.id));
  assert.equal(took.at(-1), 1, "the next owner's claim took owner 0's one due run");
  // Owners 2, 3 and 4 take their turns (pass 4); then owner 0 is next in turn again (pass 3, served
  // before owner 1 in that claim) with nothing due: the fair claim walks past it to owner 1.
  for (let i = 2; i < 5; i++) assert.deepEqual(await servedBy(await claim(2)), [ids[i], ids[i]]);
  const tried = count();
  const past = await claim(2);
  assert.deepEqual(await servedBy(past), [ids[1], ids[1]]);
  assert.equal(count(), tried + 1, "the next owner's claim was tried first");
  assert.equal(took.at(-1), 0, "and took nothing");
  // Not for a turn smaller than the claim, nor under a limit; with k or fewer owners, nothing.
  const base = { workerId: "w-turn", analysisType: type, limit: 2, globalLimit: 0, leaseTtlMs: 30_000 };
  await assert.rejects(runClaimTurn(db.sql, { ...base, quantum: 1 }), /whole claim/);
  await assert.rejects(runClaimTurn(db.sql, { ...base, quantum: 2, userLimit: 3 }), /limit/);
  assert.deepEqual(await runClaimTurn(db.sql, { ...base, limit: 5, quantum: 5 }), { runs: [], owners: 5 });
});

test("a worker whose attempts are short claims the next owner's turn with the small claim while many owners wait", async () => {
  const type = "turn2";
  const { sql: counted, count } = counting("with nxt as materialized");
  const owners = await seedUsers(...Array.from({ length: 12 }, (_, i) => `turn2-${i}`));
  const tasks: string[] = [];
  for (const o of owners) tasks.push(await createTask(db.sql, o, type, 10));
  const w = new Worker({
    sql: counted,
    logger,
    types: { [type]: { handler: handler(1) } },
    concurrency: 3,
    leaseTtlMs: 30_000,
    pollIntervalMs: 100,
    retryBaseMs: 20,
  });
  await w.start();
  running = w;
  for (const t of tasks) await waitForTerminal(db.sql, t);
  // Twelve owners, claims of at most three slots: once the attempts are known to be short, turns
  // take whole claims, and those are the next owner's claims.
  assert.ok(count() > 0, "the next owner's claim was used");
});

/** A task of `n` runs of `type` for `owner` whose runs are not due for an hour (its owner's row stays). */
function createNotDue(owner: Principal, type: string, n: number): Promise<string> {
  return db.sql.begin(async (tx) => {
    const id = await createTask(tx as unknown as typeof db.sql, owner, type, n);
    await tx`update runs set run_after = now() + interval '1 hour' where task_id = ${id}`;
    return id;
  });
}

/** runClaimNewcomer for `task` (as its creation's notification names it), without limits. */
function claimNewcomer(analysisType: string, task: CreatedTask) {
  return runClaimNewcomer(
    db.sql,
    { workerId: "w-newcomer", analysisType, limit: 1, globalLimit: 0, leaseTtlMs: 30_000 },
    task,
  );
}

/** What a create's notification says of `taskId` (its first run, owner and priority), from the table. */
async function createdOf(taskId: string): Promise<CreatedTask> {
  const [t] = await db.sql<CreatedTask[]>`
    select t.id::float8 as "taskId", (select min(r.id) from runs r where r.task_id = t.id)::float8 as "runId",
           t.owner_id::float8 as "ownerId", t.priority
    from tasks t where t.id = ${taskId}`;
  assert.ok(t);
  return t;
}

test("a create names its task and first run on the created channel; the newcomer's claim takes that run once, while the owner is within a turn of the least served", async () => {
  const type = "newcomer1";
  const [a, b] = await seedUsers("newcomer1-a", "newcomer1-b");
  assert.ok(a && b);
  const payloads: string[] = [];
  const listening = await db.sql.listen(TASK_CREATED_CHANNEL, (p) => payloads.push(p));
  try {
    await createTask(db.sql, a, type, 6);
    const tasks: string[] = [];
    for (let i = 0; i <= CLAIM_QUANTUM + 1; i++) tasks.push(await createTask(db.sql, b, type, 2));
    const first = tasks[0] as string;
    const created = await waitFor(async () =>
      payloads.map((p) => JSON.parse(p) as Record<string, unknown>).find((p) => String(p.taskId) === first),
    );
    const expected = await createdOf(first);
    assert.deepEqual(created, { type, ...expected });
    assert.deepEqual(expected, {
      taskId: Number(first),
      runId: expected.runId,
      ownerId: b.userId,
      priority: 5,
    });
    const before = await passOf(type, b);
    // Each task's first run, one claim each, the pass one further each time: from the least served's
    // pass (A's and B's are level: B joined at the top of the level) up to a quantum above it.
    for (let i = 0; i <= CLAIM_QUANTUM; i++) {
      const task = await createdOf(tasks[i] as string);
      const runs = await claimNewcomer(type, task);
      assert.deepEqual(
        runs.map((r) => r.id),
        [task.runId],
        `task ${i + 1}`,
      );
      assert.equal(await passOf(type, b), before + i + 1);
      // Once: the run is taken (another worker told of the same task gets nothing).
      assert.deepEqual(await claimNewcomer(type, task), []);
    }
    // A turn ahead of A now: no more that way; its runs are the rotation's.
    assert.deepEqual(await claimNewcomer(type, await createdOf(tasks[CLAIM_QUANTUM + 1] as string)), []);
    assert.equal(await passOf(type, b), before + CLAIM_QUANTUM + 1);
    // A's runs were never touched.
    const [left] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from runs where owner_id = ${a.userId} and status = 'queued'`;
    assert.equal(left?.n, 6);
  } finally {
    await listening.unlisten();
  }
});

test("the newcomer's claim takes nothing while an owner waits at a better priority, nor a run not due or held by another claim, and is refused under limits", async () => {
  const type = "newcomer2";
  const [a, b, c] = await seedUsers("newcomer2-a", "newcomer2-b", "newcomer2-c");
  assert.ok(a && b && c);
  await createTask(db.sql, a, type, 3, { priority: 2 });
  const small = await createdOf(await createTask(db.sql, b, type, 2));
  assert.deepEqual(await claimNewcomer(type, small), []);
  assert.equal(await passOf(type, b), 0);
  // With the better priority's runs gone and its row pruned, B could be served.
  await claimOwned(type, a);
  await db.sql`delete from queue_owners where analysis_type = ${type} and owner_id = ${a.userId}`;
  // A run in backoff is not due.
  const later = await createTask(db.sql, c, type, 1);
  await db.sql`update runs set run_after = now() + interval '1 hour' where task_id = ${later}`;
  assert.deepEqual(await claimNewcomer(type, await createdOf(later)), []);
  assert.equal(await passOf(type, c), 0);
  // B's first run held by another claim (its row locked): nothing, not B's second run.
  const holder = await db.sql.reserve();
  try {
    await holder`begin`;
    await holder`select 1 from runs where id = ${small.runId} for update`;
    assert.deepEqual(await claimNewcomer(type, small), []);
    assert.equal(await passOf(type, b), 0);
  } finally {
    await holder`rollback`.catch(() => {});
    holder.release();
  }
  assert.deepEqual(
    (await claimNewcomer(type, small)).map((r) => r.id),
    [small.runId],
  );
  await assert.rejects(
    runClaimNewcomer(
      db.sql,
      { workerId: "w", analysisType: type, limit: 1, globalLimit: 2, leaseTtlMs: 30_000 },
      small,
    ),
    /limit/,
  );
  await assert.rejects(
    runClaimNewcomer(
      db.sql,
      { workerId: "w", analysisType: type, limit: 1, globalLimit: 0, userLimit: 1, leaseTtlMs: 30_000 },
      small,
    ),
    /limit/,
  );
});

test("a newcomer's first run starts while the worker's claim waits (the newcomer's claim goes beside it)", async () => {
  const type = "newcomer3";
  const [d, a, c, b] = await seedUsers("newcomer3-d", "newcomer3-a", "newcomer3-c", "newcomer3-b");
  assert.ok(d && a && b && c);
  const started: string[] = [];
  const h: Handler = async (run) => {
    started.push(String(run.taskId));
    return { status: "succeeded", result: { metrics: {} } };
  };
  await startHandler(type, h, 2, db.sql, { prefetchWindowMs: 200 });
  // The worker learns that the type's runs are short (a newcomer's claim beside a claim in flight
  // is made only then: a slot frees soon whatever that claim takes).
  await waitForTerminal(db.sql, await createTask(db.sql, d, type, 3));
  // A's and C's runs, not due yet: their rotation rows are there for the test to hold A's.
  const aTask = await createNotDue(a, type, 3);
  const cTask = await createNotDue(c, type, 3);
  // A's rotation row held: once A's and C's runs are due, the worker's fair claim (two owners wait)
  // locks the rows of the owners it served, and waits.
  const holder = await db.sql.reserve();
  try {
    await holder`begin`;
    await holder`select 1 from queue_owners where analysis_type = ${type} and owner_id = ${a.userId} for update`;
    await db.sql`update runs set run_after = now() where task_id in (${aTask}, ${cTask})`;
    await claimWaiting("transactionid", true);
    const before = started.length;
    const small = await createTask(db.sql, b, type, 1);
    await waitFor(async () => started.includes(small), 10_000, "B's run to start");
    // Nothing else has started: the loop's claim still waits.
    assert.deepEqual(started.slice(before), [small]);
  } finally {
    // Also when the test fails: the worker's claim must not wait past it (stop() waits for the claim).
    await holder`rollback`.catch(() => {});
    holder.release();
  }
  await waitForTerminal(db.sql, aTask);
  await waitForTerminal(db.sql, cTask);
});

test("a newcomer's claim takes no slot the worker has not got: with runs of minutes, a run past its slots stays queued for another worker", async () => {
  const type = "newcomer4";
  const [b] = await seedUsers("newcomer4-b");
  assert.ok(b);
  const started: number[] = [];
  const blocking: Handler = async (run, { signal }) => {
    started.push(run.id);
    await sleep(120_000, signal);
    return { status: "succeeded", result: { metrics: {} } };
  };
  await startHandler(type, blocking, 2);
  const task = await createTask(db.sql, b, type, 3);
  await waitFor(async () => started.length >= 2, 10_000, "two runs to start");
  // A second worker: the third run is still queued (the first worker holds two, one per slot), so
  // this one takes it. With a run claimed past the slots, the first worker would hold it in its
  // buffer, its lease heartbeated, until a run of minutes ended.
  const second = new Worker({
    sql: db.sql,
    logger,
    types: { [type]: { handler: blocking } },
    concurrency: 2,
    leaseTtlMs: 30_000,
    pollIntervalMs: 100,
    retryBaseMs: 20,
  });
  await second.start();
  try {
    await waitFor(async () => started.length >= 3, 10_000, "the third run to start on the second worker");
    const [held] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from runs where task_id = ${task} and lease_owner = ${second.id}`;
    assert.equal(held?.n, 1);
    assert.deepEqual([...new Set(started)].length, 3);
  } finally {
    await second.stop();
  }
});

test("a newcomer's claim that takes nothing wakes the loop, which claims the run without waiting for a poll", async () => {
  const type = "newcomer5";
  const [a, b] = await seedUsers("newcomer5-a", "newcomer5-b");
  assert.ok(a && b);
  // Rows for both owners, kept by runs not due: A's at pass 0, B's a long way ahead, so the
  // newcomer's claim for B's next task takes nothing (B is not due a turn by its pass).
  for (const owner of [a, b]) await createNotDue(owner, type, 1);
  await db.sql`update queue_owners set pass = 100 where analysis_type = ${type} and owner_id = ${b.userId}`;
  // The premise, checked: a newcomer's claim for a task of B's takes nothing now (B is past its turn),
  // so the task below can start only by the loop's claim.
  const probe = await createTask(db.sql, b, type, 1);
  assert.deepEqual(await claimNewcomer(type, await createdOf(probe)), []);
  // A poll far beyond the test's wait: only a wake-up can start B's runs in time.
  // The worker's first claim, at start, takes the probe's run; B's task comes to an idle worker.
  await startHandler(type, handler(1), 1, db.sql, { pollIntervalMs: 120_000 });
  await waitForTerminal(db.sql, probe, 10_000);
  const task = await createTask(db.sql, b, type, 2);
  await waitForTerminal(db.sql, task, 10_000);
});

test("under the per-user limit a run that ends wakes the workers of the owner's other types", async () => {
  // User U at the limit (1) with a run of type A; its run of type B waits in a worker of B alone,
  // whose poll is a minute away: only a wake-up can start it in time. A run's end woke the workers
  // of its own type only, so B waited for the poll.
  const u = await seedUser(db.sql, "wake-other-types");
  let release = () => {};
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  const common = {
    sql: db.sql,
    logger,
    concurrency: 1,
    leaseTtlMs: 30_000,
    pollIntervalMs: 60_000,
    retryBaseMs: 20,
    userLimit: 1,
  };
  const a = await createTask(db.sql, u, "wake-a", 1);
  const wa = new Worker({
    ...common,
    types: {
      "wake-a": {
        handler: async () => {
          await gate;
          return { status: "succeeded" };
        },
      },
    },
  });
  let claimsOfB = 0;
  const wb = new Worker({
    ...common,
    types: { "wake-b": { handler: async () => ({ status: "succeeded" }) } },
    observer: { ...NO_OBSERVER, claimed: () => void claimsOfB++ },
  });
  try {
    await wa.start();
    await waitFor(async () => {
      const [r] = await db.sql<{ status: string }[]>`select status from runs where task_id = ${a}`;
      return r?.status === "starting" || r?.status === "running" ? true : undefined;
    });
    await wb.start();
    const before = claimsOfB;
    const b = await createTask(db.sql, u, "wake-b", 1);
    // B's worker heard of B's task and claimed nothing: U is at the limit.
    await waitFor(async () => (claimsOfB > before ? true : undefined));
    assert.equal((await taskRow(db.sql, b)).status, "queued");
    release();
    await waitForTerminal(db.sql, a, 15_000);
    await waitForTerminal(db.sql, b, 15_000);
  } finally {
    release();
    await wa.stop();
    await wb.stop();
  }
});

/**
 * U at the per-user limit (1) with a run of type A (`hold` makes it live); its run of type B waits in
 * a worker of B alone, whose poll is a minute away. `free` takes A's run out of its live state some
 * way other than a completion; only a wake-up can then start B's run in time.
 */
async function wakesOtherTypeWhenFreed(
  name: string,
  hold: (a: string) => Promise<void>,
  free: () => Promise<void>,
) {
  const u = await seedUser(db.sql, name);
  const a = await createTask(db.sql, u, `${name}-a`, 1);
  let claimsOfB = 0;
  const wb = new Worker({
    ...limitedOptions,
    types: { [`${name}-b`]: { handler: async () => ({ status: "succeeded" }) } },
    observer: { ...NO_OBSERVER, claimed: () => void claimsOfB++ },
  });
  try {
    await hold(a);
    await wb.start();
    const before = claimsOfB;
    const b = await createTask(db.sql, u, `${name}-b`, 1);
    // B's worker heard of B's task and claimed nothing: U is at the limit.
    await waitFor(async () => (claimsOfB > before ? true : undefined));
    assert.equal((await taskRow(db.sql, b)).status, "queued");
    await free();
    await waitForTerminal(db.sql, b, 15_000);
    const [ra] = await db.sql<{ status: string }[]>`select status from runs where task_id = ${a}`;
    assert.equal(ra?.status, "queued", "A's run was re-queued, not completed");
  } finally {
    await wb.stop();
  }
}

/** Workers under a per-user limit of 1 that poll once a minute. */
const limitedOptions = {
  get sql() {
    return db.sql;
  },
  logger,
  concurrency: 1,
  leaseTtlMs: 30_000,
  pollIntervalMs: 60_000,
  // A re-queued run comes due long after the test: its own claim cannot be what wakes anyone.
  retryBaseMs: 120_000,
  userLimit: 1,
};

test("under the per-user limit a run re-queued for a retry wakes the workers of the owner's other types", async () => {
  // A retry frees the owner's room as a completion does, but sent no wake-up: B waited for its poll.
  let fail = () => {};
  const gate = new Promise<void>((resolve) => {
    fail = resolve;
  });
  const wa = new Worker({
    ...limitedOptions,
    types: {
      "wake-retry-a": {
        handler: async () => {
          await gate;
          return { status: "failed", errorCode: "ANALYSIS_PROCESS_FAILED", transient: true };
        },
      },
    },
  });
  try {
    await wakesOtherTypeWhenFreed(
      "wake-retry",
      async (a) => {
        await wa.start();
        await waitFor(async () => {
          const [r] = await db.sql<{ status: string }[]>`select status from runs where task_id = ${a}`;
          return r?.status === "starting" || r?.status === "running" ? true : undefined;
        });
      },
      async () => fail(),
    );
  } finally {
    fail();
    await wa.stop();
  }
});

test("under the per-user limit a lease the reaper takes back wakes the workers of the owner's other types", async () => {
  // The reaper freed the owner's room and sent no wake-up: B waited for its poll.
  const reaper = new Reaper({
    sql: db.sql,
    logger,
    intervalMs: 60_000,
    leaseTtlMs: 300,
    retryBaseMs: 120_000,
    workerWaitMs: 600_000,
  });
  await wakesOtherTypeWhenFreed(
    "wake-reap",
    async () => {
      // A dead worker's attempt: claimed with a lease nobody extends.
      const got = await runClaim(db.sql, {
        workerId: "wake-reap-dead",
        analysisType: "wake-reap-a",
        limit: 1,
        globalLimit: 0,
        userLimit: 1,
        leaseTtlMs: 300,
      });
      assert.equal(got.length, 1);
    },
    async () => {
      await waitFor(async () => ((await reaper.runOnce()).requeued === 1 ? true : undefined), 10_000);
    },
  );
});
