// Ending attempts: completion with last-child-wins counters, retries, and cancelling queued runs
// (DESIGN §4.5–4.6).
import type { Sql } from "../../db/client.ts";
import type { TerminalRunStatus } from "../../tasks/states.ts";
import { requeuedRejoin } from "./fair.ts";
import {
  byId,
  countIntoTasks,
  inLive,
  type Json,
  type Lease,
  matchesLease,
  pgSafe,
  WAKEUP_CHANNEL,
} from "./shared.ts";

export interface Outcome extends Lease {
  status: TerminalRunStatus;
  errorCode?: string | null;
  errorMessage?: string | null;
  result?: Record<string, unknown> | null;
  /** A success's output folder, relative to the outputs root (see runner/outputs.ts). */
  outputKey?: string | null;
  /**
   * Milliseconds since the attempt ended, when the statement is sent (an outcome may wait for company,
   * see Worker.queueOutcome): the run's finished_at is backdated by it. Absent: finished now.
   */
  endedMsAgo?: number;
  /**
   * The attempt's last progress message (a flush may not have written it: it came within a flush
   * interval of the end, or its flush failed): the run's message becomes it. Absent or null: the run
   * keeps its message.
   */
  message?: string | null;
}

export interface CompletionResult {
  /** Runs whose outcome was recorded and counted. */
  completed: number[];
  /** Tasks that turned terminal in this statement. */
  finishedTasks: { taskId: number; status: string }[];
}

/**
 * What an outcome writes into its run: runComplete sends it, and runEndingsRecorded compares a run
 * with it, so the two cannot drift apart.
 */
const endingOf = (o: Outcome) => ({
  status: o.status,
  error_code: o.errorCode ?? null,
  error_message: o.errorMessage ?? null,
  result: o.result ?? null,
  output_key: o.outputKey ?? null,
});

/**
 * Completes finished attempts in one statement (DESIGN §4.5): fenced run updates, their outcomes
 * added to their tasks' counters (aggregated per task), and a task flipped terminal when its
 * counters reach its total — the same path for every outcome. A run that did not match was fenced
 * off: nothing is counted for it, and the caller discards its output. Strings reach PostgreSQL through
 * pgSafe() (a NUL in a stderr tail or a metrics key refused the whole batch).
 */
export async function runComplete(sql: Sql, outcomes: Outcome[]): Promise<CompletionResult> {
  if (outcomes.length === 0) return { completed: [], finishedTasks: [] };
  const input = byId(outcomes).map((o) => ({
    id: o.id,
    token: o.token,
    ...endingOf(o),
    ended_ago_ms: Math.max(0, Math.round(o.endedMsAgo ?? 0)),
    message: o.message ?? null,
  }));
  const [row] = await sql<
    { completed: number[] | null; finished: CompletionResult["finishedTasks"] | null }[]
  >`
    with i as (
      select * from jsonb_to_recordset(${sql.json(pgSafe(input) as unknown as Json)})
        as i(id bigint, token uuid, status text, error_code text, error_message text, result jsonb,
             output_key text, ended_ago_ms bigint, message text)
    ),
    done as (
      update runs r set
        status = i.status,
        -- When the attempt ended, not when its outcome was written (it may have waited for company).
        finished_at = now() - i.ended_ago_ms * interval '1 millisecond',
        error_code = i.error_code,
        error_message = i.error_message,
        result = i.result,
        -- The fence decides publication: only the attempt whose completion matches names the outputs.
        output_key = i.output_key,
        progress = case when i.status = 'succeeded' then 100 else r.progress end,
        -- Its last report, when no flush wrote it: a success read "drawing histograms" for good.
        message = coalesce(i.message, r.message),
        lease_token = null,
        lease_owner = null,
        lease_expires_at = null
      from i
      where ${matchesLease(sql)}
        -- only a cancelling run may end cancelled (the state guard would reject the whole batch)
        and (i.status <> 'cancelled' or r.status = 'cancelling')
      returning r.id, r.task_id, r.status, r.attempt, r.error_code, r.started_at as run_started
    ),
    ${countIntoTasks(sql, false, { runStarts: true })}
    select (select json_agg(id::float8) from done) as completed,
           (select json_agg(json_build_object('taskId', id::float8, 'status', status))
              from counted where finished) as finished,
           (select count(*) from notified) as notified`;
  return { completed: row?.completed ?? [], finishedTasks: row?.finished ?? [] };
}

/** An ending this worker sent, for runEndingsRecorded: the outcome and the attempt it ended. */
export interface SentEnding extends Outcome {
  attempt: number;
}

/**
 * Which of these runs are already ended exactly as these outcomes would end them, by this attempt:
 * a completion that committed on an earlier try whose answer was lost (the connection dropped after
 * the commit) is recognised by it, since its lease token is gone from the row and the completion
 * itself no longer matches. Exact, not by the token: the run ended with the outcome's status, code,
 * message, result and output key (a success's key names the lease token) at the attempt's number.
 * No other writer leaves all of that: the reaper, a cancel of queued runs and a retry that finds its
 * run cancelling write messages of their own, and another attempt has another number — but for one
 * whose claim was lost in a server crash (the claim commits asynchronously), which that crash must
 * also have cut this completion's first try off for (see docs/architecture.md). Returns the run ids.
 */
export async function runEndingsRecorded(sql: Sql, endings: SentEnding[]): Promise<number[]> {
  if (endings.length === 0) return [];
  const input = endings.map((o) => ({ id: o.id, attempt: o.attempt, ...endingOf(o) }));
  const rows = await sql<{ id: number }[]>`
    select r.id::float8 as id
    from runs r join jsonb_to_recordset(${sql.json(pgSafe(input) as unknown as Json)})
      as i(id bigint, attempt int, status text, error_code text, error_message text, result jsonb,
           output_key text)
      on r.id = i.id
    where r.status = i.status and r.attempt = i.attempt
      and (r.error_code, r.error_message, r.result, r.output_key)
          is not distinct from (i.error_code, i.error_message, i.result, i.output_key)`;
  return rows.map((r) => r.id);
}

export interface Retry extends Lease {
  delayMs: number;
  /** Give the attempt back (shutdown): the run does not use up an attempt. */
  refund: boolean;
  errorCode: string | null;
  errorMessage: string | null;
}

export interface RetryResult {
  /** Runs put back in the queue. */
  requeued: number[];
  /**
   * Milliseconds until each requeued run is due (same order as `requeued`), by the database's clock
   * at the end of the statement: a wake-up armed from these is never early, however long the
   * statement took or however the worker's clock differs from the database's.
   */
  dueInMs: number[];
  /** Runs that were being cancelled: they end cancelled instead, counted like any other ending. */
  cancelled: number[];
  /** Tasks that turned terminal in this statement. */
  finishedTasks: { taskId: number; status: string }[];
}

/**
 * Puts attempts back in the queue (DESIGN §4.6): transient failures with attempts left (after a
 * backoff), and attempts aborted by a shutdown (refunded). Fenced; counts nothing for them. A run that
 * was marked `cancelling` meanwhile (its worker had not heard of the cancel yet) is not retried: it ends
 * `cancelled` at once, counted through the shared tail, instead of waiting for the reaper. The runs are
 * locked in id order first (`matched`), like every batch statement, so a retry cannot deadlock with a
 * cancel or another batch.
 */
export async function runRetry(sql: Sql, retries: Retry[]): Promise<RetryResult> {
  if (retries.length === 0) return { requeued: [], dueInMs: [], cancelled: [], finishedTasks: [] };
  const input = byId(retries).map((r) => ({
    id: r.id,
    token: r.token,
    delay_ms: Math.max(0, Math.round(r.delayMs)),
    refund: r.refund,
    error_code: r.errorCode,
    error_message: r.errorMessage,
  }));
  const [row] = await sql<
    {
      requeued: number[] | null;
      due: number[] | null;
      cancelled: number[] | null;
      finished: RetryResult["finishedTasks"] | null;
    }[]
  >`
    with i as (
      select * from jsonb_to_recordset(${sql.json(pgSafe(input) as unknown as Json)})
        as i(id bigint, token uuid, delay_ms int, refund boolean, error_code text, error_message text)
    ),
    matched as materialized (
      select r.id, r.status from runs r, i
      where ${matchesLease(sql)}
      order by r.id
      for update of r
    ),
    requeued as (
      update runs r set
        status = 'queued',
        run_after = now() + i.delay_ms * interval '1 millisecond',
        attempt = r.attempt - (case when i.refund then 1 else 0 end),
        error_code = i.error_code,
        error_message = i.error_message,
        lease_token = null, lease_owner = null, lease_expires_at = null, heartbeat_at = null
      from matched m join i on i.id = m.id
      where r.id = m.id and m.status <> 'cancelling'
      returning r.id, r.task_id, r.attempt, r.error_code, r.run_after, r.analysis_type, r.priority, r.owner_id,
        i.refund as refunded
    ),
    done as (
      update runs r set
        status = 'cancelled',
        error_code = 'ANALYSIS_PROCESS_CANCELLED',
        error_message = 'cancelled',
        finished_at = now(),
        lease_token = null, lease_owner = null, lease_expires_at = null
      from matched m
      where r.id = m.id and m.status = 'cancelling'
      returning r.id, r.task_id, r.status, r.attempt, r.error_code
    ),
    ${countIntoTasks(sql, true)},
    ${requeuedRejoin(sql)},
    -- Runs queued again due at once (a shutdown's, refunded) wake their types' workers at commit: the
    -- worker that gave them back is stopping, and the others heard nothing and waited for their poll.
    -- A retry after a backoff wakes nobody here (its own worker's timer claims it when it is due).
    woken as (
      select pg_notify(${WAKEUP_CHANNEL}, t.analysis_type)
      from (select distinct analysis_type from requeued where run_after <= now()) t
    )
    select (select json_agg(id::float8 order by id) from requeued) as requeued,
           (select json_agg(greatest(0, ceil(extract(epoch from run_after - clock_timestamp()) * 1000))::float8
                            order by id) from requeued) as due,
           (select json_agg(id::float8) from done) as cancelled,
           (select json_agg(json_build_object('taskId', id::float8, 'status', status))
              from counted where finished) as finished,
           (select count(*) from notified) as notified,
           (select count(*) from woken) as woken`;
  return {
    requeued: row?.requeued ?? [],
    dueInMs: row?.due ?? [],
    cancelled: row?.cancelled ?? [],
    finishedTasks: row?.finished ?? [],
  };
}

/** A retry this worker sent, for runRetriesRecorded: the retry and the attempt it gave back. */
export interface SentRetry extends Retry {
  attempt: number;
}

export interface RetriesRecorded {
  /** Runs this worker's earlier try put back in the queue, still queued or claimed again since. */
  requeued: number[];
  /**
   * Milliseconds until each of them is due (same order as `requeued`), as RetryResult's; null for a
   * run claimed again already (nothing to wake for).
   */
  dueInMs: (number | null)[];
  /** Runs that earlier try ended cancelled instead (they were being cancelled). */
  cancelled: number[];
}

/**
 * Which of these retries committed on an earlier try whose answer was lost (runRetry no longer
 * matches: the lease token is gone). Exact, not by the token: the run is queued at the number the
 * retry left it (one fewer when refunded) with the retry's code and message; or claimed again since,
 * one number later, the claim leaving code and message as they were; or ended `cancelled` at the
 * attempt's number with runRetry's own message. The reaper, which is the other way a lease is taken
 * back, writes a code and message of its own, and another attempt has another number — but for one
 * whose claim was lost in a server crash (see docs/architecture.md). A run re-queued, claimed again
 * and ended or re-queued again before the look is not recognised (its row no longer tells).
 */
export async function runRetriesRecorded(sql: Sql, retries: SentRetry[]): Promise<RetriesRecorded> {
  if (retries.length === 0) return { requeued: [], dueInMs: [], cancelled: [] };
  const input = retries.map((r) => ({
    id: r.id,
    left_at: r.attempt - (r.refund ? 1 : 0),
    attempt: r.attempt,
    error_code: r.errorCode,
    error_message: r.errorMessage,
  }));
  const rows = await sql<{ id: number; status: string; due: number | null }[]>`
    select r.id::float8 as id, r.status,
           case when r.status = 'queued'
             then greatest(0, ceil(extract(epoch from r.run_after - clock_timestamp()) * 1000))::float8 end as due
    from runs r join jsonb_to_recordset(${sql.json(pgSafe(input) as unknown as Json)})
      as i(id bigint, left_at int, attempt int, error_code text, error_message text)
      on r.id = i.id
    where (r.status = 'queued' and r.attempt = i.left_at
           and (r.error_code, r.error_message) is not distinct from (i.error_code, i.error_message))
       or (r.status ${inLive(sql)} and r.attempt = i.left_at + 1
           and (r.error_code, r.error_message) is not distinct from (i.error_code, i.error_message))
       or (r.status = 'cancelled' and r.attempt = i.attempt
           and r.error_code = 'ANALYSIS_PROCESS_CANCELLED' and r.error_message = 'cancelled')
    order by r.id`;
  const back = rows.filter((r) => r.status !== "cancelled");
  return {
    requeued: back.map((r) => r.id),
    dueInMs: back.map((r) => r.due),
    cancelled: rows.filter((r) => r.status === "cancelled").map((r) => r.id),
  };
}

/**
 * Ends a task's queued runs as cancelled, counted like any other ending, and returns how many. No
 * event per run: the caller records the number in an event of its own (taskCancel: `task.cancelling`'s
 * `cancelledQueued`), so it must already hold the runs' locks and pass the number it recorded as
 * `expected`; a different number throws, which rolls the caller's transaction back (the log would
 * otherwise disagree with the counters). One event per run was ~0.6 s of a 100,000-run cancel, and
 * as many SSE messages to every follower.
 */
export async function runCancelQueued(sql: Sql, taskId: string, expected: number): Promise<number> {
  const [row] = await sql<{ n: number }[]>`
    with done as (
      update runs r set
        status = 'cancelled',
        error_code = 'ANALYSIS_PROCESS_CANCELLED',
        error_message = 'cancelled before it started',
        finished_at = now()
      where r.task_id = ${taskId} and r.status = 'queued'
      returning r.id, r.task_id, r.status, r.attempt, r.error_code
    ),
    ${countIntoTasks(sql, false, { runEvents: false })}
    select (select count(*)::int from done) as n, (select count(*) from notified) as notified`;
  const n = row?.n ?? 0;
  if (n !== expected) throw new Error(`task ${taskId}: ${expected} queued runs recorded, ${n} ended`);
  return n;
}
