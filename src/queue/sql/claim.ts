// Claiming runs and keeping their leases (DESIGN §4.2–4.4).
import type { Sql } from "../../db/client.ts";
import { byId, inLive, type Json, type Lease, matchesLease, notifyEvents } from "./shared.ts";

/** Advisory-lock namespace of the per-type claim lock (the second key is hashtext(type)). */
const CLAIM_LOCK_NAMESPACE = 0x636c6169; // "clai"

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
  /** Seconds the run waited between becoming due (created, or its retry's run_after) and this claim. */
  waitedSeconds: number;
  /**
   * The run's previous attempt lost its lease (the reaper put it back): that attempt's worker may
   * have died and left its outputs behind.
   */
  afterLostLease: boolean;
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
 * Claims up to `limit` due runs of one type (DESIGN §4.2) and returns them with their task's
 * parameters. The claim writes run rows only: a task turns `running` when the first of its runs is
 * recorded running (runProgress) or ends after starting (countIntoTasks), so the claim — the path
 * from a NOTIFY to a started handler — does not lock and rewrite the task row as well.
 *
 * With a global limit, claims of the type are serialised by an advisory transaction lock, and the
 * number of live runs is counted after taking it: the count cannot be stale, so the limit cannot be
 * exceeded.
 *
 * A claim of a type without a global limit commits asynchronously (synchronous_commit off for that
 * one transaction): it does not wait for its WAL flush, which under load queues behind the
 * completions' flushes and was the longest part of the claim round trip. Losing a claim can only
 * happen when the database server itself crashes, and leaves the run queued as before: the worker's
 * next heartbeat or completion finds its lease unknown and abandons the attempt — the same path as a
 * reaped lease, so the run executes again and is counted once. A later synchronous commit (any
 * completion) makes every earlier claim durable, since WAL is flushed in order. A globally limited
 * claim stays durable: a lost claim would free a slot whose process still runs.
 */
export async function runClaim(sql: Sql, o: ClaimOptions): Promise<ClaimedRun[]> {
  if (o.limit <= 0) return [];
  if (o.globalLimit <= 0) return claimStatement(sql, o, o.limit, false);
  return sql.begin(async (tx): Promise<ClaimedRun[]> => {
    await tx`select pg_advisory_xact_lock(${CLAIM_LOCK_NAMESPACE}, hashtext(${o.analysisType}))`;
    // A separate statement: its snapshot is taken after the lock, so it sees every earlier claim.
    const [row] = await tx<{ live: number }[]>`
      select count(*)::int as live from runs
      where analysis_type = ${o.analysisType} and status ${inLive(tx)}`;
    const free = Math.min(o.limit, o.globalLimit - (row?.live ?? 0));
    return free > 0 ? claimStatement(tx as unknown as Sql, o, free, true) : [];
  });
}

// Written so that PostgreSQL can plan it once (see inLive): the limit is a literal — a parameter
// there makes the generic plan assume a tenth of the table and lose to a plan made per call, so the
// statement was re-planned on every claim (one prepared statement per distinct k, and k is at most
// concurrency + prefetch) — and the update finds its rows by primary key from an array. (While
// `runs` is young and its statistics say it is tiny, PostgreSQL still scans it sequentially here;
// after ANALYZE it is an index scan.)
function claimStatement(sql: Sql, o: ClaimOptions, k: number, durable = false): Promise<ClaimedRun[]> {
  if (!Number.isInteger(k) || k <= 0) throw new Error(`claim size must be a positive integer, got ${k}`);
  return sql<ClaimedRun[]>`
    with candidates as (
      select id from runs
      where status = 'queued' and analysis_type = ${o.analysisType} and run_after <= now()
      order by priority, id
      limit ${sql.unsafe(String(k))}
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
      where r.id = any(array(select id from candidates))
      returning r.id, r.task_id, r.analysis_type, r.attempt, r.max_attempts, r.lease_token,
                r.input_file_id, r.input_storage_key, r.input_name, r.input_size_bytes, r.input_sha256,
                r.run_after, r.error_code
    )
    select c.id::float8 as id, c.task_id::float8 as "taskId", c.analysis_type as "analysisType",
           c.attempt, c.max_attempts as "maxAttempts", c.lease_token::text as "leaseToken",
           c.input_file_id::float8 as "inputFileId", c.input_storage_key as "inputStorageKey",
           c.input_name as "inputName", c.input_size_bytes::float8 as "inputSizeBytes",
           c.input_sha256 as "inputSha256", t.parameters,
           extract(epoch from now() - c.run_after)::float8 as "waitedSeconds",
           c.error_code is not distinct from 'ANALYSIS_WORKER_UNAVAILABLE' as "afterLostLease"
    from claimed c join tasks t on t.id = c.task_id
    -- Always true; evaluated once. Sets how this statement's own transaction commits (see above);
    -- "durable" keeps the server's setting, whatever it is.
    where (select set_config('synchronous_commit',
             case when ${durable} then current_setting('synchronous_commit') else 'off' end, true)) is not null
    order by c.id`;
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
    with i as (
      select * from jsonb_to_recordset(${sql.json(byId(leases) as unknown as Json)}) as i(id bigint, token uuid)
    )
    update runs r set lease_expires_at = now() + ${leaseTtlMs} * interval '1 millisecond', heartbeat_at = now()
    from i
    where ${matchesLease(sql)}
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
  const input = byId(updates).map((u) => ({
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
      where ${matchesLease(sql)}
      returning r.id, r.task_id, r.status, r.attempt
    ),
    -- Events are inserted under their task's lock, so a task's event ids follow commit order.
    locked as materialized (
      select id from tasks where id in (select task_id from moved) order by id for update
    ),
    -- A task is running once one of its runs is (the claim leaves the task row alone).
    started as (
      update tasks t set status = 'running', started_at = coalesce(t.started_at, now()), updated_at = now()
      from locked l where t.id = l.id and t.status = 'queued'
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
