// Every queue statement (DESIGN §4), one exported function each, named entity-first. Loops and
// services call these; they contain no SQL of their own.
//
// Locking order, everywhere: run rows first, then task rows in id order. A statement that touches
// several tasks locks them with `... order by id for update` before updating them, so two completers
// (or a completer and a reaper) can never deadlock on each other's tasks.
import type { Sql } from "../db/client.ts";
import { LIVE_RUN_STATUSES, type TerminalRunStatus } from "../tasks/states.ts";

/** Advisory-lock namespace of the per-type claim lock (the second key is hashtext(type)). */
const CLAIM_LOCK_NAMESPACE = 0x636c6169; // "clai"
/** Retry delays never exceed this. */
export const MAX_BACKOFF_MS = 5 * 60 * 1000;
/** Wake-up channel: the payload is the analysis type that has work. */
export const WAKEUP_CHANNEL = "assay_runs";
/** Cancel channel: the payload is a task id whose live runs were just marked cancelling. */
export const CANCEL_CHANNEL = "assay_cancel";
/** Event channel: `{taskId, events: [...]}`, or `{taskId, eventId}` when that would not fit. */
export const EVENTS_CHANNEL = "assay_events";
/** NOTIFY payloads must stay under 8000 bytes; above this the doorbell is sent instead. */
export const NOTIFY_MAX_BYTES = 7000;

const LIVE = LIVE_RUN_STATUSES as readonly string[];
/** Element type oid for sql.array() of bigint ids. */
export const INT8_OID = 20;

type Json = Parameters<Sql["json"]>[0];

export interface ClaimedRun {
  id: number;
  taskId: number;
  analysisType: string;
  attempt: number;
  maxAttempts: number;
  leaseToken: string;
  inputFileId: number;
  inputStorageKey: string;
  inputName: string;
  inputSizeBytes: number;
  inputSha256: string;
  parameters: Record<string, unknown>;
}

export interface ClaimOptions {
  workerId: string;
  analysisType: string;
  /** Most runs to claim. */
  limit: number;
  /** Global limit on live runs of the type across all workers; 0 = none. */
  globalLimit: number;
  leaseTtlMs: number;
}

/**
 * Claims up to `limit` due runs of one type (DESIGN §4.2), marks their tasks running, and returns
 * them with their task's parameters. With a global limit, claims of the type are serialised by an
 * advisory transaction lock, and the number of live runs is counted after taking it: the count
 * cannot be stale, so the limit cannot be exceeded.
 */
export async function runClaim(sql: Sql, o: ClaimOptions): Promise<ClaimedRun[]> {
  if (o.limit <= 0) return [];
  if (o.globalLimit <= 0) return claimStatement(sql, o, o.limit);
  return sql.begin(async (tx): Promise<ClaimedRun[]> => {
    await tx`select pg_advisory_xact_lock(${CLAIM_LOCK_NAMESPACE}, hashtext(${o.analysisType}))`;
    // A separate statement: its snapshot is taken after the lock, so it sees every earlier claim.
    const [row] = await tx<{ live: number }[]>`
      select count(*)::int as live from runs
      where analysis_type = ${o.analysisType} and status in ${tx(LIVE)}`;
    const free = Math.min(o.limit, o.globalLimit - (row?.live ?? 0));
    return free > 0 ? claimStatement(tx as unknown as Sql, o, free) : [];
  });
}

function claimStatement(sql: Sql, o: ClaimOptions, k: number): Promise<ClaimedRun[]> {
  return sql<ClaimedRun[]>`
    with candidates as (
      select id from runs
      where status = 'queued' and analysis_type = ${o.analysisType} and run_after <= now()
      order by priority, id
      limit ${k}
      for update skip locked
    ),
    claimed as (
      update runs r set
        status = 'starting',
        attempt = r.attempt + 1,
        lease_token = gen_random_uuid(),
        lease_owner = ${o.workerId},
        lease_expires_at = now() + ${o.leaseTtlMs} * interval '1 millisecond',
        heartbeat_at = now(),
        started_at = coalesce(r.started_at, now())
      from candidates c
      where r.id = c.id
      returning r.id, r.task_id, r.analysis_type, r.attempt, r.max_attempts, r.lease_token,
                r.input_file_id, r.input_storage_key, r.input_name, r.input_size_bytes, r.input_sha256
    ),
    to_start as materialized (
      select id from tasks
      where id in (select task_id from claimed) and status = 'queued'
      order by id
      for update
    ),
    started as (
      update tasks t set status = 'running', started_at = now(), updated_at = now()
      from to_start s where t.id = s.id
    )
    select c.id::float8 as id, c.task_id::float8 as "taskId", c.analysis_type as "analysisType",
           c.attempt, c.max_attempts as "maxAttempts", c.lease_token::text as "leaseToken",
           c.input_file_id::float8 as "inputFileId", c.input_storage_key as "inputStorageKey",
           c.input_name as "inputName", c.input_size_bytes::float8 as "inputSizeBytes",
           c.input_sha256 as "inputSha256", t.parameters
    from claimed c join tasks t on t.id = c.task_id
    order by c.id`;
}

export interface Lease {
  id: number;
  token: string;
}

/**
 * Extends the leases of a worker's live attempts (DESIGN §4.3). A run missing from the result has
 * been lost (reaped, or finished elsewhere); one returned as `cancelling` is to be cancelled.
 */
export function runHeartbeat(
  sql: Sql,
  leases: Lease[],
  leaseTtlMs: number,
): Promise<{ id: number; status: string }[]> {
  if (leases.length === 0) return Promise.resolve([]);
  return sql<{ id: number; status: string }[]>`
    update runs r set lease_expires_at = now() + ${leaseTtlMs} * interval '1 millisecond', heartbeat_at = now()
    from jsonb_to_recordset(${sql.json(leases as unknown as Json)}) as i(id bigint, token uuid)
    where r.id = i.id and r.lease_token = i.token and r.status in ${sql(LIVE)}
    returning r.id::float8 as id, r.status`;
}

export interface ProgressUpdate extends Lease {
  /** 0–100, or null to only record that the attempt is running. */
  progress: number | null;
  message?: string | null;
}

/**
 * Records that attempts are running (starting → running) and their latest progress, fenced by the
 * lease token, and appends `run.running` / `run.progress` events. Returns the runs that matched, with
 * their status.
 */
export function runProgress(sql: Sql, updates: ProgressUpdate[]): Promise<{ id: number; status: string }[]> {
  if (updates.length === 0) return Promise.resolve([]);
  const input = updates.map((u) => ({
    id: u.id,
    token: u.token,
    progress: u.progress,
    message: u.message ?? null,
  }));
  return sql<{ id: number; status: string }[]>`
    with i as (
      select * from jsonb_to_recordset(${sql.json(input as unknown as Json)})
        as i(id bigint, token uuid, progress int, message text)
    ),
    prev as (select r.id, r.status from runs r join i on i.id = r.id),
    moved as (
      update runs r set
        status = case when r.status = 'starting' then 'running' else r.status end,
        progress = coalesce(i.progress, r.progress)
      from i
      where r.id = i.id and r.lease_token = i.token and r.status in ${sql(LIVE)}
      returning r.id, r.task_id, r.status, r.attempt
    ),
    -- Events are inserted under their task's lock, so a task's event ids follow commit order.
    locked as materialized (
      select id from tasks where id in (select task_id from moved) order by id for update
    ),
    events as (
      insert into task_events (task_id, run_id, type, data)
      select task_id, run_id, type, data from (
        select m.task_id, m.id as run_id, 'run.running' as type,
               jsonb_build_object('status', 'running', 'attempt', m.attempt) as data, 0 as ord
        from moved m join prev p on p.id = m.id where p.status = 'starting'
        union all
        select m.task_id, m.id, 'run.progress',
               jsonb_strip_nulls(jsonb_build_object('percent', i.progress, 'message', i.message)), 1
        from moved m join i on i.id = m.id where i.progress is not null
      ) e
      where task_id in (select id from locked)
      order by run_id, ord
      returning id, task_id, run_id, type, data, created_at
    ),
    ${notifyEvents(sql)}
    select id::float8 as id, status, (select count(*) from notified) as notified from moved`;
}

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
  const input = outcomes.map((o) => ({
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
    with done as (
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
      from jsonb_to_recordset(${sql.json(input as unknown as Json)})
        as i(id bigint, token uuid, status text, error_code text, error_message text, result jsonb)
      where r.id = i.id and r.lease_token = i.token and r.status in ${sql(LIVE)}
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

/**
 * The tail shared by every statement that ends runs (completion, reaper): given a CTE `done`
 * (id, task_id, status, attempt, error_code) of runs that just turned terminal — and, with
 * `withRequeued`, a CTE `requeued` (id, task_id, attempt, error_code) of runs put back in the queue —
 * locks their tasks in id order, adds the outcomes to the counters, flips tasks whose counters reach
 * their total, appends the events and announces them. Defines `counted` (id, status, finished) and
 * `notified`.
 */
function countIntoTasks(sql: Sql, withRequeued = false) {
  return sql`
    agg as (
      select task_id,
        count(*) filter (where status = 'succeeded')::int as s,
        count(*) filter (where status = 'failed')::int as f,
        count(*) filter (where status = 'timed_out')::int as x,
        count(*) filter (where status = 'cancelled')::int as c
      from done group by task_id
    ),
    locked as materialized (
      select id from tasks
      where id in (select task_id from agg ${withRequeued ? sql`union select task_id from requeued` : sql``})
      order by id for update
    ),
    counted as (
      update tasks t set
        succeeded_count = t.succeeded_count + a.s,
        failed_count = t.failed_count + a.f,
        timed_out_count = t.timed_out_count + a.x,
        cancelled_count = t.cancelled_count + a.c,
        status = case
          when t.succeeded_count + a.s + t.failed_count + a.f + t.timed_out_count + a.x
               + t.cancelled_count + a.c < t.total_count then t.status
          when t.status = 'cancelling' then 'cancelled'
          when t.succeeded_count + a.s = t.total_count then 'succeeded'
          when t.failed_count + a.f = t.total_count then 'failed'
          when t.timed_out_count + a.x = t.total_count then 'timed_out'
          when t.cancelled_count + a.c = t.total_count then 'cancelled'
          when t.succeeded_count + a.s > 0 then 'partially_succeeded'
          else 'failed' end,
        finished_at = case
          when t.succeeded_count + a.s + t.failed_count + a.f + t.timed_out_count + a.x
               + t.cancelled_count + a.c = t.total_count then now()
          else t.finished_at end,
        updated_at = now()
      from agg a, locked l
      where t.id = a.task_id and l.id = a.task_id
      returning t.id, t.status,
        t.succeeded_count + t.failed_count + t.timed_out_count + t.cancelled_count = t.total_count as finished
    ),
    -- One insert, ordered, after the task locks (it reads counted and locked): a task's events
    -- get ids in commit order, and its closing event the largest.
    events as (
      insert into task_events (task_id, run_id, type, data)
      select task_id, run_id, type, data from (
        select task_id, id as run_id, 'run.' || status as type,
               jsonb_build_object('status', status, 'attempt', attempt, 'errorCode', error_code) as data,
               0 as ord, id as k
        from done
        ${
          withRequeued
            ? sql`union all
        select task_id, id, 'run.retry',
               jsonb_build_object('status', 'queued', 'attempt', attempt, 'errorCode', error_code), 0, id
        from requeued where task_id in (select id from locked)`
            : sql``
        }
        union all
        select id, null, 'task.' || status, jsonb_build_object('status', status), 1, id
        from counted where finished
      ) e
      order by ord, k
      returning id, task_id, run_id, type, data, created_at
    ),
    ${notifyEvents(sql)}`;
}

/**
 * Announces the rows of the CTE `events` on EVENTS_CHANNEL: one notification per task, carrying its
 * events when the payload fits in NOTIFY_MAX_BYTES, else only `{taskId, eventId}` (a doorbell: the
 * listener reads the table). Delivered at commit, so listeners never see an event that is not in the
 * table. An oversized batch can therefore never fail the statement. Defines `notified`.
 */
export function notifyEvents(sql: Sql) {
  return sql`
    notified as (
      select pg_notify(${EVENTS_CHANNEL},
        case when octet_length(p.full_payload) <= ${NOTIFY_MAX_BYTES} then p.full_payload
             else json_build_object('taskId', p.task_id::text, 'eventId', p.max_id::text)::text end)
      from (
        select task_id, max(id) as max_id,
               json_build_object('taskId', task_id::text, 'events', json_agg(json_build_object(
                 'id', id::text, 'taskId', task_id::text, 'runId', run_id::text, 'type', type,
                 'data', data, 'createdAt', created_at) order by id))::text as full_payload
        from events group by task_id
      ) p
    )`;
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
  const input = retries.map((r) => ({
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

export interface ReapOptions {
  batchSize: number;
  retryBaseMs: number;
  /** ASSAY_WORKER_WAIT_MS. */
  workerWaitMs: number;
}

export interface ReapResult {
  requeued: number;
  failed: number;
  cancelled: number;
  finishedTasks: number;
}

/**
 * Recovers live runs whose lease expired (DESIGN §4.7): back to `queued` with a backoff while attempts
 * are left, else `failed` with ANALYSIS_WORKER_UNAVAILABLE; expired `cancelling` runs end `cancelled`.
 * Terminal ones are counted through the same tail as completions. Safe to run in every worker at once.
 */
export async function runReapExpired(sql: Sql, o: ReapOptions): Promise<ReapResult> {
  const [row] = await sql<ReapResult[]>`
    with expired as (
      select id, status, attempt, max_attempts from runs
      where status in ${sql(LIVE)} and lease_expires_at < now()
      order by lease_expires_at
      limit ${o.batchSize}
      for update skip locked
    ),
    requeued as (
      update runs r set
        status = 'queued',
        run_after = now() + least(
          ${MAX_BACKOFF_MS}::float8,
          ${o.retryBaseMs}::float8 * power(2, greatest(r.attempt - 1, 0)) * (0.5 + random() / 2)
        ) * interval '1 millisecond',
        error_code = 'ANALYSIS_WORKER_UNAVAILABLE',
        error_message = 'the worker running this attempt stopped heartbeating',
        lease_token = null, lease_owner = null, lease_expires_at = null, heartbeat_at = null
      from expired e
      where r.id = e.id and e.status <> 'cancelling' and e.attempt < e.max_attempts
      returning r.id, r.task_id, r.attempt, r.error_code
    ),
    done as (
      update runs r set
        status = case when e.status = 'cancelling' then 'cancelled' else 'failed' end,
        error_code = case when e.status = 'cancelling' then 'ANALYSIS_PROCESS_CANCELLED'
                          else 'ANALYSIS_WORKER_UNAVAILABLE' end,
        error_message = case when e.status = 'cancelling' then 'cancelled; its worker stopped heartbeating'
                             else 'the worker running the last attempt stopped heartbeating' end,
        finished_at = now(),
        lease_token = null, lease_owner = null, lease_expires_at = null
      from expired e
      where r.id = e.id and (e.status = 'cancelling' or e.attempt >= e.max_attempts)
      returning r.id, r.task_id, r.status, r.attempt, r.error_code
    ),
    ${countIntoTasks(sql, true)}
    select (select count(*)::int from requeued) as requeued,
           (select count(*)::int from done where status = 'failed') as failed,
           (select count(*)::int from done where status = 'cancelled') as cancelled,
           (select count(*)::int from counted where finished) as "finishedTasks",
           (select count(*)::int from notified) as notified`;
  return row ?? { requeued: 0, failed: 0, cancelled: 0, finishedTasks: 0 };
}

/**
 * Fails queued runs of types that no live worker has advertised for ASSAY_WORKER_WAIT_MS, once they
 * have waited that long themselves (DESIGN §4.7). Types are found from unfinished tasks, so a large
 * backlog of a served type is never scanned.
 */
export async function runFailUnserved(sql: Sql, o: ReapOptions): Promise<ReapResult> {
  const [row] = await sql<ReapResult[]>`
    with stale_types as (
      select distinct t.analysis_type from tasks t
      left join analysis_type_seen s on s.analysis_type = t.analysis_type
      where t.status in ('queued', 'running')
        and (s.last_seen_at is null or s.last_seen_at < now() - ${o.workerWaitMs} * interval '1 millisecond')
    ),
    victims as (
      select r.id from runs r
      where r.status = 'queued'
        and r.analysis_type in (select analysis_type from stale_types)
        and r.created_at < now() - ${o.workerWaitMs} * interval '1 millisecond'
      order by r.id
      limit ${o.batchSize}
      for update of r skip locked
    ),
    done as (
      update runs r set
        status = 'failed',
        error_code = 'ANALYSIS_WORKER_UNAVAILABLE',
        error_message = 'no live worker can run this analysis type',
        finished_at = now()
      from victims v
      where r.id = v.id
      returning r.id, r.task_id, r.status, r.attempt, r.error_code
    ),
    ${countIntoTasks(sql)}
    select 0 as requeued, (select count(*)::int from done) as failed, 0 as cancelled,
           (select count(*)::int from counted where finished) as "finishedTasks",
           (select count(*)::int from notified) as notified`;
  return row ?? { requeued: 0, failed: 0, cancelled: 0, finishedTasks: 0 };
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

export interface WorkerInfo {
  id: string;
  host: string;
  pid: number;
  analysisTypes: string[];
  concurrency: number;
}

/** Registers (or re-registers) a worker and records that its types are served. */
export async function workerRegister(sql: Sql, w: WorkerInfo): Promise<void> {
  await sql`
    with w as (
      insert into workers (id, host, pid, analysis_types, concurrency)
      values (${w.id}, ${w.host}, ${w.pid}, ${w.analysisTypes}::text[], ${w.concurrency})
      on conflict (id) do update set heartbeat_at = now()
    )
    insert into analysis_type_seen (analysis_type, last_seen_at)
    select unnest(${w.analysisTypes}::text[]), now()
    on conflict (analysis_type) do update set last_seen_at = now()`;
}

/** The worker is alive: its row and its types' last-seen time move forward. */
export async function workerHeartbeat(sql: Sql, w: WorkerInfo): Promise<void> {
  await workerRegister(sql, w);
}

export async function workerDelete(sql: Sql, workerId: string): Promise<void> {
  await sql`delete from workers where id = ${workerId}`;
}

/** Deletes worker rows whose heartbeat is older than `staleMs`; returns how many. */
export async function workerDeleteStale(sql: Sql, staleMs: number): Promise<number> {
  const rows = await sql`
    delete from workers where heartbeat_at < now() - ${staleMs} * interval '1 millisecond' returning id`;
  return rows.length;
}

/** Wakes workers that can run `analysisType` (delivered at commit when called in a transaction). */
export async function runWake(sql: Sql, analysisType: string): Promise<void> {
  await sql`select pg_notify(${WAKEUP_CHANNEL}, ${analysisType})`;
}
