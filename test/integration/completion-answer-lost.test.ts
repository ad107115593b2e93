// A completion or retry statement that committed but whose answer was lost (a TCP proxy cuts the
// connection in place of the answer, after the server has done the work): the worker sends it again,
// that matches nothing (the lease token is gone), and it must tell its own earlier, recorded try from
// a lease someone else took — logged and counted as recorded, a success's outputs kept, a retried
// run woken when it is due, not left to the poll. Real PostgreSQL, real connections.
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createDatabase } from "../../src/db/client.ts";
import { createLogger } from "../../src/log.ts";
import type { AttemptOutcome, QueueObserver } from "../../src/queue/observer.ts";
import { Reaper } from "../../src/queue/reaper.ts";
import { type Handler, type HandlerOutcome, Worker } from "../../src/queue/worker.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import {
  createTask,
  idsCrossPowerOfTen,
  seedUser,
  taskRow,
  waitFor,
  waitForTerminal,
} from "../helpers/queue.ts";
import { startTcpProxy } from "../helpers/tcp-proxy.ts";

let db: TestDatabase;
let owner: Principal;

before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "ånswer «lost»'; drop table runs; --");
  // Ids across 10^9 and 10^8: the answers and lookups carry them as numbers.
  await db.sql`select setval(pg_get_serial_sequence('runs', 'id'), 999999000)`;
  await db.sql`select setval(pg_get_serial_sequence('tasks', 'id'), 99999000)`;
  await idsCrossPowerOfTen(db.sql, "runs", 2);
  await idsCrossPowerOfTen(db.sql, "tasks", 1);
});
after(async () => {
  await db.drop();
});

/**
 * A worker whose every connection goes through a proxy that, once armed with `cutOnce(marker)`, cuts
 * the connection in place of the next answer from the server carrying `marker` (never a
 * notification): the statement ran and committed, its answer never arrives (`cutSentOnce`: the
 * statement never arrives). Captures the worker's log lines, its observer's calls and its output
 * callbacks.
 */
async function lossyWorker(
  type: string,
  handler: Handler,
  extra: { concurrency: number; retryBaseMs?: number },
) {
  let marker: Buffer | undefined;
  let sent: Buffer | undefined;
  const proxy = await startTcpProxy(db.url, {
    fromServer: (chunk) => {
      // 'A': a NotificationResponse.
      if (!marker || chunk[0] === 0x41 || !chunk.includes(marker)) return "pass";
      marker = undefined;
      return "cut";
    },
    fromClient: (chunk) => {
      if (!sent || !chunk.includes(sent)) return "pass";
      sent = undefined;
      return "cut";
    },
  });
  const pool = createDatabase(proxy.url, { max: 4, applicationName: "assay-answer-lost" });
  const lines: { msg: string; runId?: number; answerLost?: boolean; status?: string }[] = [];
  const logger = createLogger({
    level: "info",
    destination: new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const line of chunk.toString().split("\n")) if (line) lines.push(JSON.parse(line));
        done();
      },
    }),
  });
  const ended: AttemptOutcome[] = [];
  const leasesLost: string[] = [];
  const observer: QueueObserver = {
    claimed() {},
    attemptLive() {},
    attemptEnded: (_type, outcome) => ended.push(outcome),
    leaseLost: (_type, how) => leasesLost.push(how),
    reaped() {},
  };
  const discarded: number[] = [];
  const recorded: [number, string | null][] = [];
  const w = new Worker({
    sql: pool.sql,
    logger,
    types: { [type]: { handler } },
    concurrency: extra.concurrency,
    leaseTtlMs: 60_000,
    // Nothing but a wake-up claims within a test's time: a run left to the poll waits a minute.
    pollIntervalMs: 60_000,
    retryBaseMs: extra.retryBaseMs ?? 10,
    completionDelayMs: 200,
    observer,
    onDiscard: async (run) => {
      discarded.push(run.id);
    },
    onRecorded: async (run, key) => {
      recorded.push([run.id, key]);
    },
  });
  return {
    w,
    lines,
    ended,
    leasesLost,
    discarded,
    recorded,
    cuts: () => proxy.cuts(),
    cutOnce: (m: string) => {
      marker = Buffer.from(m);
    },
    /** The next statement a client sends carrying `m` never reaches the server: the connection is cut. */
    cutSentOnce: (m: string) => {
      sent = Buffer.from(m);
    },
    close: async () => {
      await w.stop();
      // Ended at once: after a cut, pool.close() waited out its whole 5 s bound for a connection it
      // still counted busy (a fifth of this file's time). The worker has stopped; nothing is in flight
      // that a test still reads.
      await pool.sql.end({ timeout: 0 });
      await proxy.close();
    },
  };
}

test("a completion batch whose answer was lost after its commit: every outcome logged and counted as recorded, not fenced off; the success's outputs kept", async () => {
  const type = "lost-complétion";
  let release: () => void = () => {};
  const gate = new Promise<void>((r) => {
    release = r;
  });
  const outcomes = new Map<number, HandlerOutcome>();
  let started = 0;
  const x = await lossyWorker(
    type,
    async (run) => {
      started++;
      await gate;
      return outcomes.get(run.id) ?? { status: "failed", errorCode: "UNEXPECTED" };
    },
    { concurrency: 4 },
  );
  try {
    await x.w.start();
    const taskId = await createTask(db.sql, owner, type, 4, { maxAttempts: 1 });
    const runs = await db.sql<
      { id: string }[]
    >`select id::text from runs where task_id = ${taskId} order by runs.id`;
    const ids = runs.map((r) => Number(r.id));
    assert.deepEqual(ids, [999_999_998, 999_999_999, 1_000_000_000, 1_000_000_001]);
    const [withOutputs, bare, failed, timedOut] = ids as [number, number, number, number];
    const key = `${taskId}/${withOutputs}.1.x`;
    outcomes.set(withOutputs, { status: "succeeded", result: { n: 1, "clé «ü»": "v" }, outputKey: key });
    outcomes.set(bare, { status: "succeeded" });
    outcomes.set(failed, {
      status: "failed",
      errorCode: "ANALYSIS_DATA_ERROR",
      // What PostgreSQL cannot hold (a NUL, half a surrogate pair) is stored without: the look
      // compares what was stored.
      errorMessage: "colonne « prix »\u0000 introuvable ✗",
      result: { stderrTail: "ligne 3\n\uD800" },
    });
    outcomes.set(timedOut, { status: "timed_out", errorMessage: "trop long ⏱" });
    await waitFor(async () => started === 4, 10_000, "all four attempts started");
    // The completion's answer names the task it finished (json_build_object's layout; the events'
    // notifications carry the id quoted, and go to the listener's connection anyway).
    x.cutOnce(`"taskId" : ${taskId}, "status"`);
    release();
    const t = await waitForTerminal(db.sql, taskId, 10_000);
    await waitFor(
      async () =>
        x.lines.filter((l) => l.msg === "run finished" || l.msg.startsWith("run completion fenced off"))
          .length === 4,
      10_000,
      "the worker to settle its four outcomes",
    );
    assert.equal(x.cuts(), 1, "the completion's answer was lost");
    assert.deepEqual(
      { ...t },
      { status: "partially_succeeded", total: 4, succeeded: 2, failed: 1, timedOut: 1, cancelled: 0 },
    );
    assert.deepEqual(
      x.lines.filter((l) => l.msg.startsWith("run completion fenced off")),
      [],
      "nothing logged as fenced off",
    );
    assert.deepEqual(x.leasesLost, [], "no lease counted as lost");
    assert.deepEqual([...x.ended].sort(), ["failed", "succeeded", "succeeded", "timed_out"]);
    const finished = x.lines.filter((l) => l.msg === "run finished");
    assert.deepEqual(
      finished.map((l) => [l.runId, l.status, l.answerLost]).sort((a, b) => Number(a[0]) - Number(b[0])),
      [
        [withOutputs, "succeeded", true],
        [bare, "succeeded", true],
        [failed, "failed", true],
        [timedOut, "timed_out", true],
      ],
      "each outcome logged as recorded (by the try whose answer was lost)",
    );
    assert.deepEqual(x.discarded, [], "no attempt's outputs discarded");
    assert.deepEqual(
      x.recorded.find(([id]) => id === withOutputs),
      [withOutputs, key],
      "the success's outputs recorded as the run's",
    );
    const rows = await db.sql<{ id: string; status: string; output_key: string | null; attempt: number }[]>`
      select id::text, status, output_key, attempt from runs where task_id = ${taskId} order by runs.id`;
    assert.deepEqual(
      rows.map((r) => [Number(r.id), r.status, r.output_key, r.attempt]),
      [
        [withOutputs, "succeeded", key, 1],
        [bare, "succeeded", null, 1],
        [failed, "failed", null, 1],
        [timedOut, "timed_out", null, 1],
      ],
    );
    const [events] = await db.sql<{ endings: number; closing: number }[]>`
      select count(*) filter (where type like 'run.%')::int as endings,
             count(*) filter (where type like 'task.%' and type <> 'task.queued')::int as closing
      from task_events where task_id = ${taskId}`;
    assert.deepEqual({ ...events }, { endings: 4, closing: 1 }, "each ending recorded once");
  } finally {
    release();
    await x.close();
  }
});

test("a retry whose answer was lost after its commit: logged and counted as re-queued, not fenced off, and the run claimed again when due, not at the poll", async () => {
  const type = "lost-retrý";
  const attempts: number[] = [];
  const x = await lossyWorker(
    type,
    async (run) => {
      attempts.push(run.attempt);
      if (run.attempt === 1) {
        return {
          status: "failed",
          errorCode: "ANALYSIS_DEPENDENCY_FAILED",
          errorMessage: "dépendance « ext » injoignable",
          transient: true,
        };
      }
      return { status: "succeeded", result: { attempt: run.attempt } };
    },
    // A backoff (150–300 ms) that the claim made as the first attempt ends does not outlast: the
    // run is due again by the time the worker sends its retry again (a second later).
    { concurrency: 1, retryBaseMs: 300 },
  );
  try {
    await x.w.start();
    // Armed before the create: the first answer carrying the run's id in brackets is the retry's
    // (`requeued`, a JSON array; a claim returns ids as plain numbers).
    const [next] = await db.sql<{ id: string }[]>`
      select (last_value + 1)::text as id from runs_id_seq`;
    const runId = Number(next?.id);
    x.cutOnce(`[${runId}]`);
    const taskId = await createTask(db.sql, owner, type, 1, { maxAttempts: 3 });
    const [run] = await db.sql<{ id: string }[]>`select id::text from runs where task_id = ${taskId}`;
    assert.equal(Number(run?.id), runId, "the run's id as foreseen");
    // The poll is a minute away: only the worker's own wake-up for its retry claims it in time.
    const t = await waitForTerminal(db.sql, taskId, 15_000);
    assert.equal(x.cuts(), 1, "the retry's answer was lost");
    assert.equal(t.status, "succeeded");
    assert.deepEqual(attempts, [1, 2]);
    await waitFor(
      async () =>
        x.lines.some((l) => l.msg === "run finished") &&
        x.lines.some((l) => l.msg === "run re-queued" || l.msg.startsWith("run completion fenced off")),
      10_000,
      "the retry and the completion to be settled",
    );
    const requeued = x.lines.filter((l) => l.msg === "run re-queued");
    assert.deepEqual(
      requeued.map((l) => [l.runId, l.answerLost]),
      [[runId, true]],
      "the retry logged as re-queued (by the try whose answer was lost)",
    );
    assert.deepEqual(
      x.lines.filter((l) => l.msg.startsWith("run completion fenced off")),
      [],
      "nothing logged as fenced off",
    );
    assert.deepEqual(x.leasesLost, [], "no lease counted as lost");
    assert.deepEqual(x.ended, ["retried", "succeeded"]);
    assert.deepEqual(x.discarded, [], "nothing discarded");
    const [events] = await db.sql<{ retries: number; endings: number }[]>`
      select count(*) filter (where type = 'run.retry')::int as retries,
             count(*) filter (where type = 'run.succeeded')::int as endings
      from task_events where task_id = ${taskId}`;
    assert.deepEqual({ ...events }, { retries: 1, endings: 1 }, "the retry and the ending recorded once");
    const final = await taskRow(db.sql, taskId);
    assert.deepEqual(
      { ...final },
      { status: "succeeded", total: 1, succeeded: 1, failed: 0, timedOut: 0, cancelled: 0 },
    );
  } finally {
    await x.close();
  }
});

test("a retry whose statement never reached the server while the reaper took its lease back: the retry sent again is fenced off, not taken for its own", async () => {
  const type = "reaped-retrý";
  const attempts: number[] = [];
  let x: Awaited<ReturnType<typeof lossyWorker>> | undefined;
  x = await lossyWorker(
    type,
    async (run) => {
      attempts.push(run.attempt);
      if (run.attempt === 1) {
        // The retry statement carries the lease token: it is cut on its way to the server.
        x?.cutSentOnce(run.leaseToken);
        return {
          status: "failed",
          errorCode: "ANALYSIS_DEPENDENCY_FAILED",
          errorMessage: "dépendance « ext » injoignable",
          transient: true,
        };
      }
      return { status: "succeeded" };
    },
    { concurrency: 1 },
  );
  const reaper = new Reaper({
    sql: db.sql,
    logger: createLogger({ level: "silent" }),
    intervalMs: 60_000,
    leaseTtlMs: 60_000,
    // The run it puts back waits (30–60 s): still queued, as the retry would have left it, when the
    // worker looks.
    retryBaseMs: 60_000,
    workerWaitMs: 60_000,
  });
  try {
    await x.w.start();
    const taskId = await createTask(db.sql, owner, type, 1, { maxAttempts: 3 });
    await waitFor(async () => x?.cuts() === 1, 10_000, "the retry statement to be cut off");
    // Before the worker sends it again (a second later), the lease runs out and the reaper puts the
    // run back: queued at the same attempt, as the retry would have left it, with the reaper's code.
    await db.sql`update runs set lease_expires_at = now() - interval '1 second' where task_id = ${taskId}`;
    const pass = await reaper.runOnce();
    assert.equal(pass.requeued, 1, "the reaper put the run back");
    await waitFor(
      async () => x?.lines.some((l) => l.msg.startsWith("run completion fenced off")) ?? false,
      10_000,
      "the retry sent again to be settled",
    );
    const [queued] = await db.sql<{ status: string; attempt: number; error_code: string }[]>`
      select status, attempt, error_code from runs where task_id = ${taskId}`;
    assert.deepEqual(
      { ...queued },
      { status: "queued", attempt: 1, error_code: "ANALYSIS_WORKER_UNAVAILABLE" },
    );
    // Due now, and the worker told so: it runs the second attempt.
    await db.sql`update runs set run_after = now() where task_id = ${taskId}`;
    await db.sql`select pg_notify('assay_runs', ${type})`;
    const t = await waitForTerminal(db.sql, taskId, 15_000);
    assert.equal(t.status, "succeeded");
    assert.deepEqual(
      x.lines.filter((l) => l.msg.startsWith("run completion fenced off")).map((l) => l.runId),
      [Number((await db.sql<{ id: string }[]>`select id::text from runs where task_id = ${taskId}`)[0]?.id)],
      "the retry logged as fenced off",
    );
    assert.deepEqual(
      x.lines.filter((l) => l.msg === "run re-queued"),
      [],
      "not taken for a retry of its own",
    );
    assert.deepEqual(x.leasesLost, ["fenced"]);
    assert.deepEqual([...x.ended].sort(), ["lost", "succeeded"]);
    assert.deepEqual(attempts, [1, 2]);
    const final = await taskRow(db.sql, taskId);
    assert.deepEqual(
      { ...final },
      { status: "succeeded", total: 1, succeeded: 1, failed: 0, timedOut: 0, cancelled: 0 },
    );
  } finally {
    await reaper.stop();
    await x.close();
  }
});

test("a retry whose answer was lost, its run claimed again by another worker before the retry is sent again: logged and counted as re-queued, not fenced off", async () => {
  const type = "lost-retrý-reclaimed";
  const attempts: [string, number][] = [];
  const settled = () =>
    x.lines.some((l) => l.msg === "run re-queued" || l.msg.startsWith("run completion fenced off"));
  // Whichever worker runs the second attempt holds it until the first has settled its retry: the
  // run is live, one attempt on, when that looks.
  const second = async (who: string, run: { attempt: number }): Promise<HandlerOutcome> => {
    attempts.push([who, run.attempt]);
    await waitFor(async () => settled(), 10_000, "the retry sent again to be settled");
    return { status: "succeeded" };
  };
  const x = await lossyWorker(
    type,
    async (run) => {
      if (run.attempt > 1) return second("lossy", run);
      attempts.push(["lossy", run.attempt]);
      return {
        status: "failed",
        errorCode: "ANALYSIS_DEPENDENCY_FAILED",
        errorMessage: "dépendance « ext » injoignable",
        transient: true,
      };
    },
    { concurrency: 1 },
  );
  const other = new Worker({
    sql: db.sql,
    logger: createLogger({ level: "silent" }),
    types: { [type]: { handler: (run) => second("other", run) } },
    concurrency: 1,
    leaseTtlMs: 60_000,
    pollIntervalMs: 50,
    retryBaseMs: 10,
  });
  try {
    await x.w.start();
    const [next] = await db.sql<{ id: string }[]>`select (last_value + 1)::text as id from runs_id_seq`;
    const runId = Number(next?.id);
    x.cutOnce(`[${runId}]`);
    const taskId = await createTask(db.sql, owner, type, 1, { maxAttempts: 3 });
    await waitFor(async () => x.cuts() === 1, 10_000, "the retry's answer to be lost");
    await other.start();
    const t = await waitForTerminal(db.sql, taskId, 15_000);
    assert.equal(t.status, "succeeded");
    assert.equal(attempts.length, 2);
    assert.deepEqual(
      x.lines.filter((l) => l.msg === "run re-queued").map((l) => [l.runId, l.answerLost]),
      [[runId, true]],
      "the retry logged as re-queued (by the try whose answer was lost)",
    );
    assert.deepEqual(
      x.lines.filter((l) => l.msg.startsWith("run completion fenced off")),
      [],
      "nothing logged as fenced off",
    );
    assert.deepEqual(x.leasesLost, [], "no lease counted as lost");
    assert.equal(x.ended[0], "retried");
    const [events] = await db.sql<{ retries: number; endings: number }[]>`
      select count(*) filter (where type = 'run.retry')::int as retries,
             count(*) filter (where type = 'run.succeeded')::int as endings
      from task_events where task_id = ${taskId}`;
    assert.deepEqual({ ...events }, { retries: 1, endings: 1 });
  } finally {
    await other.stop();
    await x.close();
  }
});
