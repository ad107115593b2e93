// Ending attempts: completion with last-child-wins counters, retries, and cancelling queued runs
// (DESIGN §4.5–4.6).
import type { Sql } from "../../db/client.ts";
import type { TerminalRunStatus } from "../../tasks/states.ts";
import { byId, countIntoTasks, type Json, type Lease, matchesLease, notifyEvents } from "./shared.ts";

export interface Outcome extends Lease {
  status: TerminalRunStatus;
  errorCode?: string | null;
  errorMessage?: string | null;
  result?: Record<string, unknown> | null;
}

export interface CompletionResult {
  /** Runs whose outcome was recorded and counted. */
  completed: number[];
  /** Tasks that turned terminal in this statement. */
  finishedTasks: { taskId: number; status: string }[];
}

/**
 * Completes finished attempts in one statement (DESIGN §4.5): fenced run updates, their outcomes
 * added to their tasks' counters (aggregated per task), and a task flipped terminal when its
 * counters reach its total — the same path for every outcome. A run that did not match was fenced
 * off: nothing is counted for it, and the caller discards its output.
 */
export async function runComplete(sql: Sql, outcomes: Outcome[]): Promise<CompletionResult> {
  if (outcomes.length === 0) return { completed: [], finishedTasks: [] };
  const input = byId(outcomes).map((o) => ({
    id: o.id,
    token: o.token,
    status: o.status,
    error_code: o.errorCode ?? null,
    error_message: o.errorMessage ?? null,
    result: o.result ?? null,
  }));
  const [row] = await sql<
    { completed: number[] | null; finished: CompletionResult["finishedTasks"] | null }[]
  >`
    with i as (
      select * from jsonb_to_recordset(${sql.json(input as unknown as Json)})
        as i(id bigint, token uuid, status text, error_code text, error_message text, result jsonb)
    ),
    done as (
      update runs r set
        status = i.status,
        finished_at = now(),
        error_code = i.error_code,
        error_message = i.error_message,
        result = i.result,
        progress = case when i.status = 'succeeded' then 100 else r.progress end,
        lease_token = null,
        lease_owner = null,
        lease_expires_at = null
      from i
      where ${matchesLease(sql)}
        -- only a cancelling run may end cancelled (the state guard would reject the whole batch)
        and (i.status <> 'cancelled' or r.status = 'cancelling')
      returning r.id, r.task_id, r.status, r.attempt, r.error_code
    ),
    ${countIntoTasks(sql)}
    select (select json_agg(id::float8) from done) as completed,
           (select json_agg(json_build_object('taskId', id::float8, 'status', status))
              from counted where finished) as finished,
           (select count(*) from notified) as notified`;
  return { completed: row?.completed ?? [], finishedTasks: row?.finished ?? [] };
}

export interface Retry extends Lease {
  delayMs: number;
  /** Give the attempt back (shutdown): the run does not use up an attempt. */
  refund: boolean;
  errorCode: string | null;
  errorMessage: string | null;
}

/**
 * Puts attempts back in the queue (DESIGN §4.6): transient failures with attempts left (after a
 * backoff), and attempts aborted by a shutdown (refunded). Fenced; counts nothing. Returns the runs
 * that matched.
 */
export async function runRetry(sql: Sql, retries: Retry[]): Promise<number[]> {
  if (retries.length === 0) return [];
  const input = byId(retries).map((r) => ({
    id: r.id,
    token: r.token,
    delay_ms: Math.max(0, Math.round(r.delayMs)),
    refund: r.refund,
    error_code: r.errorCode,
    error_message: r.errorMessage,
  }));
  const rows = await sql<{ id: number }[]>`
    with requeued as (
      update runs r set
        status = 'queued',
        run_after = now() + i.delay_ms * interval '1 millisecond',
        attempt = r.attempt - (case when i.refund then 1 else 0 end),
        error_code = i.error_code,
        error_message = i.error_message,
        lease_token = null, lease_owner = null, lease_expires_at = null, heartbeat_at = null
      from jsonb_to_recordset(${sql.json(input as unknown as Json)})
        as i(id bigint, token uuid, delay_ms int, refund boolean, error_code text, error_message text)
      where r.id = i.id and r.lease_token = i.token and r.status in ('starting', 'running')
      returning r.id, r.task_id, r.attempt, r.error_code, r.run_after
    ),
    locked as materialized (
      select id from tasks where id in (select task_id from requeued) order by id for update
    ),
    events as (
      insert into task_events (task_id, run_id, type, data)
      select task_id, id, 'run.retry',
             jsonb_build_object('status', 'queued', 'attempt', attempt, 'errorCode', error_code, 'runAfter', run_after)
      from requeued where task_id in (select id from locked)
      order by id
      returning id, task_id, run_id, type, data, created_at
    ),
    ${notifyEvents(sql)}
    select id::float8 as id, (select count(*) from notified) as notified from requeued`;
  return rows.map((r) => r.id);
}

/** Ends a task's queued runs as cancelled, counted like any other ending. Returns how many. */
export async function runCancelQueued(sql: Sql, taskId: string): Promise<number> {
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
    ${countIntoTasks(sql)}
    select (select count(*)::int from done) as n, (select count(*) from notified) as notified`;
  return row?.n ?? 0;
}
