// Worker registration and wake-ups.
import type { Sql } from "../../db/client.ts";
import { INT8_OID, WAKEUP_CHANNEL } from "./shared.ts";

/** A type a worker cannot run, and why ("Rscript not found"). */
export interface TypeUnavailable {
  type: string;
  reason: string;
}

export interface WorkerInfo {
  id: string;
  host: string;
  pid: number;
  analysisTypes: string[];
  concurrency: number;
  /** Types this worker cannot run, with the reason it logged at start. */
  unavailable?: TypeUnavailable[];
}

/**
 * A worker row counts as live while its heartbeat is younger than this many lease TTLs: the reaper
 * deletes older rows, and GET /api/analysis-types judges availability by the same rule.
 */
export const WORKER_STALE_TTLS = 3;

/** How old a worker's heartbeat may be for it to count as live, for a lease TTL. */
export const workerStaleMs = (leaseTtlMs: number) => leaseTtlMs * WORKER_STALE_TTLS;

/** Registers (or re-registers) a worker and records that its types are served. */
export async function workerRegister(sql: Sql, w: WorkerInfo): Promise<void> {
  const unavailable = (w.unavailable ?? []).map((u) => ({ type: u.type, reason: u.reason }));
  await sql`
    with w as (
      insert into workers (id, host, pid, analysis_types, concurrency, unavailable)
      values (${w.id}, ${w.host}, ${w.pid}, ${w.analysisTypes}::text[], ${w.concurrency},
              ${sql.json(unavailable)})
      on conflict (id) do update set heartbeat_at = now(), analysis_types = excluded.analysis_types,
        concurrency = excluded.concurrency, unavailable = excluded.unavailable
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

export interface TypeAvailability {
  type: string;
  /** Live workers that offer the type. */
  workers: number;
  /** Live workers in all. */
  liveWorkers: number;
  /** The distinct reasons live workers gave for not offering it, with how many gave each. */
  reasons: { reason: string; workers: number }[];
}

/**
 * For each of `types`, the live workers (heartbeat younger than `staleMs`, as the reaper judges) that
 * offer it and the reasons of those that do not. One statement; the workers table holds a row per
 * worker process, so it is small.
 */
export async function workerTypeAvailability(
  sql: Sql,
  types: readonly string[],
  staleMs: number,
): Promise<TypeAvailability[]> {
  return sql<TypeAvailability[]>`
    with live as materialized (
      select w.analysis_types, w.unavailable from workers w
      where w.heartbeat_at >= now() - ${staleMs} * interval '1 millisecond'
    )
    select ty.type,
           (select count(*)::int from live where ty.type = any(live.analysis_types)) as workers,
           (select count(*)::int from live) as "liveWorkers",
           coalesce((
             select json_agg(json_build_object('reason', u.reason, 'workers', u.n) order by u.reason)
             from (
               select x ->> 'reason' as reason, count(*)::int as n
               from live, jsonb_array_elements(live.unavailable) x
               where x ->> 'type' = ty.type and jsonb_typeof(x -> 'reason') = 'string'
               group by 1
             ) u
           ), '[]'::json) as reasons
    from unnest(${[...types]}::text[]) with ordinality as ty(type, ord)
    order by ty.ord`;
}

/** Wakes workers that can run `analysisType` (delivered at commit when called in a transaction). */
export async function runWake(sql: Sql, analysisType: string): Promise<void> {
  await sql`select pg_notify(${WAKEUP_CHANNEL}, ${analysisType})`;
}

/**
 * Wakes, in one statement, the workers of `types` and of every type in which the owners of these
 * tasks have a queue_owners row (runs queued, or a row not yet pruned after they were all claimed:
 * then a claim finds nothing): under a per-user limit a run that ends frees room for its owner in
 * every type, and a worker of another type whose claim found the owner at the limit waits for a
 * wake-up (or its poll). One notification per type, sent at commit.
 */
export async function runWakeOwnersTypes(sql: Sql, types: readonly string[], taskIds: readonly number[]) {
  await sql`
    select pg_notify(${WAKEUP_CHANNEL}, w.analysis_type)
    from (
      select unnest(${sql.array([...types])}::text[]) as analysis_type
      union
      select q.analysis_type from queue_owners q
      where q.owner_id in (select t.owner_id from tasks t where t.id = any(${sql.array([...taskIds], INT8_OID)}::bigint[]))
    ) w`;
}
