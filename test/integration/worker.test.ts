// One worker in-process with handler functions: outcomes, last child wins, retries, fencing.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { NO_OBSERVER, type QueueObserver } from "../../src/queue/observer.ts";
import { Reaper } from "../../src/queue/reaper.ts";
import { type ClaimedRun, runCancelQueued, runClaim, runComplete, runProgress } from "../../src/queue/sql.ts";
import {
  AUTO_PREFETCH_MIN_MS,
  AUTO_PREFETCH_PER_SLOT,
  AUTO_PREFETCH_PER_SLOT_INSTANT,
  autoPrefetchRuns,
  type Handler,
  STALE_BUFFER_MIN_MS,
  Worker,
  type WorkerOptions,
} from "../../src/queue/worker.ts";
import { taskCancel } from "../../src/tasks/cancel.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import {
  createTask,
  progressFlushesWaiting,
  runCounts,
  seedUser,
  tableEvents,
  taskRow,
  waitFor,
  waitForTerminal,
} from "../helpers/queue.ts";

let db: TestDatabase;
let owner: Principal;
const logger = createLogger({ level: "silent" });

before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "worker-tests");
});
after(() => db.drop());

function worker(types: Record<string, Handler>, extra: Partial<WorkerOptions> = {}): Worker {
  return new Worker({
    sql: db.sql,
    logger,
    types: Object.fromEntries(Object.entries(types).map(([t, handler]) => [t, { handler }])),
    concurrency: 4,
    leaseTtlMs: 30_000,
    pollIntervalMs: 200,
    retryBaseMs: 50,
    ...extra,
  });
}

const succeed: Handler = async () => ({ status: "succeeded", result: { metrics: { rows: 1 } } });

/** Claims one run of `type` as another worker would, with a lease that has expired by the next reap. */
async function claimExpiring(type: string, workerId: string) {
  const [run] = await runClaim(db.sql, {
    workerId,
    analysisType: type,
    limit: 1,
    globalLimit: 0,
    leaseTtlMs: 1,
  });
  assert.ok(run);
  return run;
}

/** A reaper that finds every 1 ms lease expired and makes re-queued runs due 1 ms later. */
const quickReaper = () =>
  new Reaper({ sql: db.sql, logger, intervalMs: 1000, leaseTtlMs: 1, retryBaseMs: 1, workerWaitMs: 60_000 });

describe("last child wins", () => {
  test("success path: every run succeeds → task succeeded, counters exact", async () => {
    const taskId = await createTask(db.sql, owner, "t-ok", 25);
    const w = worker({ "t-ok": succeed });
    await w.start();
    const row = await waitForTerminal(db.sql, taskId);
    await w.stop();
    assert.deepEqual(row, {
      status: "succeeded",
      total: 25,
      succeeded: 25,
      failed: 0,
      timedOut: 0,
      cancelled: 0,
    });
    assert.deepEqual(await runCounts(db.sql, taskId), { succeeded: 25 });
  });

  test("failure path: every run fails permanently → task failed, no retry", async () => {
    const taskId = await createTask(db.sql, owner, "t-fail", 10);
    let calls = 0;
    const w = worker({
      "t-fail": async () => {
        calls++;
        return { status: "failed", errorCode: "ANALYSIS_DATA_INVALID", errorMessage: "bad data" };
      },
    });
    await w.start();
    const row = await waitForTerminal(db.sql, taskId);
    await w.stop();
    assert.equal(row.status, "failed");
    assert.equal(row.failed, 10);
    assert.equal(calls, 10, "permanent failures are not retried");
    const [run] = await db.sql`select attempt, error_code from runs where task_id = ${taskId} limit 1`;
    assert.deepEqual({ ...run }, { attempt: 1, error_code: "ANALYSIS_DATA_INVALID" });
  });

  test("a mix → partially_succeeded; all timed out → timed_out", async () => {
    const mixed = await createTask(db.sql, owner, "t-mix", 9);
    const timed = await createTask(db.sql, owner, "t-slow", 3);
    const w = worker({
      "t-mix": async (run) =>
        run.inputFileId % 3 === 0
          ? { status: "failed", errorCode: "ANALYSIS_INPUT_INVALID" }
          : { status: "succeeded", result: {} },
      "t-slow": async () => ({ status: "timed_out" }),
    });
    await w.start();
    const m = await waitForTerminal(db.sql, mixed);
    const t = await waitForTerminal(db.sql, timed);
    await w.stop();
    assert.equal(m.status, "partially_succeeded");
    assert.equal(m.succeeded + m.failed, 9);
    assert.ok(m.succeeded > 0 && m.failed > 0);
    assert.deepEqual(t, {
      status: "timed_out",
      total: 3,
      succeeded: 0,
      failed: 0,
      timedOut: 3,
      cancelled: 0,
    });
  });

  test("the per-type timeout aborts the handler and ends the run timed_out", async () => {
    const taskId = await createTask(db.sql, owner, "t-hang", 1);
    const w = new Worker({
      sql: db.sql,
      logger,
      types: {
        "t-hang": {
          timeoutMs: 150,
          handler: (_run, { signal }) =>
            new Promise((resolve) =>
              signal.addEventListener("abort", () => resolve({ status: "cancelled" })),
            ),
        },
      },
      concurrency: 1,
      leaseTtlMs: 30_000,
      pollIntervalMs: 200,
      retryBaseMs: 50,
    });
    await w.start();
    const row = await waitForTerminal(db.sql, taskId);
    await w.stop();
    assert.equal(row.status, "timed_out");
    const [run] = await db.sql`select error_code from runs where task_id = ${taskId}`;
    assert.equal(run?.error_code, "ANALYSIS_PROCESS_TIMEOUT");
  });
});

describe("retries", () => {
  test("a transient failure is retried only after run_after, with growing backoff; then succeeds", async () => {
    const taskId = await createTask(db.sql, owner, "t-flaky", 1, { maxAttempts: 3 });
    const starts: number[] = [];
    const w = worker(
      {
        "t-flaky": async (run) => {
          starts.push(Date.now());
          return run.attempt < 3
            ? { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true }
            : { status: "succeeded", result: {} };
        },
      },
      { retryBaseMs: 200 },
    );
    await w.start();
    const row = await waitForTerminal(db.sql, taskId);
    await w.stop();
    assert.equal(row.status, "succeeded");
    assert.equal(starts.length, 3);
    const [first, second, third] = starts as [number, number, number];
    // Equal jitter: attempt 1 waits 100–200 ms, attempt 2 waits 200–400 ms.
    assert.ok(second - first >= 100, `first retry after ${second - first} ms`);
    assert.ok(third - second >= 200, `second retry after ${third - second} ms`);
    const events = await db.sql<{ type: string; data: Record<string, unknown> }[]>`
      select type, data from task_events where task_id = ${taskId} and type not in ('run.running', 'run.progress') order by id`;
    assert.deepEqual(
      events.map((e) => e.type),
      ["task.queued", "run.retry", "run.retry", "run.succeeded", "task.succeeded"],
    );
    // Failed attempts, counted: no `refunded` (only a retry whose attempt was not counted has it).
    assert.deepEqual(
      events
        .filter((e) => e.type === "run.retry")
        .map((e) => [e.data.attempt, e.data.errorCode, e.data.refunded]),
      [
        [1, "ANALYSIS_DEPENDENCY_FAILED", undefined],
        [2, "ANALYSIS_DEPENDENCY_FAILED", undefined],
      ],
    );
  });

  test("attempts exhausted → failed with the last error", async () => {
    const taskId = await createTask(db.sql, owner, "t-down", 2, { maxAttempts: 2 });
    let calls = 0;
    const w = worker({
      "t-down": async () => {
        calls++;
        return { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true };
      },
    });
    await w.start();
    const row = await waitForTerminal(db.sql, taskId);
    await w.stop();
    assert.equal(row.status, "failed");
    assert.equal(calls, 4);
    const runs = await db.sql`select attempt, error_code from runs where task_id = ${taskId}`;
    for (const r of runs)
      assert.deepEqual({ ...r }, { attempt: 2, error_code: "ANALYSIS_DEPENDENCY_FAILED" });
  });

  test("a handler that throws is retried, then fails with ANALYSIS_PROCESS_FAILED", async () => {
    const taskId = await createTask(db.sql, owner, "t-throw", 1, { maxAttempts: 2 });
    const w = worker({
      "t-throw": async () => {
        throw new Error("boom");
      },
    });
    await w.start();
    const row = await waitForTerminal(db.sql, taskId);
    await w.stop();
    assert.equal(row.status, "failed");
    const [run] = await db.sql`select attempt, error_code, error_message from runs where task_id = ${taskId}`;
    assert.deepEqual(
      { ...run },
      {
        attempt: 2,
        error_code: "ANALYSIS_PROCESS_FAILED",
        error_message: "the analysis failed unexpectedly",
      },
    );
  });
});

describe("fencing", () => {
  test("an attempt whose lease was taken over completes late: nothing counted, the newer outcome stands", async () => {
    const taskId = await createTask(db.sql, owner, "t-fence", 1, { maxAttempts: 3 });
    const old = await claimExpiring("t-fence", "old");
    await new Promise((r) => setTimeout(r, 5));
    assert.equal((await quickReaper().runOnce()).requeued, 1);
    await db.sql`update runs set run_after = now() where id = ${old.id}`;
    const [fresh] = await runClaim(db.sql, {
      workerId: "new",
      analysisType: "t-fence",
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
    assert.equal(fresh?.id, old.id);
    assert.equal(fresh?.attempt, 2);

    const late = await runComplete(db.sql, [
      { id: old.id, token: old.leaseToken, status: "failed", errorCode: "X" },
    ]);
    assert.deepEqual(late, { completed: [], finishedTasks: [] });
    assert.equal((await taskRow(db.sql, taskId)).failed, 0);

    const ok = await runComplete(db.sql, [
      { id: old.id, token: fresh?.leaseToken as string, status: "succeeded" },
    ]);
    assert.deepEqual(ok.completed, [old.id]);
    const row = await taskRow(db.sql, taskId);
    assert.deepEqual(row, {
      status: "succeeded",
      total: 1,
      succeeded: 1,
      failed: 0,
      timedOut: 0,
      cancelled: 0,
    });
    // Completing the same attempt twice counts it once.
    const again = await runComplete(db.sql, [
      { id: old.id, token: fresh?.leaseToken as string, status: "succeeded" },
    ]);
    assert.deepEqual(again.completed, []);
    assert.equal((await taskRow(db.sql, taskId)).succeeded, 1);
  });

  test("a worker whose lease is lost aborts its attempt and records nothing", async () => {
    const taskId = await createTask(db.sql, owner, "t-lost", 1, { maxAttempts: 3 });
    let aborted: unknown;
    const discarded: number[] = [];
    const w = worker(
      {
        "t-lost": (_run, { signal }) =>
          new Promise((resolve) =>
            signal.addEventListener("abort", () => {
              aborted = signal.reason;
              resolve({ status: "succeeded", result: {} });
            }),
          ),
      },
      { leaseTtlMs: 300, onDiscard: async (run) => void discarded.push(run.id) },
    );
    await w.start();
    await waitFor(async () => (await runCounts(db.sql, taskId)).running, 10_000, "the run to be running");
    // Someone else takes the run over (as the reaper would after an expiry).
    await db.sql`update runs set lease_token = gen_random_uuid() where task_id = ${taskId}`;
    await waitFor(async () => aborted, 10_000, "the attempt to be aborted");
    await w.stop();
    assert.equal(aborted, "lost");
    assert.equal(discarded.length, 1);
    const row = await taskRow(db.sql, taskId);
    assert.equal(row.succeeded + row.failed, 0);
  });
});

describe("logs", () => {
  test("every run transition is logged once with taskId, runId, attempt and workerId; no secrets", async () => {
    const lines: Record<string, unknown>[] = [];
    const { Writable } = await import("node:stream");
    const destination = new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const l of chunk.toString().split("\n")) if (l) lines.push(JSON.parse(l));
        done();
      },
    });
    const captured = createLogger({ level: "info", destination });
    const taskId = await createTask(db.sql, owner, "t-logs", 3, { maxAttempts: 2 });
    const w = new Worker({
      sql: db.sql,
      logger: captured,
      types: {
        "t-logs": {
          handler: async (run) => {
            if (run.inputFileId % 3 === 0 && run.attempt === 1) {
              return { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true };
            }
            return { status: "succeeded" };
          },
        },
      },
      concurrency: 2,
      leaseTtlMs: 30_000,
      pollIntervalMs: 100,
      retryBaseMs: 10,
    });
    await w.start();
    await waitForTerminal(db.sql, taskId);
    await w.stop();
    const runs = await db.sql`select id::float8, attempt from runs where task_id = ${taskId}`;
    for (const r of runs) {
      const mine = lines.filter((l) => l.runId === r.id);
      const count = (msg: string) => mine.filter((l) => l.msg === msg).length;
      assert.equal(count("run started"), r.attempt, `run ${r.id}`);
      assert.equal(count("run finished"), 1, `run ${r.id}`);
      assert.equal(count("run re-queued"), r.attempt - 1, `run ${r.id}`);
      for (const l of mine) {
        assert.equal(l.taskId, Number(taskId));
        assert.equal(typeof l.attempt, "number");
        assert.equal(l.workerId, w.id);
      }
    }
    const password = decodeURIComponent(new URL(db.url).password);
    const all = JSON.stringify(lines);
    assert.ok(password.length > 0 && !all.includes(password), "no database password in any log line");
    assert.ok(!all.includes(db.url));
  });
});

/**
 * A handler that reports 40% and then waits: `running` resolves once it has started, report() sends
 * another progress report, finish() ends it.
 */
function gatedHandler() {
  let started: () => void = () => {};
  const running = new Promise<void>((r) => {
    started = r;
  });
  let finish: () => void = () => {};
  const gate = new Promise<void>((r) => {
    finish = r;
  });
  let report: (percent: number) => void = () => {};
  const handler: Handler = async (_run, { reportProgress }) => {
    report = (percent) => reportProgress(percent, `at ${percent}`);
    reportProgress(40, "reading");
    started();
    await gate;
    return { status: "succeeded" };
  };
  return { handler, running, finish, report: (percent: number) => report(percent) };
}

test("progress flushes never overlap: one waiting for its run's row is not overtaken by the next", async () => {
  const taskId = await createTask(db.sql, owner, "t-overlap", 1);
  const { handler, running, finish, report } = gatedHandler();
  // The attempt is old enough to flush after 1 s: time to hold its row first (below).
  const w = worker({ "t-overlap": handler }, { progressFlushMs: 1_000 });
  // Another session holds the run's row (as a cancel does while it works): every flush waits for it.
  let held: () => void = () => {};
  const rowHeld = new Promise<void>((r) => {
    held = r;
  });
  let release: () => void = () => {};
  const released = new Promise<void>((r) => {
    release = r;
  });
  await w.start();
  await running;
  const holder = db.sql.begin(async (tx) => {
    await tx`select id from runs where task_id = ${taskId} for update`;
    held();
    await released;
  });
  try {
    await rowHeld;
    const [state] = await db.sql<{ status: string }[]>`select status from runs where task_id = ${taskId}`;
    assert.equal(state?.status, "starting", "the row was held before any flush");
    // The worker's own tick (the attempt is 1 s old) sends the first flush; it waits for the row.
    await waitFor(
      async () => ((await progressFlushesWaiting(db.sql)) >= 1 ? true : undefined),
      10_000,
      "a flush to wait",
    );
    const first = w.progressOnce();
    report(20);
    const second = w.progressOnce();
    // Overlapping, the second would take its snapshot now (the run still `starting`) and wait too.
    await waitFor(
      async () => (second === first || (await progressFlushesWaiting(db.sql)) >= 2 ? true : undefined),
      10_000,
      "the second flush to share the first or to wait as well",
    );
    release();
    await holder;
    await Promise.all([first, second]);
    // The report that arrived meanwhile goes in a later flush.
    await waitFor(
      async () => {
        const [r] = await db.sql<{ progress: number }[]>`select progress from runs where task_id = ${taskId}`;
        return r?.progress === 20 ? true : undefined;
      },
      10_000,
      "the later report to be written",
    );
    const types = (await tableEvents(db.sql, taskId)).map(([, type]) => type);
    assert.equal(types.filter((t) => t === "run.running").length, 1, types.join(", "));
  } finally {
    release();
    await holder.catch(() => {});
    finish();
    await waitForTerminal(db.sql, taskId);
    await w.stop();
  }
});

test("an attempt younger than the progress interval is not written; an older one is marked running", async () => {
  const taskId = await createTask(db.sql, owner, "t-young", 1);
  const { handler, running, finish } = gatedHandler();
  // An interval far longer than the test: only progressOnce() writes, and the attempt stays young.
  const young = worker({ "t-young": handler }, { progressFlushMs: 3_600_000 });
  await young.start();
  await running;
  await young.progressOnce();
  const state = async () => {
    const [r] = await db.sql<{ status: string; progress: number | null }[]>`
      select status, progress from runs where task_id = ${taskId}`;
    const events = await db.sql<{ type: string }[]>`
      select type from task_events where task_id = ${taskId} order by id`;
    return { ...r, events: events.map((e) => e.type) };
  };
  assert.deepEqual(await state(), { status: "starting", progress: 0, events: ["task.queued"] });
  finish();
  await waitForTerminal(db.sql, taskId);
  await young.stop();
  // The short attempt went from starting to its ending, with no progress write in between.
  const ended = await state();
  assert.deepEqual(ended.events, ["task.queued", "run.succeeded", "task.succeeded"]);

  // With a 1 ms interval the same attempt is old enough at once: running, with its progress.
  const older = await createTask(db.sql, owner, "t-older", 1);
  const oldOne = gatedHandler();
  const w = worker({ "t-older": oldOne.handler }, { progressFlushMs: 1 });
  await w.start();
  await oldOne.running;
  // The worker's own flushes (every 1 ms) write it while the attempt is still going.
  await waitFor(
    async () => {
      const [r] = await db.sql<{ status: string; progress: number | null }[]>`
        select status, progress from runs where task_id = ${older}`;
      return r?.status === "running" && r.progress === 40;
    },
    10_000,
    "the older attempt to be marked running with its progress",
  );
  oldOne.finish();
  await waitForTerminal(db.sql, older);
  await w.stop();
});

test("a task turns running when a run is recorded running or ends after starting, not at the claim", async () => {
  const status = async (taskId: string) => {
    const [t] = await db.sql<{ status: string; started: boolean }[]>`
      select status, started_at is not null as started from tasks where id = ${taskId}`;
    return { ...t };
  };
  const claim = (type: string) =>
    runClaim(db.sql, {
      workerId: "w-start",
      analysisType: type,
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
  // Claimed: the task row is not touched yet.
  const a = await createTask(db.sql, owner, "t-start-a", 2);
  const [ra] = await claim("t-start-a");
  assert.ok(ra);
  assert.deepEqual(await status(a), { status: "queued", started: false });
  // The run is recorded running (the worker's first progress write): so is its task.
  const moved = await runProgress(db.sql, [{ id: ra.id, token: ra.leaseToken, progress: null }]);
  assert.deepEqual(
    moved.map((r) => ({ ...r })),
    [{ id: ra.id, status: "running", notified: "1" }],
  );
  assert.deepEqual(await status(a), { status: "running", started: true });
  // A run that ends before any progress write starts its task too, when the task goes on.
  const b = await createTask(db.sql, owner, "t-start-b", 2);
  const [rb] = await claim("t-start-b");
  assert.ok(rb);
  await runComplete(db.sql, [{ id: rb.id, token: rb.leaseToken, status: "succeeded" }]);
  assert.deepEqual(await status(b), { status: "running", started: true });
  // Runs that end without ever starting (cancelled while queued) leave a task unstarted.
  const c = await createTask(db.sql, owner, "t-start-c", 3);
  assert.ok((await claim("t-start-c"))[0]);
  // Its caller recorded how many it ends: a different number throws and rolls the caller back.
  await assert.rejects(
    db.sql.begin((tx) => runCancelQueued(tx as unknown as typeof db.sql, String(c), 1)),
    /1 queued runs recorded, 2 ended/,
  );
  assert.equal(await runCancelQueued(db.sql, String(c), 2), 2);
  assert.deepEqual(await status(c), { status: "queued", started: false });
});

test("a claim of a type without a global limit commits asynchronously, in its own transaction only", async () => {
  await createTask(db.sql, owner, "t-async", 1);
  const [before] = await db.sql<{ synchronous_commit: string }[]>`show synchronous_commit`;
  const setting = await db.sql.begin(async (tx) => {
    await tx`set local synchronous_commit = on`; // the test server runs with it off
    const runs = await runClaim(tx as unknown as typeof db.sql, {
      workerId: "w-async",
      analysisType: "t-async",
      limit: 1,
      globalLimit: 0,
      leaseTtlMs: 30_000,
    });
    assert.equal(runs.length, 1);
    const [row] = await tx<{ synchronous_commit: string }[]>`show synchronous_commit`;
    return row?.synchronous_commit;
  });
  assert.equal(setting, "off", "the claim's transaction does not wait for its WAL flush");
  const [after] = await db.sql<{ synchronous_commit: string }[]>`show synchronous_commit`;
  assert.equal(after?.synchronous_commit, before?.synchronous_commit, "the session's setting is untouched");
});

test("releaseSlot: the next run starts while a finished process's outputs are handled; processes never exceed concurrency", async () => {
  const taskId = await createTask(db.sql, owner, "t-release", 4);
  let processes = 0;
  let maxProcesses = 0;
  let maxActive = 0;
  let active = 0;
  let started = 0;
  const handler: Handler = async (_run, { releaseSlot }) => {
    const mine = ++started;
    active++;
    maxActive = Math.max(maxActive, active);
    processes++;
    maxProcesses = Math.max(maxProcesses, processes);
    await new Promise((r) => setTimeout(r, 20)); // "the process"
    processes--;
    releaseSlot();
    // "Checking and publishing outputs", until the next run has started in the released slot (not a
    // fixed time: a loaded machine may take longer than any to claim it). Without the release the
    // next never starts meanwhile, and the wait ends at its limit.
    const limit = Date.now() + 10_000;
    while (mine < 4 && started === mine && Date.now() < limit) await new Promise((r) => setTimeout(r, 5));
    active--;
    return { status: "succeeded" };
  };
  const w = worker({ "t-release": handler }, { concurrency: 1 });
  await w.start();
  const row = await waitForTerminal(db.sql, taskId);
  await w.stop();
  assert.equal(row.succeeded, 4);
  assert.equal(maxProcesses, 1, "one process at a time (concurrency 1)");
  assert.ok(maxActive >= 2, "a released slot was reused before the earlier attempt finished");
});

test("finishing: the next run is claimed while the process exits, and starts only when the slot is released", async () => {
  const taskId = await createTask(db.sql, owner, "t-finishing", 3);
  const events: { runId: number; what: "start" | "release"; at: number }[] = [];
  // Per run: whether the next run was claimed (leased, `starting`) before this one released its slot.
  const claimedAhead = new Map<number, boolean>();
  const handler: Handler = async (run, { finishing, releaseSlot }) => {
    events.push({ runId: run.id, what: "start", at: Date.now() });
    await new Promise((r) => setTimeout(r, 20)); // the process works
    finishing(); // its result arrived
    // The process exits: until the next run has been claimed ahead (not a fixed time, which a loaded
    // machine may need more than to claim it), unless none is left.
    await waitFor(async () => {
      const [n] = await db.sql<{ queued: number; ahead: number }[]>`
        select count(*) filter (where status = 'queued')::int as queued,
               count(*) filter (where status = 'starting' and id <> ${run.id})::int as ahead
        from runs where task_id = ${run.taskId}`;
      claimedAhead.set(run.id, (n?.ahead ?? 0) > 0);
      return n?.queued === 0 || (n?.ahead ?? 0) > 0;
    }, 10_000).catch(() => {}); // claimed-ahead or not, the assertions below decide
    events.push({ runId: run.id, what: "release", at: Date.now() });
    releaseSlot();
    return { status: "succeeded" };
  };
  const w = worker({ "t-finishing": handler }, { concurrency: 1 });
  await w.start();
  await waitForTerminal(db.sql, taskId);
  await w.stop();
  const claims = await db.sql<{ id: number }[]>`
    select r.id::float8 as id from runs r where r.task_id = ${taskId} order by r.id`;
  assert.equal(claims.length, 3);
  for (let i = 1; i < claims.length; i++) {
    const previous = claims[i - 1] as { id: number };
    const current = claims[i] as { id: number };
    const released = events.find((e) => e.runId === previous.id && e.what === "release")?.at as number;
    const started = events.find((e) => e.runId === current.id && e.what === "start")?.at as number;
    assert.equal(claimedAhead.get(previous.id), true, "claimed while the previous process was exiting");
    assert.ok(started >= released, "started only after the previous slot was released");
  }
});

test("a run claimed ahead waits for its slot with a live lease, is cancelled with its task, and goes back unspent on shutdown", async () => {
  const blocker = await createTask(db.sql, owner, "t-ahead", 1);
  const started: string[] = [];
  const handler: Handler = async (run, { finishing, signal }) => {
    started.push(String(run.taskId));
    finishing(); // "the result arrived", but the process never exits until shutdown
    await new Promise((resolve) => signal.addEventListener("abort", resolve));
    // Killed by the abort, as the process handler reports it (a success would stand, see decide()).
    return { status: "cancelled" };
  };
  const w = worker({ "t-ahead": handler }, { concurrency: 1 });
  await w.start();
  await waitFor(async () => started.length === 1);
  const queuedRun = async (taskId: string) => {
    const [r] = await db.sql<
      { id: number; status: string; attempt: number; owner: string | null; expires: Date }[]
    >`
      select id::float8, status, attempt, lease_owner as owner, lease_expires_at as expires from runs where task_id = ${taskId}`;
    return r as { id: number; status: string; attempt: number; owner: string | null; expires: Date };
  };

  // Claimed ahead: leased to this worker, not started.
  const ahead = await createTask(db.sql, owner, "t-ahead", 1);
  await waitFor(async () => (await queuedRun(ahead)).status === "starting");
  const before = await queuedRun(ahead);
  assert.equal(before.owner, w.id);
  assert.deepEqual(started, [blocker], "it waits for the slot");
  await new Promise((r) => setTimeout(r, 20));
  await w.heartbeat();
  assert.ok((await queuedRun(ahead)).expires > before.expires, "its lease is heartbeated");

  // Cancelled with its task while it waits.
  const cancelled = await taskCancel(db.sql, owner, ahead);
  assert.equal(cancelled.kind, "cancelling");
  const row = await waitForTerminal(db.sql, ahead);
  assert.equal(row.status, "cancelled");
  assert.deepEqual(started, [blocker], "a cancelled waiting run never starts");

  // Another one claimed ahead, then shutdown: both go back to the queue without spending an attempt.
  const last = await createTask(db.sql, owner, "t-ahead", 1);
  await waitFor(async () => (await queuedRun(last)).status === "starting");
  await w.stop(0);
  for (const taskId of [blocker, last]) {
    const r = await queuedRun(taskId);
    assert.deepEqual({ status: r.status, attempt: r.attempt }, { status: "queued", attempt: 0 });
    // Their events say the attempt was not counted.
    const retries = await db.sql<{ data: Record<string, unknown> }[]>`
      select data from task_events where task_id = ${taskId} and type = 'run.retry'`;
    assert.deepEqual(
      retries.map((e) => [e.data.attempt, e.data.errorCode, e.data.refunded]),
      [[0, null, true]],
    );
  }
});

test("the runs a stopping worker gives back wake the other workers of their type at once", async () => {
  // Two workers whose poll is a minute away. The first holds a run and one claimed ahead; when it
  // stops, both go back to the queue due at once, and only a wake-up can start them on the second in
  // time: the retry statement that gives them back sent none.
  const type = "t-handback";
  const handler: Handler = async (_run, { finishing, signal }) => {
    finishing();
    await new Promise((resolve) => signal.addEventListener("abort", resolve));
    return { status: "cancelled" };
  };
  const first = worker({ [type]: handler }, { concurrency: 1, pollIntervalMs: 60_000 });
  await first.start();
  const held = await createTask(db.sql, owner, type, 1);
  await waitFor(async () => (await taskRow(db.sql, held)).status === "running");
  const ahead = await createTask(db.sql, owner, type, 1);
  const leasedTo = async (taskId: string) => {
    const [r] = await db.sql<
      { owner: string | null }[]
    >`select lease_owner as owner from runs where task_id = ${taskId}`;
    return r?.owner;
  };
  await waitFor(async () => (await leasedTo(ahead)) === first.id);
  let claimsOfSecond = 0;
  const second = worker(
    { [type]: succeed },
    {
      concurrency: 2,
      pollIntervalMs: 60_000,
      observer: { ...NO_OBSERVER, claimed: () => void claimsOfSecond++ },
    },
  );
  try {
    await second.start();
    // Its first claim, at start, found both runs leased to the first worker.
    await waitFor(async () => (claimsOfSecond > 0 ? true : undefined));
    assert.equal((await taskRow(db.sql, held)).status, "running");
    await first.stop(0);
    for (const taskId of [held, ahead]) {
      const row = await waitForTerminal(db.sql, taskId, 15_000);
      assert.equal(row.status, "succeeded");
      assert.equal(await leasedTo(taskId), null);
    }
  } finally {
    await first.stop(0);
    await second.stop();
  }
});

describe("a type whose queue emptied (drained)", () => {
  /** No claiming ahead and outcomes recorded at once: each claim is for the slots that are free. */
  const slotBySlot = (concurrency: number, pollIntervalMs: number, observer: QueueObserver) => ({
    concurrency,
    pollIntervalMs,
    prefetchWindowMs: 0,
    completionDelayMs: 0,
    observer,
  });

  /** Each claim's type and the runs it took, empty ones included. */
  function claimLog(): { claims: { type: string; runs: number }[]; observer: QueueObserver } {
    const claims: { type: string; runs: number }[] = [];
    return {
      claims,
      observer: {
        ...NO_OBSERVER,
        claimed: (type, _seconds, waited) => void claims.push({ type, runs: waited.length }),
      },
    };
  }

  test("a slot freed after the queue emptied claims nothing; a wake-up claims again", async () => {
    const taskId = await createTask(db.sql, owner, "d-end", 8);
    const gates = new Map<number, () => void>();
    const log = claimLog();
    const w = worker(
      {
        "d-end": (run) => new Promise((resolve) => gates.set(run.id, () => resolve({ status: "succeeded" }))),
      },
      // No poll within the test.
      slotBySlot(4, 60_000, log.observer),
    );
    /** The claim loop waits for a wake-up or its poll: no cycle (nor claim) under way. */
    const asleep = () => (w as unknown as { wakeUp: (() => void) | undefined }).wakeUp !== undefined;
    await w.start();
    try {
      // Ends runs one at a time, each after the last has freed its slot and the loop has claimed.
      const released = new Set<number>();
      for (let ended = 0; ended < 8; ended++) {
        await waitFor(async () => [...gates.keys()].find((id) => !released.has(id)), 10_000, "a run to end");
        const id = [...gates.keys()].find((k) => !released.has(k)) as number;
        released.add(id);
        const claimsBefore = log.claims.length;
        gates.get(id)?.();
        // The slot's claim (if any) is made within the loop's next cycle: wait for it, or for the
        // run's ending to be recorded with the loop back asleep (no claim in flight), whichever the
        // rule allows. Not the ending alone: it may commit while the claim for an earlier slot is
        // still in flight, and the next slot to free would then join that claim's successor (CI saw
        // [4, 1, 2, 1, 0] so).
        await waitFor(
          async () =>
            log.claims.length > claimsBefore ||
            ((await db.sql`select 1 from runs where id = ${id} and status = 'succeeded'`).length > 0 &&
              asleep()),
          10_000,
          "the slot's claim or the run's ending",
        );
      }
      assert.equal((await waitForTerminal(db.sql, taskId, 10_000)).succeeded, 8);
      // Four runs claimed at start, one per slot freed by runs 1–4, then one claim that found the
      // queue empty (freed by run 5); the slots freed by runs 6–8 claimed nothing. Each of them used to.
      const mine = log.claims.filter((c) => c.type === "d-end");
      assert.deepEqual(
        mine.map((c) => c.runs),
        [4, 1, 1, 1, 1, 0],
        "claims (runs each) of the drained type",
      );
      // A task created now wakes the worker (its NOTIFY): claimed at once, though the poll is a minute away.
      const next = await createTask(db.sql, owner, "d-end", 2);
      const deadline = Date.now() + 5_000;
      for (;;) {
        assert.ok(Date.now() < deadline, "the new task's runs were not claimed within 5 s");
        for (const [id, open] of gates) {
          if (released.has(id)) continue;
          released.add(id);
          open();
        }
        if ((await taskRow(db.sql, next)).succeeded === 2) break;
        await new Promise((r) => setTimeout(r, 10));
      }
    } finally {
      for (const open of gates.values()) open();
      await w.stop();
    }
  });

  test("work that comes without a wake-up is found by the poll, also while another type's runs keep waking the loop", async () => {
    // d-quiet's one run is claimed elsewhere, so the worker finds its queue empty (drained); the
    // claim's lease then expires and the reaper puts the run back, which sends no wake-up.
    const quietTask = await createTask(db.sql, owner, "d-quiet", 1, { maxAttempts: 3 });
    const elsewhere = await claimExpiring("d-quiet", "elsewhere");
    // A stream of short d-busy runs: each ending wakes the claim loop long before its own poll
    // timer (300 ms) would fire.
    // ~2.5 s of them on two slots: room for the mark's expiry (a poll interval) and a loaded machine.
    const BUSY = 1000;
    const busyTask = await createTask(db.sql, owner, "d-busy", BUSY);
    const log = claimLog();
    const w = worker(
      {
        "d-busy": async () => {
          await new Promise((r) => setTimeout(r, 5));
          return { status: "succeeded" };
        },
        "d-quiet": succeed,
      },
      slotBySlot(2, 300, log.observer),
    );
    await w.start();
    try {
      await waitFor(
        async () => log.claims.some((c) => c.type === "d-quiet" && c.runs === 0) || undefined,
        10_000,
        "d-quiet's queue found empty",
      );
      // (Its 1 ms lease TTL also counts this worker's row stale and deletes it; the next heartbeat
      // writes it again, and nothing here reads it.)
      await quickReaper().runOnce();
      // Put back (the worker may have claimed it again already): no longer the expired claim's.
      const [back] = await db.sql<{ owner: string | null }[]>`
        select lease_owner as owner from runs where id = ${elsewhere.id}`;
      assert.notEqual(back?.owner, "elsewhere", "the reaper put d-quiet's run back");
      await db.sql`update runs set run_after = now() where id = ${elsewhere.id} and status = 'queued'`;
      const quiet = await waitForTerminal(db.sql, quietTask, 10_000);
      assert.equal(quiet.succeeded, 1);
      // Found while d-busy's runs were still ending, not after them.
      const busy = await taskRow(db.sql, busyTask);
      assert.ok(busy.succeeded < BUSY, `d-quiet's run waited for d-busy's ${busy.succeeded} runs`);
      // (Slot by slot, a round trip or two per run: at a load average of 20 it took over 30 s.)
      assert.equal((await waitForTerminal(db.sql, busyTask, 120_000)).succeeded, BUSY);
    } finally {
      await w.stop();
    }
  });
});

describe("completion batching (ASSAY_COMPLETION_DELAY_MS)", () => {
  /** A handler that ends when the test says so; `started` resolves once `n` attempts wait in it. */
  function gated(n: number) {
    const release: (() => void)[] = [];
    let allStarted!: () => void;
    const started = new Promise<void>((resolve) => (allStarted = resolve));
    const handler: Handler = async () => {
      await new Promise<void>((resolve) => {
        release.push(resolve);
        if (release.length === n) allStarted();
      });
      return { status: "succeeded" };
    };
    return { handler, release, started };
  }

  /** Per run (in id order), the transaction that last wrote its row. */
  const writers = async (taskId: string) =>
    (
      await db.sql<
        { xmin: string }[]
      >`select r.xmin::text as xmin from runs r where r.task_id = ${taskId} order by r.id`
    ).map((r) => r.xmin);

  const finishedAt = async (taskId: string) =>
    (
      await db.sql<{ id: string; status: string; finished: string | null }[]>`
        select r.id::text as id, r.status, r.finished_at::text as finished from runs r
        where r.task_id = ${taskId} order by r.id`
    ).map((r) => ({ status: r.status, finished: r.finished }));

  test("outcomes that end within the delay are recorded by one statement; with no delay, each at once", async () => {
    for (const delayMs of [0, 1500]) {
      const type = `t-batch-${delayMs}`;
      const taskId = await createTask(db.sql, owner, type, 2);
      const g = gated(2);
      const w = worker({ [type]: g.handler }, { concurrency: 3, completionDelayMs: delayMs });
      await w.start();
      await g.started;
      g.release[0]?.();
      if (delayMs === 0) {
        // Recorded on its own before the second ends.
        await waitFor(async () => (await finishedAt(taskId)).some((r) => r.status === "succeeded"), 10_000);
      } else {
        // The first outcome waits for company: still unrecorded after its handler returned (the
        // runs are starting, or running once a progress flush has marked them).
        await new Promise((resolve) => setImmediate(resolve));
        assert.deepEqual(
          (await finishedAt(taskId)).filter((r) => r.finished !== null),
          [],
        );
      }
      g.release[1]?.();
      await waitForTerminal(db.sql, taskId, 10_000);
      await w.stop();
      const runs = await finishedAt(taskId);
      assert.deepEqual(
        runs.map((r) => r.status),
        ["succeeded", "succeeded"],
      );
      // Rows one statement wrote share its transaction id (xmin); finished_at is each attempt's end.
      const xmins = await writers(taskId);
      if (delayMs === 0) assert.notEqual(xmins[0], xmins[1]);
      else assert.equal(xmins[0], xmins[1]);
    }
  });

  /** A handler that holds the task's first run (by id) until released, and ends every other at once. */
  function firstHeld() {
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let first: number | undefined;
    const handler: Handler = async (run) => {
      first ??= run.id;
      if (run.id === first) await held;
      return { status: "succeeded" };
    };
    return { handler, release };
  }

  test("an outcome that waited for company records when its attempt ended, not when it was written", async () => {
    const taskId = await createTask(db.sql, owner, "t-batch-ended", 2);
    const g = gated(2);
    const w = worker({ "t-batch-ended": g.handler }, { concurrency: 3, completionDelayMs: 600_000 });
    await w.start();
    await g.started;
    g.release[0]?.();
    await new Promise((resolve) => setTimeout(resolve, 400));
    g.release[1]?.();
    await waitForTerminal(db.sql, taskId, 10_000);
    await w.stop();
    const rows = await db.sql<{ xmin: string; finished: Date; started: Date }[]>`
      select xmin::text as xmin, finished_at as finished, started_at as started from runs
      where task_id = ${taskId} order by finished_at`;
    assert.equal(rows[0]?.xmin, rows[1]?.xmin, "one statement");
    const gap = (rows[1]?.finished.getTime() ?? 0) - (rows[0]?.finished.getTime() ?? 0);
    assert.ok(gap >= 300, `the two attempts ended ~400 ms apart; finished_at ${gap} ms apart`);
    for (const r of rows) assert.ok(r.started.getTime() <= r.finished.getTime());
  });

  test("a task's started_at is never after its runs' ends, though a running mark set it while an outcome waited", async () => {
    const taskId = await createTask(db.sql, owner, "t-batch-start", 2);
    // The first run to start ends at once and waits for company; the other runs until released, long
    // enough for a progress flush to mark it (and its task) running.
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let first: number | undefined;
    const handler: Handler = async (run) => {
      first ??= run.id;
      if (run.id !== first) await gate;
      return { status: "succeeded" };
    };
    const w = worker(
      { "t-batch-start": handler },
      { concurrency: 3, completionDelayMs: 600_000, progressFlushMs: 50 },
    );
    await w.start();
    await waitFor(async () => (await taskRow(db.sql, taskId)).status === "running", 10_000);
    release();
    await waitForTerminal(db.sql, taskId, 10_000);
    await w.stop();
    const [row] = await db.sql<{ taskStarted: Date; firstEnd: Date }[]>`
      select t.started_at as "taskStarted", (select min(finished_at) from runs where task_id = t.id) as "firstEnd"
      from tasks t where t.id = ${taskId}`;
    assert.ok(
      (row?.taskStarted.getTime() ?? 0) <= (row?.firstEnd.getTime() ?? 0),
      `task started ${(row?.taskStarted.getTime() ?? 0) - (row?.firstEnd.getTime() ?? 0)} ms after its first run ended`,
    );
  });

  test("a full batch (the slots, at least COMPLETION_BATCH_MIN = 8) is recorded at once while other runs are live", async () => {
    // Two slots: the first run holds one (the company), eight quick runs end through the other.
    const taskId = await createTask(db.sql, owner, "t-batch-full", 9);
    const h = firstHeld();
    const w = worker({ "t-batch-full": h.handler }, { concurrency: 2, completionDelayMs: 600_000 });
    await w.start();
    await waitFor(async () => (await taskRow(db.sql, taskId)).succeeded === 8, 20_000);
    const runs = await finishedAt(taskId);
    assert.equal(runs[0]?.finished, null, "the first run is still live");
    // One statement recorded the eight: they share its transaction.
    assert.equal(new Set((await writers(taskId)).slice(1)).size, 1);
    h.release();
    await waitForTerminal(db.sql, taskId, 20_000);
    await w.stop();
  });

  test("an outcome with no other run live or claimed on the worker is recorded at once", async () => {
    const taskId = await createTask(db.sql, owner, "t-batch-lone", 1);
    const w = worker({ "t-batch-lone": succeed }, { concurrency: 3, completionDelayMs: 600_000 });
    await w.start();
    const row = await waitForTerminal(db.sql, taskId, 20_000);
    await w.stop();
    assert.equal(row.succeeded, 1);
  });

  test("an outcome of a globally limited type is recorded at once (its slot may be awaited elsewhere)", async () => {
    const taskId = await createTask(db.sql, owner, "t-batch-limited", 2);
    const h = firstHeld();
    const w = new Worker({
      sql: db.sql,
      logger,
      types: { "t-batch-limited": { handler: h.handler, globalLimit: 5 } },
      concurrency: 2,
      leaseTtlMs: 30_000,
      pollIntervalMs: 200,
      retryBaseMs: 50,
      completionDelayMs: 600_000,
    });
    await w.start();
    // The second run ends while the first is still live: with company, but recorded anyway.
    await waitFor(async () => (await taskRow(db.sql, taskId)).succeeded === 1, 20_000);
    h.release();
    await waitForTerminal(db.sql, taskId, 20_000);
    await w.stop();
  });

  test("a shutdown records a waiting outcome at once", async () => {
    const taskId = await createTask(db.sql, owner, "t-batch-stop", 2);
    // The first run to start ends when released; the other only when the shutdown aborts it.
    let releaseFirst!: () => void;
    const firstGate = new Promise<void>((resolve) => (releaseFirst = resolve));
    let allStarted!: () => void;
    const started = new Promise<void>((resolve) => (allStarted = resolve));
    let first: number | undefined;
    let starts = 0;
    const handler: Handler = async (run, { signal }) => {
      first ??= run.id;
      if (++starts === 2) allStarted();
      if (run.id === first) {
        await firstGate;
        return { status: "succeeded" };
      }
      await new Promise((resolve) => signal.addEventListener("abort", resolve));
      return { status: "cancelled" };
    };
    const w = worker({ "t-batch-stop": handler }, { concurrency: 3, completionDelayMs: 600_000 });
    await w.start();
    await started;
    releaseFirst();
    // Its outcome waits for company (the other run is live): nothing recorded yet.
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.equal(
      (await taskRow(db.sql, taskId)).succeeded,
      0,
      "recorded before the delay: nothing was batched",
    );
    const began = Date.now();
    // The other run is aborted by the shutdown and goes back to the queue; the waiting outcome is
    // recorded.
    await w.stop();
    assert.ok(Date.now() - began < 20_000, "stop waited for the completion delay");
    assert.equal((await taskRow(db.sql, taskId)).succeeded, 1);
    assert.deepEqual((await finishedAt(taskId)).map((r) => r.status).sort(), ["queued", "succeeded"]);
  });
});

describe("automatic prefetch (ASSAY_PREFETCH_WINDOW_MS)", () => {
  const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

  /** Runs a task of `runs` runs of `type` on a worker of two slots; returns each claim's size. */
  async function claimSizes(
    type: string,
    runs: number,
    handler: Handler,
    extra: Partial<WorkerOptions>,
    globalLimit = 0,
  ): Promise<number[]> {
    const taskId = await createTask(db.sql, owner, type, runs);
    const sizes: number[] = [];
    const w = new Worker({
      sql: db.sql,
      logger,
      types: { [type]: { handler, globalLimit } },
      concurrency: 2,
      leaseTtlMs: 30_000,
      pollIntervalMs: 200,
      retryBaseMs: 50,
      observer: {
        ...NO_OBSERVER,
        claimed: (_type, _seconds, waited) => {
          if (waited.length > 0) sizes.push(waited.length);
        },
      },
      ...extra,
    });
    await w.start();
    const row = await waitForTerminal(db.sql, taskId, 30_000);
    await w.stop();
    assert.equal(row.succeeded, runs);
    return sizes;
  }

  const quick: Handler = async () => {
    await pause(2);
    return { status: "succeeded" };
  };

  test("while a type's runs are short, claims take runs ahead of the free slots; without a window, never", async () => {
    const off = await claimSizes("t-auto-off", 40, quick, {});
    assert.ok(
      off.every((n) => n <= 2),
      `claims: ${off}`,
    );
    const on = await claimSizes("t-auto-on", 40, quick, { prefetchWindowMs: 10_000 });
    assert.ok(Math.max(...on) > 2, `claims: ${on}`);
    assert.ok(
      on.every((n) => n <= 2 + AUTO_PREFETCH_PER_SLOT * 2),
      `claims: ${on}`,
    );
    assert.ok(on.length < off.length, `${on.length} claims with it against ${off.length} without`);
  });

  test("runs under AUTO_PREFETCH_MIN_MS are claimed ahead while one backlog drains, and only for the free slots while tasks of their type arrive", async () => {
    const type = "t-auto-instant";
    const instant: Handler = async () => ({ status: "succeeded" });
    const big = await createTask(db.sql, owner, type, 20_000);
    const claims: { at: number; size: number }[] = [];
    const w = new Worker({
      sql: db.sql,
      logger,
      types: { [type]: { handler: instant } },
      concurrency: 2,
      leaseTtlMs: 30_000,
      pollIntervalMs: 200,
      retryBaseMs: 50,
      // The window at AUTO_PREFETCH_MIN_MS: a stall of the process (GC, a busy machine) that lifts the
      // handler's running mean to 1 ms or more (on the way up or back down) puts it at the window, so
      // the rule for runs from 1 ms up prefetches nothing while the check below runs (a review: with
      // 1.5 a mean between the two claimed ahead whatever arrived).
      prefetchWindowMs: AUTO_PREFETCH_MIN_MS,
      observer: {
        ...NO_OBSERVER,
        claimed: (_type, seconds, waited) => {
          if (waited.length > 0) claims.push({ at: performance.now() - seconds * 1000, size: waited.length });
        },
      },
    });
    await w.start();
    try {
      // One backlog, no task created since the worker started: ahead of the slots.
      await waitFor(async () => claims.some((c) => c.size > 2), 10_000, "a claim ahead of the slots");
      // Tasks arrive, one every 100 ms: from the first one's notification on, the free slots only.
      // Counted from the second create on, when the first's notification has long been in (one
      // claim over the slots tolerated: a stall may hold a notification back).
      const sizes: number[] = [];
      let from = 0;
      for (let i = 0; i < 6; i++) {
        await createTask(db.sql, owner, type, 1);
        if (i === 1) from = performance.now();
        await pause(100);
      }
      for (const c of claims) if (c.at >= from) sizes.push(c.size);
      assert.ok(sizes.length > 10, `claims while tasks arrived: ${sizes.length}`);
      assert.ok(sizes.filter((n) => n > 2).length <= 1, `claims: ${sizes}`);
      assert.ok((await taskRow(db.sql, big)).succeeded < 20_000, "the backlog still draining");
    } finally {
      await taskCancel(db.sql, owner, big);
      await w.stop();
    }
  });

  test("none for runs as long as the window or longer, nor for a type with a global limit", async () => {
    const long: Handler = async () => {
      await pause(40);
      return { status: "succeeded" };
    };
    const sizes = await claimSizes("t-auto-long", 12, long, { prefetchWindowMs: 20 });
    assert.ok(
      sizes.every((n) => n <= 2),
      `claims: ${sizes}`,
    );
    const limited = await claimSizes("t-auto-limited", 30, quick, { prefetchWindowMs: 10_000 }, 10);
    assert.ok(
      limited.every((n) => n <= 2),
      `claims: ${limited}`,
    );
  });

  test("runs claimed ahead on a mean their runs no longer keep to are given back after STALE_BUFFER_MIN_MS, and another worker runs them", async () => {
    // As the dashboard's cancel test found: a worker that has learned a type short (runs of a few
    // ms) claims a task of long runs ahead of its slots — 2 run, 4 wait in its buffer, out of other
    // workers' reach until a slot frees.
    const type = "t-auto-stale";
    let holding = false;
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const handler: Handler = async () => {
      if (holding) await gate;
      else await pause(2);
      return { status: "succeeded" };
    };
    const a = worker({ [type]: handler }, { concurrency: 2, prefetchWindowMs: 200 });
    const ranOnB: number[] = [];
    const b = worker(
      {
        [type]: async (run) => {
          ranOnB.push(run.id);
          return { status: "succeeded" };
        },
      },
      { concurrency: 2, prefetchWindowMs: 200 },
    );
    const buffered = () => (a as unknown as { buffer: ClaimedRun[] }).buffer;
    await a.start();
    try {
      await waitForTerminal(db.sql, await createTask(db.sql, owner, type, 10), 20_000);
      // Set before the create: the worker may start the task's first run before the create returns.
      holding = true;
      const long = await createTask(db.sql, owner, type, 6);
      await waitFor(async () => buffered().length === 4, 10_000, "four runs claimed ahead of A's slots");
      const ahead = buffered().map((r) => r.id);
      const bufferedAt = (a as unknown as { bufferedAt: Map<number, number> }).bufferedAt;
      const claimedAt = Math.min(...ahead.map((id) => bufferedAt.get(id) as number));
      await b.start();
      // Given back (their attempt refunded), claimed by B and run there, while A's two hold its slots.
      await waitFor(async () => ranOnB.length === 4, 20_000, "B runs the runs A had claimed ahead");
      assert.ok(
        performance.now() - claimedAt >= STALE_BUFFER_MIN_MS,
        "not given back before they were stale",
      );
      assert.deepEqual(ranOnB, ahead, "B ran them in file order");
      assert.equal(buffered().length, 0);
      const attempts = await db.sql<{ attempt: number }[]>`
        select attempt from runs where id = any(${db.sql.array(ahead)}::bigint[])`;
      assert.deepEqual(
        attempts.map((r) => r.attempt),
        [1, 1, 1, 1],
        "the attempts A never started are refunded",
      );
      release();
      const row = await waitForTerminal(db.sql, long, 20_000);
      assert.equal(row.succeeded, 6);
    } finally {
      release();
      await Promise.all([a.stop(), b.stop()]);
    }
  });

  /** A worker of one slot and a 200 ms window whose log lines are kept (to count give-backs). */
  function loggedWorker(type: string, handler: Handler, lines: string[], claimed: number[]): Worker {
    return worker(
      { [type]: handler },
      {
        concurrency: 1,
        prefetchWindowMs: 200,
        logger: createLogger({ level: "info", destination: { write: (l: string) => lines.push(l) } }),
        observer: { ...NO_OBSERVER, claimed: (_t, _s, waited) => claimed.push(waited.length) },
      },
    );
  }
  const gaveBack = (lines: string[]) => lines.filter((l) => l.includes("given back to the queue"));

  test("after a give-back, nothing more is claimed ahead on the old mean, nor before its retry is written: a task's runs start in file order", async () => {
    // Runs a little longer than the window after a short mean: the slot turns over, so a young live
    // attempt made the prefetch claim the task's later runs before the given-back ones (a review:
    // runs started …3,6,4,5…, 15 runs claimed for 10); and a slot that freed before the give-back's
    // retry was written claimed the runs after them (another review: …4,7,5,8,6…, with the retry
    // statement slowed as here).
    const type = "t-auto-stale-order";
    let slow = false;
    const started: number[] = [];
    const lines: string[] = [];
    const claimed: number[] = [];
    const w = loggedWorker(
      type,
      async (run) => {
        if (slow) started.push(run.id);
        await pause(slow ? 300 : 20);
        return { status: "succeeded" };
      },
      lines,
      claimed,
    );
    const requeues = (w as unknown as { requeues: { write: (batch: unknown) => Promise<unknown> } }).requeues;
    const write = requeues.write.bind(requeues);
    requeues.write = async (batch) => {
      await pause(400);
      return write(batch);
    };
    await w.start();
    try {
      await waitForTerminal(db.sql, await createTask(db.sql, owner, type, 10), 20_000);
      claimed.length = 0;
      // Set before the create: the worker may start the task's first run before the create returns.
      slow = true;
      const task = await createTask(db.sql, owner, type, 10);
      await waitForTerminal(db.sql, task, 30_000);
      assert.deepEqual(
        started,
        [...started].sort((a, b) => a - b),
        "file order",
      );
      // One: the wake-up's claim took the slot's run and four ahead (the mean ~20 ms), the fifth
      // waited behind four runs of 300 ms; after it, the mean is a second and nothing is claimed ahead.
      assert.equal(gaveBack(lines).length, 1, "one give-back");
      const back = gaveBack(lines).reduce((n, l) => n + (JSON.parse(l) as { runs: number }).runs, 0);
      assert.equal(
        claimed.reduce((a, b) => a + b, 0),
        10 + back,
        `claims ${claimed}, ${back} given back`,
      );
    } finally {
      await w.stop();
    }
  });

  test("with a fixed prefetch as well, runs given back are not claimed back while the slots stay busy", async () => {
    // A wake-up claimed NEWCOMER_CLAIM runs into the buffer whatever it held; behind the fixed
    // prefetch's run they were given back, and the give-back's own wake-up claimed them again, every
    // second while the slot stayed busy (a review: 5 give-backs in 6 s, 28 run.retry events).
    const type = "t-auto-stale-fixed";
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let first = true;
    const lines: string[] = [];
    const claimed: number[] = [];
    const w = worker(
      {
        [type]: async () => {
          if (first) {
            first = false;
            await gate;
          }
          return { status: "succeeded" };
        },
      },
      {
        concurrency: 1,
        prefetch: 1,
        prefetchWindowMs: 200,
        logger: createLogger({ level: "info", destination: { write: (l: string) => lines.push(l) } }),
        observer: { ...NO_OBSERVER, claimed: (_t, _s, waited) => claimed.push(waited.length) },
      },
    );
    await w.start();
    try {
      const task = await createTask(db.sql, owner, type, 8);
      await waitFor(
        async () => gaveBack(lines).length > 0,
        10_000,
        "the runs beyond the fixed prefetch given back",
      );
      // An absence is watched for a while: three more give-back periods with the slot still held.
      await pause(3 * STALE_BUFFER_MIN_MS);
      assert.equal(gaveBack(lines).length, 1, `give-backs: ${gaveBack(lines).length}, claims: ${claimed}`);
      release();
      assert.equal((await waitForTerminal(db.sql, task, 20_000)).succeeded, 8);
    } finally {
      release();
      await w.stop();
    }
  });

  test("a give-back the database refuses even as its stand-in is given up, and no longer holds its type's claims back", async () => {
    // Its retry never reaches retried(): the mark that holds the type's claims back stayed, and the
    // worker never claimed the type again (a review).
    const lines: string[] = [];
    const w = worker(
      { "t-auto-stale-refused": quick },
      {
        concurrency: 1,
        prefetchWindowMs: 200,
        logger: createLogger({ level: "info", destination: { write: (l: string) => lines.push(l) } }),
      },
    );
    const internals = w as unknown as {
      buffer: Partial<ClaimedRun>[];
      bufferedAt: Map<number, number>;
      requeues: { write: (batch: unknown) => Promise<unknown> };
      giveBackStale(): void;
      givingBackType(type: string): boolean;
      flushing: Promise<void> | undefined;
    };
    const run = (id: number) => ({
      id,
      taskId: 1_000_000_001,
      analysisType: "t-auto-stale-refused",
      leaseToken: `0e0e0e0e-0000-4000-8000-00000000000${id}`,
      attempt: 1,
      priority: 5,
    });
    // The first is the free slot's (kept); the other two were claimed ahead.
    internals.buffer = [run(1), run(2), run(3)];
    for (const id of [1, 2, 3]) internals.bufferedAt.set(id, performance.now() - 10 * STALE_BUFFER_MIN_MS);
    internals.requeues.write = async () => {
      throw Object.assign(new Error("invalid input syntax"), { name: "PostgresError", code: "22P02" });
    };
    internals.giveBackStale();
    assert.ok(internals.givingBackType("t-auto-stale-refused"), "held back while the give-back is written");
    await internals.flushing;
    assert.equal(lines.filter((l) => l.includes("could not be written at all")).length, 2, lines.join("\n"));
    assert.equal(internals.givingBackType("t-auto-stale-refused"), false);
  });

  test("a run claimed for a slot whose program is exiting is not given back, however long the exit takes", async () => {
    const type = "t-auto-stale-finishing";
    const lines: string[] = [];
    const claimed: number[] = [];
    let first = true;
    const w = loggedWorker(
      type,
      async (_run, ctx) => {
        if (first) {
          first = false;
          // Said its result, and takes 2 s to exit: the next run is claimed for its slot meanwhile.
          ctx.finishing();
          await pause(2 * STALE_BUFFER_MIN_MS);
        }
        return { status: "succeeded" };
      },
      lines,
      claimed,
    );
    await w.start();
    try {
      const t = await createTask(db.sql, owner, type, 2);
      await waitForTerminal(db.sql, t, 30_000);
      assert.deepEqual(gaveBack(lines), []);
      assert.equal(
        claimed.reduce((a, b) => a + b, 0),
        2,
        `claims ${claimed}`,
      );
    } finally {
      await w.stop();
    }
  });

  /**
   * One slot: `big`'s first five runs end at once (the type's mean becomes short), its sixth holds the
   * slot until released while the worker fills its buffer. Resolves `held` once the sixth is held.
   */
  function holdSixth(big: () => string) {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let reached!: () => void;
    const held = new Promise<void>((resolve) => (reached = resolve));
    const starts: string[] = [];
    let released = false;
    const handler: Handler = async (run) => {
      starts.push(released ? `after:${run.taskId}` : String(run.taskId));
      if (String(run.taskId) === big() && starts.length >= 6 && !released) {
        reached();
        await gate;
      }
      await pause(2);
      return { status: "succeeded" };
    };
    return {
      handler,
      held,
      starts,
      release: () => {
        released = true;
        release();
      },
    };
  }

  const live = async (taskId: string) =>
    Number(
      (
        await db.sql<{ n: number }[]>`
          select count(*)::int as n from runs where task_id = ${taskId} and status in ('starting', 'running')`
      )[0]?.n,
    );

  test("a newcomer's run is claimed into a full buffer and starts ahead of the runs claimed before it", async () => {
    const userB = await seedUser(db.sql, "worker-tests-newcomer");
    const type = "t-auto-newcomer";
    const big = await createTask(db.sql, owner, type, 40);
    const h = holdSixth(() => big);
    const w = worker({ [type]: h.handler }, { concurrency: 1, prefetchWindowMs: 60_000 });
    await w.start();
    await h.held;
    // The held run and runs claimed ahead (how many depends on when the last refill came).
    await waitFor(async () => (await live(big)) >= 2, 20_000);
    // The newcomer is at the back of the rotation: the wake-up's claim takes a turn of the big
    // task's (behind the buffer) and then the newcomer's run (ahead of it), while the slot is held.
    const small = await createTask(db.sql, userB, type, 1);
    // In the worker's buffer, not only claimed in the database: a claim's reply may reach the worker
    // after its commit shows (a busy machine), and A's runs would start meanwhile.
    const buffered = () => (w as unknown as { buffer: { taskId: number }[] }).buffer;
    await waitFor(async () => buffered().some((r) => String(r.taskId) === small), 20_000);
    h.release();
    await waitForTerminal(db.sql, small, 20_000);
    await waitForTerminal(db.sql, big, 30_000);
    await w.stop();
    const after = h.starts.filter((s) => s.startsWith("after:"));
    assert.equal(after[0], `after:${small}`, `starts after the release: ${after.slice(0, 6)}`);
  });

  test("a run of a better priority is placed ahead of buffered runs of a worse one, a newcomer's too", async () => {
    // Claimed for real and placed as the worker places a claim's reply: user X's priority-0 task
    // of 6 runs, 5 claimed ahead (one slot, a prefetch), then a claim of 5 more that takes X's last
    // run and, work-conserving, 4 of a newcomer's priority-5 task. The newcomer's runs went ahead of
    // the young buffered runs (X's, all of them) and X's last run behind them.
    const userX = await seedUser(db.sql, "worker-tests-prio-x");
    const userY = await seedUser(db.sql, "worker-tests-prio-y");
    const type = "t-place-priority";
    const x = await createTask(db.sql, userX, type, 6, { priority: 0 });
    const w = worker({ [type]: quick }, { concurrency: 1, prefetch: 4, prefetchWindowMs: 60_000 });
    const internals = w as unknown as { place(runs: ClaimedRun[]): void; buffer: ClaimedRun[] };
    const claim = (limit: number) =>
      runClaim(db.sql, { workerId: "prio", analysisType: type, limit, globalLimit: 0, leaseTtlMs: 30_000 });
    internals.place(await claim(5));
    const y = await createTask(db.sql, userY, type, 4);
    const second = await claim(5);
    assert.deepEqual(
      second.map((r) => String(r.taskId)),
      [x, y, y, y, y],
      "the claim serves priority 0 first",
    );
    internals.place(second);
    assert.deepEqual(
      internals.buffer.map((r) => `${r.taskId}:${r.priority}`),
      [...Array(6).fill(`${x}:0`), ...Array(4).fill(`${y}:5`)],
    );
    // Each task's runs in file order still.
    const ids = (task: string) => internals.buffer.filter((r) => String(r.taskId) === task).map((r) => r.id);
    for (const task of [x, y])
      assert.deepEqual(
        ids(task),
        [...ids(task)].sort((a, b) => a - b),
      );
  });

  test("priority reorders a type's buffered runs only: never past a run of another type; a newcomer passes worse ones", async () => {
    const claimOf = (type: string, limit: number) =>
      runClaim(db.sql, { workerId: "prio2", analysisType: type, limit, globalLimit: 0, leaseTtlMs: 30_000 });
    const userX = await seedUser(db.sql, "worker-tests-prio2-x");
    const userZ = await seedUser(db.sql, "worker-tests-prio2-z");
    const userW = await seedUser(db.sql, "worker-tests-prio2-w");
    const w = worker(
      { "t-prio2-a": quick, "t-prio2-b": quick },
      { concurrency: 1, prefetch: 8, prefetchWindowMs: 0 },
    );
    const internals = w as unknown as {
      place(runs: ClaimedRun[]): void;
      buffer: ClaimedRun[];
      bufferedAt: Map<number, number>;
    };
    const order = () => internals.buffer.map((r) => `${r.taskId}:${r.priority}`);
    // Another type's better run goes behind: it may run for minutes, and the buffered runs of the
    // first type were claimed before it (its own type's claim serves priority first).
    const a = await createTask(db.sql, userX, "t-prio2-a", 2);
    const b = await createTask(db.sql, userZ, "t-prio2-b", 1, { priority: 0 });
    internals.place(await claimOf("t-prio2-a", 2));
    internals.place(await claimOf("t-prio2-b", 1));
    assert.deepEqual(order(), [`${a}:5`, `${a}:5`, `${b}:0`]);
    internals.buffer.length = 0;
    // Within a type: X's three priority-0 runs (young), Z's priority-5 run (old), then a newcomer W
    // at priority 0. W goes ahead of X's young runs, past Z's old one (a worse priority, behind
    // anyway): the walk back stopped at Z and left W behind X's young runs.
    const x = await createTask(db.sql, userX, "t-prio2-c", 3, { priority: 0 });
    const z = await createTask(db.sql, userZ, "t-prio2-c", 1);
    const claimed = await claimOf("t-prio2-c", 4);
    internals.place(claimed);
    const old = claimed.find((r) => String(r.taskId) === z);
    assert.ok(old);
    internals.bufferedAt.set(old.id, performance.now() - 60_000);
    const nw = await createTask(db.sql, userW, "t-prio2-c", 1, { priority: 0 });
    internals.place(await claimOf("t-prio2-c", 1));
    assert.deepEqual(order(), [`${nw}:0`, `${x}:0`, `${x}:0`, `${x}:0`, `${z}:5`]);
  });

  test("another type waiting behind one type's runs claimed ahead stops the prefetch: it starts once they have", async () => {
    const big = await createTask(db.sql, owner, "t-auto-mixed-a", 40);
    const h = holdSixth(() => big);
    const w = worker(
      { "t-auto-mixed-a": h.handler, "t-auto-mixed-b": h.handler },
      { concurrency: 1, prefetchWindowMs: 60_000 },
    );
    await w.start();
    await h.held;
    await waitFor(async () => (await live(big)) >= 2, 20_000);
    const other = await createTask(db.sql, owner, "t-auto-mixed-b", 1);
    // Its wake-up finds the buffer full of the other type's runs: no claim, but no more prefetch.
    await new Promise((resolve) => setTimeout(resolve, 300));
    h.release();
    await waitForTerminal(db.sql, other, 20_000);
    await waitForTerminal(db.sql, big, 30_000);
    await w.stop();
    const after = h.starts.filter((s) => s.startsWith("after:"));
    const at = after.indexOf(`after:${other}`);
    // Behind the held run's buffer (its four), then a claim or two of free slots in turn; without
    // the stop it waited for the whole backlog (~34 runs).
    assert.ok(
      at >= 0 && at <= 2 * (AUTO_PREFETCH_PER_SLOT + 1),
      `starts after the release: ${after.slice(0, 12)}`,
    );
  });

  test("a worker of two types keeps claiming ahead for the busy one while the other has nothing queued", async () => {
    const taskId = await createTask(db.sql, owner, "t-auto-busy", 150);
    let claims = 0;
    const w = worker(
      { "t-auto-busy": quick, "t-auto-idle": quick },
      {
        concurrency: 1,
        prefetchWindowMs: 10_000,
        pollIntervalMs: 50,
        observer: {
          ...NO_OBSERVER,
          claimed: (type, _seconds, waited) => {
            if (type === "t-auto-busy" && waited.length > 0) claims++;
          },
        },
      },
    );
    await w.start();
    await waitForTerminal(db.sql, taskId, 30_000);
    await w.stop();
    // Claims of several runs (up to AUTO_PREFETCH_PER_SLOT ahead); one per run if the idle type's
    // poll-interval look had stopped the prefetch.
    assert.ok(claims < 150 / 2, `${claims} claims for 150 runs`);
  });

  test("autoPrefetchRuns: a window's worth of runs for the slots, at most AUTO_PREFETCH_PER_SLOT each; none from the window up, nor under AUTO_PREFETCH_MIN_MS while tasks arrive", () => {
    // Two slots, runs of 50 ms, a window of 200 ms: 8 runs (the cap is also 8).
    assert.equal(autoPrefetchRuns(0.05, 200, 2), 8);
    assert.equal(autoPrefetchRuns(0.1, 200, 2), 4);
    assert.equal(autoPrefetchRuns(0.002, 200, 10), AUTO_PREFETCH_PER_SLOT * 10);
    // Shorter than AUTO_PREFETCH_MIN_MS: its own, larger cap, unless tasks of the type are arriving.
    assert.ok(AUTO_PREFETCH_PER_SLOT_INSTANT > AUTO_PREFETCH_PER_SLOT);
    assert.equal(
      autoPrefetchRuns(AUTO_PREFETCH_MIN_MS / 1000 / 2, 200, 2),
      AUTO_PREFETCH_PER_SLOT_INSTANT * 2,
    );
    assert.equal(autoPrefetchRuns(AUTO_PREFETCH_MIN_MS / 1000, 200, 2), AUTO_PREFETCH_PER_SLOT * 2);
    assert.equal(autoPrefetchRuns(AUTO_PREFETCH_MIN_MS / 1000 / 2, 200, 2, true), 0);
    assert.equal(autoPrefetchRuns(0.05, 200, 2, true), 8);
    for (const [mean, window] of [
      [undefined, 200],
      [0.2, 200],
      [0.5, 200],
      [0.05, 0],
    ] as const)
      assert.equal(autoPrefetchRuns(mean, window, 2), 0, `mean ${mean} s, window ${window} ms`);
  });
});
