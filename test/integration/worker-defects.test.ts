// Defects a review proved in the worker, each with the case that reproduced it: a NUL (or half a
// surrogate pair) in what an attempt reports refused its whole completion batch, and every later one
// with it; an outcome the database refuses for what it is held back every outcome written with it;
// runs a committed claim took were lost when the claim after it failed; a late heartbeat answer about
// a run's old lease aborted its new attempt; and a heartbeat in flight at stop() registered the
// worker again after it had deregistered.
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { UNRECORDABLE_MESSAGE } from "../../src/queue/outcomes.ts";
import { pgSafe } from "../../src/queue/sql/shared.ts";
import { type Handler, Worker, type WorkerOptions } from "../../src/queue/worker.ts";
import { outcomeOf } from "../../src/runner/handler.ts";
import { runProcess } from "../../src/runner/run-process.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser, waitFor, waitForTerminal } from "../helpers/queue.ts";

let db: TestDatabase;
let owner: Principal;

before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "defects");
});
after(() => db.drop());

function worker(types: Record<string, Handler>, extra: Partial<WorkerOptions> = {}): Worker {
  return new Worker({
    sql: db.sql,
    logger: createLogger({ level: "silent" }),
    types: Object.fromEntries(Object.entries(types).map(([t, handler]) => [t, { handler }])),
    concurrency: 4,
    leaseTtlMs: 60_000,
    pollIntervalMs: 100,
    retryBaseMs: 20,
    ...extra,
  });
}

/** stop(), or a failure when it has not returned within `ms` (it used to hang on a refused batch). */
async function stopWithin(w: Worker, ms = 10_000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"late">((resolve) => {
    timer = setTimeout(() => resolve("late"), ms);
  });
  const how = await Promise.race([w.stop().then(() => "stopped" as const), late]);
  clearTimeout(timer);
  assert.equal(how, "stopped", `stop() had not returned after ${ms} ms`);
}

interface RunRow {
  status: string;
  attempt: number;
  error_code: string | null;
  error_message: string | null;
  message: string | null;
  result: Record<string, unknown> | null;
}

const runsOf = (taskId: string) =>
  db.sql<RunRow[]>`
    select status, attempt, error_code, error_message, message, result from runs
    where task_id = ${taskId} order by id`;

/** A node program run as an analysis would be (runProcess, outcomeOf); `outputOk` stands for the output check. */
const program = (script: string, outputOk = false): Handler => {
  return async (_run, ctx) => {
    const r = await runProcess(
      { executable: process.execPath, args: ["-e", script], cwd: "/tmp", env: {} },
      ctx.signal,
      { killGraceMs: 1000 },
      (p) => ctx.reportProgress(p.percent, p.message),
    );
    return outcomeOf(r, outputOk ? { ok: true } : undefined);
  };
};

test("a NUL or half a surrogate pair in what an attempt reports is recorded without it, and blocks nothing", async () => {
  const progressed = async (runId: number) =>
    waitFor(
      async () => (await db.sql`select 1 from runs where id = ${runId} and message is not null`).length > 0,
      10_000,
      "the progress write",
    );
  const w = worker(
    {
      // A program that fails (exit 5) with a NUL in its stderr: the failed run keeps the tail.
      "nul-stderr": program(String.raw`process.stderr.write("oops\u0000 \ud800tail\n"); process.exit(5)`),
      // A program whose result has a NUL in a metrics key (only values were checked) and half a
      // surrogate pair in another, after a progress message with a NUL.
      "nul-metrics": async (run, ctx) => {
        const outcome = await program(
          String.raw`const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
            out({ type: "progress", percent: 10, message: "step\u0000one" });
            out({ type: "result", outputFileName: "r.json", metrics: { "ro\u0000ws": 1, "lone\udc00": 2 } });`,
          true,
        )(run, ctx);
        await progressed(run.id); // the progress message was written while the attempt was live
        return outcome;
      },
      // A handler's error code and message.
      "nul-error": async () => ({
        status: "failed",
        errorCode: "ANALYSIS_DATA_INVALID\u0000",
        errorMessage: "bad\u0000 input \ud800",
      }),
      "nul-after": async () => ({ status: "succeeded" }),
    },
    { progressFlushMs: 20, completionDelayMs: 200 },
  );
  await w.start();
  try {
    const stderrTask = await createTask(db.sql, owner, "nul-stderr", 1, { maxAttempts: 1 });
    const metricsTask = await createTask(db.sql, owner, "nul-metrics", 1, { maxAttempts: 1 });
    const errorTask = await createTask(db.sql, owner, "nul-error", 1, { maxAttempts: 1 });
    assert.equal((await waitForTerminal(db.sql, stderrTask, 15_000)).status, "failed");
    assert.equal((await waitForTerminal(db.sql, metricsTask, 15_000)).status, "succeeded");
    assert.equal((await waitForTerminal(db.sql, errorTask, 15_000)).status, "failed");
    // Outcomes after them are recorded too (they used to join the refused batch, forever).
    const later = await createTask(db.sql, owner, "nul-after", 3);
    assert.equal((await waitForTerminal(db.sql, later, 15_000)).succeeded, 3);

    const [stderrRun] = await runsOf(stderrTask);
    assert.equal(stderrRun?.error_code, "ANALYSIS_PROCESS_FAILED");
    assert.equal(stderrRun?.error_message, "the analysis failed internally");
    assert.deepEqual(stderrRun?.result, { stderrTail: "oops \ufffdtail\n" });
    const [metricsRun] = await runsOf(metricsTask);
    assert.deepEqual(metricsRun?.result, { outputFileName: "r.json", metrics: { rows: 1, "lone\ufffd": 2 } });
    assert.equal(metricsRun?.message, "stepone");
    const [errorRun] = await runsOf(errorTask);
    assert.equal(errorRun?.error_code, "ANALYSIS_DATA_INVALID");
    assert.equal(errorRun?.error_message, "bad input \ufffd");
  } finally {
    await stopWithin(w);
  }
});

test("outcomes the database refuses do not keep the rest of their batch, or later ones, from being recorded", async () => {
  // Two refusals no sanitising can prevent: a CHECK constraint (class 23: the batch is tried whole once
  // more, then in parts) and a trigger's data exception (class 22: in parts at once), each aimed at one
  // error message.
  await db.sql.unsafe(`
    alter table runs add constraint test_refused_by_check
      check (error_message is distinct from 'refused by a check');
    create function test_refuse_as_data() returns trigger language plpgsql as $$
      begin raise exception 'refused for the test' using errcode = '22023'; end $$;
    create trigger test_refuse_as_data before update on runs for each row
      when (new.error_message = 'refused as data') execute function test_refuse_as_data();`);
  let release: () => void = () => {};
  const gate = new Promise<void>((r) => {
    release = r;
  });
  const fates = new Map<string, "check" | "data" | "transient">();
  const w = worker(
    {
      "refuse-batch": async (run) => {
        await gate;
        const fate = fates.get(String(run.taskId));
        if (fate === "check")
          return { status: "failed", errorCode: "ANALYSIS_DATA_INVALID", errorMessage: "refused by a check" };
        if (fate === "data")
          return { status: "failed", errorCode: "ANALYSIS_DATA_INVALID", errorMessage: "refused as data" };
        // Its retry is refused (the same trigger); the stand-in retry puts it back, and attempt 2 succeeds.
        if (fate === "transient" && run.attempt === 1)
          return {
            status: "failed",
            errorCode: "ANALYSIS_DEPENDENCY_FAILED",
            errorMessage: "refused as data",
            transient: true,
          };
        return { status: "succeeded" };
      },
    },
    // One batch: every outcome waits for company until the last one ends.
    { concurrency: 8, completionDelayMs: 5_000 },
  );
  try {
    const good = await createTask(db.sql, owner, "refuse-batch", 4, { maxAttempts: 1 });
    const byCheck = await createTask(db.sql, owner, "refuse-batch", 1, { maxAttempts: 1 });
    const asData = await createTask(db.sql, owner, "refuse-batch", 1, { maxAttempts: 1 });
    const transient = await createTask(db.sql, owner, "refuse-batch", 1, { maxAttempts: 2 });
    fates.set(byCheck, "check");
    fates.set(asData, "data");
    fates.set(transient, "transient");
    await w.start();
    await waitFor(
      async () =>
        (
          await db.sql`select 1 from runs
            where analysis_type = 'refuse-batch' and status in ('starting', 'running')`
        ).length === 7,
      10_000,
      "all seven runs to start",
    );
    release();
    const goodRow = await waitForTerminal(db.sql, good, 15_000);
    assert.equal(goodRow.status, "succeeded");
    assert.equal(goodRow.succeeded, 4);
    for (const refused of [byCheck, asData]) {
      assert.equal((await waitForTerminal(db.sql, refused, 15_000)).status, "failed");
      const [run] = await runsOf(refused);
      assert.equal(run?.error_code, "ANALYSIS_PROCESS_FAILED");
      assert.equal(run?.error_message, UNRECORDABLE_MESSAGE);
    }
    const transientRow = await waitForTerminal(db.sql, transient, 15_000);
    assert.equal(transientRow.status, "succeeded");
    assert.equal((await runsOf(transient))[0]?.attempt, 2);
    // And what comes after is recorded.
    const later = await createTask(db.sql, owner, "refuse-batch", 2, { maxAttempts: 1 });
    assert.equal((await waitForTerminal(db.sql, later, 15_000)).succeeded, 2);
  } finally {
    release();
    try {
      await stopWithin(w);
    } finally {
      await db.sql.unsafe(`
        drop trigger test_refuse_as_data on runs;
        drop function test_refuse_as_data();
        alter table runs drop constraint test_refused_by_check;`);
    }
  }
});

/**
 * `n` runs of `type` (one attempt each) that succeed, held until all have started; then `arm()` (a
 * refusal set up by the caller's trigger) and their release. Every run is awaited to its end and the
 * worker stopped, `cleanup` run in any case. Returns the task's row and the runs given up.
 */
async function succeedThrough(
  type: string,
  n: number,
  arm: () => Promise<unknown>,
  cleanup: string,
): Promise<{ taskId: string; row: Awaited<ReturnType<typeof waitForTerminal>>; discarded: number[] }> {
  let release: () => void = () => {};
  const gate = new Promise<void>((r) => {
    release = r;
  });
  const discarded: number[] = [];
  const w = worker(
    {
      [type]: async () => {
        await gate;
        return { status: "succeeded" };
      },
    },
    {
      onDiscard: async (run) => {
        discarded.push(run.id);
      },
    },
  );
  try {
    const taskId = await createTask(db.sql, owner, type, n, { maxAttempts: 1 });
    await w.start();
    await waitFor(
      async () =>
        (await db.sql`select 1 from runs where task_id = ${taskId} and status in ('starting', 'running')`)
          .length === n,
      10_000,
      `all ${n} runs to start`,
    );
    await arm();
    release();
    return { taskId, row: await waitForTerminal(db.sql, taskId, 15_000), discarded };
  } finally {
    release();
    try {
      await stopWithin(w);
    } finally {
      await db.sql.unsafe(cleanup);
    }
  }
}

test("a batch refused for the server's sake (a full NOTIFY queue: 54000) is retried whole until it is written", async () => {
  // A window of refusals no outcome is to blame for, as PostgreSQL raises when its NOTIFY queue is full
  // (every completion notifies): blamed, a success was recorded failed after two refusals, and one
  // longer outage gave every outcome of the batch up (a review).
  await db.sql.unsafe(`
    create table test_refusal_window (until timestamptz);
    insert into test_refusal_window values (clock_timestamp() + interval '1 hour');
    create function test_refuse_for_a_while() returns trigger language plpgsql as $$
      begin
        if clock_timestamp() < (select until from test_refusal_window) then
          raise exception 'too many notifications in the NOTIFY queue' using errcode = '54000';
        end if;
        return new;
      end $$;
    create trigger test_refuse_for_a_while before update on runs for each row
      when (new.status in ('succeeded', 'failed') and new.analysis_type = 'refuse-window')
      execute function test_refuse_for_a_while();`);
  const { row, discarded } = await succeedThrough(
    "refuse-window",
    4,
    // Refused from here for 2.5 s: two or three flushes a second apart.
    () => db.sql`update test_refusal_window set until = clock_timestamp() + interval '2.5 seconds'`,
    `drop trigger test_refuse_for_a_while on runs;
     drop function test_refuse_for_a_while();
     drop table test_refusal_window;`,
  );
  assert.equal(row.status, "succeeded");
  assert.equal(row.succeeded, 4);
  assert.deepEqual(discarded, [], "no outcome given up");
});

test("a constraint's refusal right after an outage's is not taken for a second one: the outcome is recorded as it was", async () => {
  // Every refusal used to count toward blaming the batch: one for the server's sake (here 54000) and
  // then one constraint violation that does not recur recorded a success as failed.
  await db.sql.unsafe(`
    create table test_mixed_armed (armed boolean not null);
    insert into test_mixed_armed values (false);
    create sequence test_mixed_refusals;
    create function test_refuse_mixed() returns trigger language plpgsql as $$
      declare n bigint;
      begin
        if not (select armed from test_mixed_armed) then return new; end if;
        n := nextval('test_mixed_refusals');
        if n = 1 then raise exception 'too many notifications in the NOTIFY queue' using errcode = '54000'; end if;
        if n = 2 then raise exception 'a passing conflict' using errcode = '23505'; end if;
        return new;
      end $$;
    create trigger test_refuse_mixed before update on runs for each row
      when (new.status in ('succeeded', 'failed') and new.analysis_type = 'refuse-mixed')
      execute function test_refuse_mixed();`);
  const { taskId, row, discarded } = await succeedThrough(
    "refuse-mixed",
    1,
    () => db.sql`update test_mixed_armed set armed = true`,
    // Read before the sequence is dropped.
    `drop trigger test_refuse_mixed on runs;
     drop function test_refuse_mixed();`,
  );
  const [seq] = await db.sql<{ n: string }[]>`select last_value::text as n from test_mixed_refusals`;
  const refusals = seq?.n;
  await db.sql.unsafe("drop sequence test_mixed_refusals; drop table test_mixed_armed;");
  assert.equal(refusals, "3", "refused twice, then written");
  assert.equal(row.status, "succeeded");
  assert.deepEqual(discarded, []);
  const [run] = await db.sql<RunRow[]>`select status, error_code from runs where task_id = ${taskId}`;
  assert.equal(run?.status, "succeeded");
  assert.equal(run?.error_code, null);
});

test("runs the next owner's claim took start when the fair claim after it fails", async () => {
  let failFair = false;
  // The pool, with the fair claim's statement (claimStatement's) made to fail on demand, as a dropped
  // connection would.
  const sql = new Proxy(db.sql, {
    apply(target, thisArg, args) {
      const strings = args[0] as TemplateStringsArray | undefined;
      const head = Array.isArray(strings) ? String(strings[0]).trim() : "";
      if (failFair && head.startsWith("with walk as materialized")) {
        return Promise.reject(
          Object.assign(new Error("connection terminated (injected)"), { code: "57P01" }),
        );
      }
      return Reflect.apply(target, thisArg, args);
    },
  }) as typeof db.sql;
  const started: number[] = [];
  const w = new Worker({
    sql,
    logger: createLogger({ level: "silent" }),
    types: {
      "turn-loss": {
        handler: async (run) => {
          started.push(run.id);
          return { status: "succeeded" };
        },
      },
    },
    concurrency: 2,
    leaseTtlMs: 60_000,
    pollIntervalMs: 100_000,
    retryBaseMs: 50,
  });
  try {
    const owners = await Promise.all(["A", "B", "C", "D"].map((n) => seedUser(db.sql, `turn-loss-${n}`)));
    const tasks: string[] = [];
    for (const o of owners) tasks.push(await createTask(db.sql, o, "turn-loss", 1, { maxAttempts: 1 }));
    // Cycle 1: the sole owner's claim finds several owners, the fair claim serves A and B; their no-op
    // runs give the type a short mean, so the next claim's quantum is the whole claim.
    assert.equal(await w.runOnce(), 2);
    await waitForTerminal(db.sql, tasks[0] as string, 10_000);
    await waitForTerminal(db.sql, tasks[1] as string, 10_000);
    // Cycle 2: the next owner's claim takes C's one run (fewer than k = 2), the fair claim for the
    // rest fails. C's run is placed and started all the same.
    failFair = true;
    const claimed = await w.runOnce();
    failFair = false;
    assert.equal(claimed, 1);
    const c = await waitForTerminal(db.sql, tasks[2] as string, 10_000);
    assert.equal(c.status, "succeeded");
    const [cRun] = await db.sql<{ id: number; attempt: number }[]>`
      select id::float8 as id, attempt from runs where task_id = ${tasks[2] as string}`;
    assert.ok(started.includes(cRun?.id as number));
    assert.equal(cRun?.attempt, 1);
  } finally {
    failFair = false;
    await stopWithin(w);
  }
});

test("a progress flush that fails is written by the next: the run is marked running, its last report kept", async () => {
  // The first write of this type's `running` mark fails (a dropped connection, a failover); the
  // sequence counts outside the failed transaction. The flush used to drop what it had taken, so a
  // program that reported nothing more left its run `starting` and its task `queued` until it ended.
  await db.sql`create sequence progress_fails`;
  await db.sql`
    create function progress_fails_once() returns trigger language plpgsql as $$
    begin
      if new.analysis_type = 'progress-lost' and old.status = 'starting' and new.status = 'running'
         and nextval('progress_fails') = 1 then
        raise exception 'injected: the progress write fails once';
      end if;
      return new;
    end $$`;
  await db.sql`create trigger progress_fails_once before update on runs
    for each row execute function progress_fails_once()`;
  let release = () => {};
  const gate = new Promise<void>((r) => {
    release = r;
  });
  const w = worker(
    {
      "progress-lost": async (_run, ctx) => {
        ctx.reportProgress(40, "half way: ünïcode");
        await gate; // a program that reports nothing more for a while
        return { status: "succeeded", result: {} };
      },
    },
    { concurrency: 1, progressFlushMs: 50 },
  );
  try {
    const taskId = await createTask(db.sql, owner, "progress-lost", 1);
    await w.start();
    await waitFor(
      async () => (await db.sql`select is_called from progress_fails`)[0]?.is_called === true,
      10_000,
      "the first progress write to fail",
    );
    await waitFor(
      async () => {
        const [run] = await db.sql`select status from runs where task_id = ${taskId}`;
        return run?.status === "running";
      },
      5000,
      "the run to be marked running by a later flush",
    );
    const [run] = await db.sql`
      select progress, message from runs where task_id = ${taskId}`;
    assert.deepEqual({ ...run }, { progress: 40, message: "half way: ünïcode" });
    const [task] =
      await db.sql`select status, started_at is not null as started from tasks where id = ${taskId}`;
    assert.deepEqual({ ...task }, { status: "running", started: true });
    const [failed] = await db.sql`select last_value::int as n from progress_fails`;
    assert.ok((failed?.n ?? 0) >= 2, "the write failed once, then was made again");
    release();
    await waitForTerminal(db.sql, taskId);
  } finally {
    release();
    await w.stop();
    await db.sql`drop trigger progress_fails_once on runs`;
    await db.sql`drop function progress_fails_once()`;
  }
});

test("a late heartbeat answer about a run's old lease leaves its new attempt alone", async () => {
  let releaseFirst: () => void = () => {};
  const firstGate = new Promise<void>((r) => {
    releaseFirst = r;
  });
  let stopL: () => void = () => {};
  const lDone = new Promise<void>((r) => {
    stopL = r;
  });
  const reasons: unknown[] = [];
  let secondStarted = false;
  let hbAnswered: Promise<void> = new Promise(() => {});
  const aborted = (signal: AbortSignal) => new Promise((r) => signal.addEventListener("abort", r));
  const w = worker(
    {
      "hb-stale": async (run, ctx) => {
        if (run.inputName === "L") {
          await Promise.race([lDone, aborted(ctx.signal)]);
          return { status: "succeeded" };
        }
        if (run.attempt === 1) {
          await firstGate;
          return { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true };
        }
        secondStarted = true;
        // Runs until the heartbeat's answer has come (or it is aborted, as it was).
        await Promise.race([hbAnswered, aborted(ctx.signal)]);
        reasons.push(ctx.signal.reason);
        return { status: "succeeded" };
      },
    },
    { concurrency: 2 },
  );
  const reserved = await db.sql.reserve();
  try {
    // L first (the lower id), then X; named before the worker can claim them.
    const tl = await createTask(db.sql, owner, "hb-stale", 1);
    await db.sql`update runs set input_name = 'L' where task_id = ${tl}`;
    const tx = await createTask(db.sql, owner, "hb-stale", 1, { maxAttempts: 3 });
    await db.sql`update runs set input_name = 'X' where task_id = ${tx}`;
    await w.start();
    await waitFor(
      async () =>
        (
          await db.sql`select 1 from runs where analysis_type = 'hb-stale' and status in ('starting', 'running')`
        ).length === 2,
      10_000,
      "both runs to start",
    );
    const [l] = await db.sql<{ id: string }[]>`select id::text from runs where task_id = ${tl}`;
    // Another transaction holds L's row (as a cancel of L's task does while it works): the heartbeat,
    // which locks its runs in id order, waits there before it reaches X.
    await reserved`begin`;
    await reserved`select id from runs where id = ${l?.id as string} for update`;
    const hb = w.heartbeat(); // asks about L and X's first lease
    hbAnswered = hb;
    await waitFor(
      async () =>
        (
          await db.sql`select 1 from pg_stat_activity
            where datname = current_database() and wait_event_type = 'Lock'
              and query like '%lease_expires_at = now()%'`
        ).length > 0,
      5_000,
      "the heartbeat to wait for L's row",
    );
    releaseFirst(); // X fails transiently: retried, claimed again here, attempt 2 starts
    await waitFor(async () => secondStarted, 10_000, "X's second attempt to start");
    await reserved`commit`;
    await hb;
    await waitFor(async () => reasons.length > 0, 10_000, "X's second attempt to end");
    assert.deepEqual(reasons, [undefined], "the second attempt ran to its end, not aborted");
    const task = await waitForTerminal(db.sql, tx, 10_000);
    assert.equal(task.status, "succeeded");
    assert.equal(task.succeeded, 1);
    const [x] = await runsOf(tx);
    assert.equal(x?.attempt, 2);
    assert.equal(x?.status, "succeeded");
  } finally {
    releaseFirst();
    stopL();
    await reserved`rollback`.catch(() => {});
    reserved.release();
    await stopWithin(w);
  }
});

test("stop() waits for a heartbeat in flight before it deletes the worker's row", async () => {
  let holdBeat = false;
  let releaseBeat: () => void = () => {};
  const beatHeld = new Promise<void>((r) => {
    releaseBeat = r;
  });
  // The worker's registration upsert of a heartbeat is held until the worker deletes its row, or
  // until stop() says it waits for that heartbeat: held past the delete, it would register the
  // worker again.
  const sql = new Proxy(db.sql, {
    apply(target, thisArg, args) {
      const strings = args[0] as TemplateStringsArray | undefined;
      const head = Array.isArray(strings) ? String(strings[0]).trim() : "";
      if (holdBeat && head.startsWith("with w as (") && head.includes("insert into workers")) {
        holdBeat = false;
        return beatHeld.then(() => Reflect.apply(target, thisArg, args));
      }
      if (head.startsWith("delete from workers")) {
        return (Reflect.apply(target, thisArg, args) as Promise<unknown>).finally(releaseBeat);
      }
      return Reflect.apply(target, thisArg, args);
    },
  }) as typeof db.sql;
  const destination = new Writable({
    write(chunk, _encoding, done) {
      if (String(chunk).includes("waiting for the heartbeat in flight")) releaseBeat();
      done();
    },
  });
  const w = new Worker({
    sql,
    logger: createLogger({ level: "debug", destination }),
    types: { "hb-stop": { handler: async () => ({ status: "succeeded" }) } },
    concurrency: 1,
    leaseTtlMs: 60_000,
    pollIntervalMs: 100,
    retryBaseMs: 50,
  });
  await w.start();
  const registered = async () => (await db.sql`select 1 from workers where id = ${w.id}`).length;
  assert.equal(await registered(), 1);
  holdBeat = true;
  const hb = w.heartbeat();
  await stopWithin(w);
  await hb;
  assert.equal(await registered(), 0, "no row of a worker that has stopped");
});

test("pgSafe() keeps what PostgreSQL can store, and copies nothing when there is nothing to change", () => {
  const clean = { a: "emoji 😀 and é", list: [1, "x", null], nested: { k: true } };
  assert.equal(pgSafe(clean), clean);
  assert.deepEqual(pgSafe({ "k\u0000ey": ["a\u0000b", "\ud83d", "\ude00x", "\ud83d\u0000\ude00"], n: 1 }), {
    key: ["ab", "\ufffd", "\ufffdx", "\ufffd\ufffd"],
    n: 1,
  });
});

test("a success's last progress message, reported within a flush interval of its end, is the run's message", async () => {
  const w = worker(
    {
      "last-words": async (_run, ctx) => {
        ctx.reportProgress(50, "drawing histograms");
        ctx.reportProgress(90, "report written ✓");
        return { status: "succeeded", result: {} };
      },
      // A failure's too (its error says why; the message says how far it got).
      "last-words-failed": async (_run, ctx) => {
        ctx.reportProgress(30, "reading «input»");
        return { status: "failed", errorCode: "ANALYSIS_DATA_INVALID", errorMessage: "no numeric column" };
      },
    },
    // No flush comes before the end: until 2026-12-07 the run kept no message (or an earlier one's).
    { concurrency: 1, progressFlushMs: 60_000 },
  );
  try {
    const ok = await createTask(db.sql, owner, "last-words", 1);
    const failed = await createTask(db.sql, owner, "last-words-failed", 1);
    await w.start();
    await waitForTerminal(db.sql, ok);
    await waitForTerminal(db.sql, failed);
    const [run] = await db.sql`select status, progress, message from runs where task_id = ${ok}`;
    assert.deepEqual({ ...run }, { status: "succeeded", progress: 100, message: "report written ✓" });
    assert.equal((await runsOf(failed))[0]?.message, "reading «input»");
  } finally {
    await stopWithin(w);
  }
});
