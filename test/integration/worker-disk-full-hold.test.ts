// A worker whose attempt finds its disk full (ANALYSIS_STORAGE_FULL) claims nothing for a while, the
// while doubling at each such attempt in a row: without it, a worker whose disk stayed full claimed run
// after run and used up each one's attempts within seconds, failing the whole backlog, though other
// workers had room. The handler here throws the ENOSPC a full disk gives (the full-disk paths of the
// process handler itself are in runner-disk-full.test.ts).
import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import { Writable } from "node:stream";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { NO_OBSERVER } from "../../src/queue/observer.ts";
import type { Handler } from "../../src/queue/outcomes.ts";
import { Worker } from "../../src/queue/worker.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, idsCrossPowerOfTen, seedUser, waitFor, waitForTerminal } from "../helpers/queue.ts";

let db: TestDatabase;
let owner: Principal;
before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "dïsk «full»");
  await idsCrossPowerOfTen(db.sql, "runs", 2);
});
after(() => db.drop());

const noSpace = () => Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC" });

/** A logger whose lines the test reads. */
function capture() {
  const lines: { msg: string; holdMs?: number }[] = [];
  const destination = new Writable({
    write(chunk, _enc, done) {
      for (const line of String(chunk).split("\n")) if (line) lines.push(JSON.parse(line));
      done();
    },
  });
  return { lines, logger: createLogger({ level: "warn", destination }) };
}

const worker = (
  type: string,
  handler: Handler,
  o: { hold: number; logger?: ReturnType<typeof createLogger>; prefetch?: number },
) =>
  new Worker({
    sql: db.sql,
    logger: o.logger ?? createLogger({ level: "silent" }),
    types: { [type]: { handler } },
    concurrency: 1,
    ...(o.prefetch === undefined ? {} : { prefetch: o.prefetch }),
    leaseTtlMs: 60_000,
    pollIntervalMs: 50,
    retryBaseMs: 10,
    storageFullHoldMs: o.hold,
  });

test("a worker whose attempt found its disk full claims nothing while another worker runs the task", async () => {
  const type = "disk-full-hold";
  const { lines, logger } = capture();
  let fullAttempts = 0;
  // Not started: its passes are the test's calls of runOnce(), so nothing but the hold can stop a claim.
  const full = worker(
    type,
    async () => {
      fullAttempts++;
      throw noSpace();
    },
    { hold: 60_000, logger },
  );
  const roomy = worker(type, async () => ({ status: "succeeded" }), { hold: 60_000 });
  const taskId = await createTask(db.sql, owner, type, 4, { maxAttempts: 2 });
  try {
    assert.equal(await full.runOnce(), 1);
    // Its retry recorded: back in the queue with an attempt used, named for the disk.
    await waitFor(
      async () =>
        (
          await db.sql`select 1 from runs where task_id = ${taskId} and status = 'queued' and attempt = 1
                         and error_code = 'ANALYSIS_STORAGE_FULL'`
        ).length === 1,
      10_000,
      "the attempt's retry to be recorded",
    );
    for (let i = 0; i < 3; i++) assert.equal(await full.runOnce(), 0, "a claim while the disk was full");
    assert.equal(fullAttempts, 1);
    assert.deepEqual(
      lines.filter((l) => l.msg.includes("disk full")).map((l) => l.holdMs),
      [60_000],
    );
    await roomy.start();
    const t = await waitForTerminal(db.sql, taskId, 15_000);
    assert.equal(t.status, "succeeded", "no run used up its attempts on the full disk");
    assert.equal(fullAttempts, 1);
  } finally {
    await Promise.all([full.stop(), roomy.stop()]);
  }
});

test("the hold ends by itself, doubles while attempts keep finding the disk full, and a success ends the doubling", async () => {
  const type = "disk-full-doubling";
  const { lines, logger } = capture();
  const hold = 150;
  // Attempts 1–3 find the disk full, 4 and 5 succeed, 6 finds it full again, the rest succeed.
  const fullAt = new Set([1, 2, 3, 6]);
  const attempts: { start: number; end: number }[] = [];
  const w = worker(
    type,
    async () => {
      const start = performance.now();
      const n = attempts.push({ start, end: start });
      if (fullAt.has(n)) {
        (attempts[n - 1] as { end: number }).end = performance.now();
        throw noSpace();
      }
      return { status: "succeeded" };
    },
    { hold, logger },
  );
  const taskId = await createTask(db.sql, owner, type, 8, { maxAttempts: 5 });
  try {
    await w.start();
    const t = await waitForTerminal(db.sql, taskId, 20_000);
    assert.equal(t.status, "succeeded");
    assert.equal(attempts.length, 8 + fullAt.size);
    assert.deepEqual(
      lines.filter((l) => l.msg.includes("disk full")).map((l) => l.holdMs),
      [hold, 2 * hold, 4 * hold, hold],
    );
    // Each attempt after a full disk began no sooner than its hold had passed (timers never fire early;
    // a millisecond of slack for the clocks' rounding).
    for (const [n, wait] of [
      [1, hold],
      [2, 2 * hold],
      [3, 4 * hold],
      [6, hold],
    ] as const) {
      const gap = (attempts[n] as { start: number }).start - (attempts[n - 1] as { end: number }).end;
      assert.ok(
        gap >= wait - 1,
        `attempt ${n + 1} began ${gap.toFixed(1)} ms after attempt ${n} found the disk full`,
      );
    }
  } finally {
    await w.stop();
  }
});

test("a worker that found its disk full gives its runs claimed ahead back, and takes no newcomer's run while it holds", async () => {
  const type = "disk-full-buffer";
  let fullAttempts = 0;
  const full = worker(
    type,
    async () => {
      fullAttempts++;
      throw noSpace();
    },
    { hold: 60_000, prefetch: 4 },
  );
  const taskId = await createTask(db.sql, owner, type, 5, { maxAttempts: 3 });
  const roomy = worker(type, async () => ({ status: "succeeded" }), { hold: 60_000 });
  try {
    await full.start();
    // One run started and found the disk full; the four claimed ahead go back, their attempt refunded.
    await waitFor(
      async () =>
        (await db.sql`select 1 from runs where task_id = ${taskId} and status = 'queued' and attempt = 0`)
          .length === 4,
      10_000,
      "the runs claimed ahead given back",
    );
    assert.equal(fullAttempts, 1, "a run claimed ahead was started on the full disk");
    // Newcomers: other owners' tasks, whose first run a worker with a free slot claims at once on their
    // notification (within milliseconds). That it does not must be seen not to happen: the test gives
    // it half a second (before the review's fixes, a run started here in every run of the test).
    const newcomers: string[] = [];
    for (let i = 0; i < 5; i++) {
      const other = await seedUser(db.sql, `newcomer ${i} «disk»`);
      newcomers.push(await createTask(db.sql, other, type, 1, { maxAttempts: 3 }));
    }
    await new Promise((resolve) => setTimeout(resolve, 500));
    assert.equal(fullAttempts, 1, "the held worker ran a newcomer's run on its full disk");
    const [untouched] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from runs where task_id = any(${newcomers}::bigint[]) and attempt = 0`;
    assert.equal(untouched?.n, 5);
    // The worker with room takes them all.
    await roomy.start();
    for (const id of [taskId, ...newcomers])
      assert.equal((await waitForTerminal(db.sql, id, 15_000)).status, "succeeded");
    assert.equal(fullAttempts, 1);
  } finally {
    await Promise.all([full.stop(), roomy.stop()]);
  }
});

test("a hold that begins while a pass's claim is in flight ends the pass: the next type is not claimed only to be given back", async () => {
  // a's run, started by a first pass, finds the disk full while the second pass's claim of b waits for
  // b's claim lock (b has a global limit, so its claim takes one); c comes after b in that pass (the
  // types sorted, each pass starting one further on).
  const [a, b, c] = ["hold-pass-a", "hold-pass-b", "hold-pass-c"];
  let letFail: () => void = () => {};
  const failing = new Promise<void>((resolve) => (letFail = resolve));
  const claims: string[] = [];
  const { lines, logger } = capture();
  const w = new Worker({
    sql: db.sql,
    logger,
    types: {
      [a]: {
        handler: async () => {
          await failing;
          throw noSpace();
        },
      },
      [b]: { handler: async () => ({ status: "succeeded" }), globalLimit: 5 },
      [c]: { handler: async () => ({ status: "succeeded" }) },
    },
    // Slots enough for every queued run: only the hold can keep c's from being claimed.
    concurrency: 10,
    leaseTtlMs: 60_000,
    pollIntervalMs: 50,
    retryBaseMs: 10,
    storageFullHoldMs: 60_000,
    // Claims that took runs (a pass also claims the types with nothing queued, in vain).
    observer: { ...NO_OBSERVER, claimed: (type, _s, waited) => waited.length > 0 && claims.push(type) },
  });
  let letGo: () => void = () => {};
  const release = new Promise<void>((resolve) => (letGo = resolve));
  let holder: Promise<void> | undefined;
  try {
    await createTask(db.sql, owner, a, 1, { maxAttempts: 3 });
    assert.equal(await w.runOnce(), 1);
    assert.deepEqual(claims, [a]);
    const taskB = await createTask(db.sql, owner, b, 2, { maxAttempts: 3 });
    const taskC = await createTask(db.sql, owner, c, 2, { maxAttempts: 3 });
    let locked: () => void = () => {};
    const isLocked = new Promise<void>((resolve) => (locked = resolve));
    // Another worker's claim of b holding b's claim lock (claim.ts: CLAIM_LOCK_NAMESPACE "clai").
    holder = db.sql.begin(async (tx) => {
      await tx`select pg_advisory_xact_lock(${0x636c6169}, hashtext(${b}))`;
      locked();
      await release;
    });
    await isLocked;
    const pass = w.runOnce();
    await waitFor(
      async () =>
        (await db.sql`select 1 from pg_locks where locktype = 'advisory' and not granted`).length > 0,
      10_000,
      "b's claim to wait for its claim lock",
    );
    letFail();
    await waitFor(async () => lines.some((l) => l.msg.includes("disk full")), 10_000, "the hold");
    letGo();
    await holder;
    await pass;
    assert.deepEqual(claims, [a, b], "a type claimed after the hold began");
    // b's runs, claimed as the hold began, go back; c's were never claimed.
    await waitFor(
      async () =>
        (
          await db.sql`select 1 from runs where task_id = any(${[taskB, taskC]}::bigint[])
                         and status = 'queued' and attempt = 0`
        ).length === 4,
      10_000,
      "b's runs given back",
    );
  } finally {
    letFail();
    letGo();
    await holder?.catch(() => {});
    await w.stop();
  }
});
