// The reaper's statements (DESIGN §4.7).
import type { Sql } from "../../db/client.ts";
import { requeuedRejoin } from "./fair.ts";
import { countIntoTasks, inLive, MAX_BACKOFF_MS, WAKEUP_CHANNEL } from "./shared.ts";

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
      select id, status, attempt, max_attempts, analysis_type, owner_id from runs
      where status ${inLive(sql)} and lease_expires_at < now()
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
      returning r.id, r.task_id, r.attempt, r.error_code, r.run_after, r.analysis_type, r.priority, r.owner_id,
        false as refunded
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
    ${countIntoTasks(sql, true)},
    ${requeuedRejoin(sql)},
    -- Each run reaped frees room under a limit: its type's (global) and its owner's in every type
    -- (per user). Workers that found the room taken wait for a wake-up or their poll, so they are
    -- woken as a completion wakes them (runWakeOwnersTypes), at commit. Reaps are rare, so this is
    -- sent whether or not a limit is set.
    woken as (
      select pg_notify(${WAKEUP_CHANNEL}, w.analysis_type)
      from (
        select e.analysis_type from expired e
        union
        select q.analysis_type from queue_owners q where q.owner_id in (select e.owner_id from expired e)
      ) w
    )
    select (select count(*)::int from requeued) as requeued,
           (select count(*)::int from done where status = 'failed') as failed,
           (select count(*)::int from done where status = 'cancelled') as cancelled,
           (select count(*)::int from counted where finished) as "finishedTasks",
           (select count(*)::int from notified) as notified,
           (select count(*)::int from woken) as woken`;
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
