// Fair share (the rotation the claim serves owners in): queue_owners has a row per analysis type,
// priority and owner with queued runs, and `pass`, how many runs the owner has been given at that
// level. The claim takes the owners with the lowest pass first, and at the same pass the one that
// reached it first (`since`); a newcomer starts at the lowest pass of the owners with runs due (see
// queueOwnersJoin), so it is served after those already waiting there, one turn each, without a
// burst — and a stream of newcomers cannot keep an owner with a backlog waiting. The table only
// orders claims: every run is claimed from `runs`, so a stale row can make a claim less fair, never
// lose a run.
//
// Rows come and go safely: every statement that makes a run queued (create, retry, reaper) upserts
// its owner's row with DO UPDATE, which waits for a row lock; queueOwnersPrune locks rows first (skip
// locked) and decides in a second statement, whose snapshot post-dates the lock, that an owner has
// nothing queued. A run made queued concurrently is either seen by that statement, or its upsert
// waits for the delete and inserts the row again.
//
// Lock order: queue_owners rows are locked in owner order by every statement that locks several.
import type { PendingQuery, Row } from "postgres";
import type { Sql } from "../../db/client.ts";

/** A task's priority when none is given: 0 runs first, 9 last. */
export const DEFAULT_PRIORITY = 5;
export const PRIORITIES = { min: 0, max: 9 } as const;

/** How many of a level's lowest-pass owners a create probes for a run due (see queueOwnersJoin). */
export const JOIN_PROBE = 64;

/**
 * A data-modifying statement for a WITH clause: `rows` yields (analysis_type, priority, owner_id)
 * triples, distinct. Each owner joins the rotation at the level's current pass, with `since` now
 * (after the owners that reached that pass before); an owner whose row is still there keeps it,
 * raised to that pass if it had fallen behind.
 *
 * The current pass, with `due` (a create): the lowest pass among the JOIN_PROBE lowest-pass owners
 * that have a run due now, else the lowest of all, else 0. A row whose owner has nothing due (its
 * queue emptied and the reaper has not pruned the row yet; only runs in backoff) stops advancing, and
 * a newcomer that joined at its pass was served ahead of every active owner until it caught up — a
 * whole claim per turn, for as many runs as the others had been given meanwhile. The probe is
 * bounded (JOIN_PROBE owners, an index lookup each, as the claim's walk does). Without `due` (runs put
 * back by a retry or the reaper, whose statements hold run and task locks): the lowest of all, no
 * probe — the owner had a row a moment ago, so it is rarely joining at all.
 */
export function queueOwnersJoin(sql: Sql, rows: PendingQuery<Row[]>, { due = true } = {}) {
  const lowestDue = due
    ? sql`(select o.pass
           from (select p.pass, p.owner_id from queue_owners p
                 where p.analysis_type = j.analysis_type and p.priority = j.priority
                 order by p.pass
                 limit ${sql.unsafe(String(JOIN_PROBE))}) o
           where exists (select 1 from runs e
                         where e.status = 'queued' and e.analysis_type = j.analysis_type
                           and e.owner_id = o.owner_id and e.priority = j.priority
                           and e.run_after <= now())
           order by o.pass
           limit 1),`
    : sql``;
  return sql`
    insert into queue_owners as q (analysis_type, priority, owner_id, pass, since)
    select j.analysis_type, j.priority, j.owner_id,
           coalesce(
             ${lowestDue}
             (select min(o.pass) from queue_owners o
              where o.analysis_type = j.analysis_type and o.priority = j.priority),
             0),
           statement_timestamp()
    from (select distinct * from (${rows}) x(analysis_type, priority, owner_id)) j
    order by j.owner_id, j.analysis_type, j.priority
    on conflict (analysis_type, priority, owner_id) do update
      set pass = greatest(q.pass, excluded.pass),
          since = case when excluded.pass > q.pass then excluded.since else q.since end
    returning q.owner_id`;
}

/**
 * For a statement that puts runs back in the queue (a CTE `requeued` with analysis_type, priority,
 * owner_id and task_id) after countIntoTasks: their owners are back in the rotation (they may have left
 * it). It reads `locked`, so it runs after the task locks: every statement locks runs, then tasks,
 * then queue_owners. Defines `rejoined`.
 */
export function requeuedRejoin(sql: Sql) {
  return sql`rejoined as (${queueOwnersJoin(
    sql,
    sql`select analysis_type, priority, owner_id from requeued where task_id in (select id from locked)`,
    { due: false },
  )})`;
}

/**
 * Deletes up to `limit` rows whose owner has nothing queued at their level. Two statements: the
 * rows are locked first, then judged by a snapshot taken after the lock (see the top of this file).
 */
export async function queueOwnersPrune(sql: Sql, limit = 500): Promise<number> {
  return sql.begin(async (tx) => {
    const idle = await tx<{ analysis_type: string; priority: number; owner_id: string }[]>`
      select q.analysis_type, q.priority, q.owner_id::text from queue_owners q
      where not exists (select 1 from runs r where r.status = 'queued' and r.analysis_type = q.analysis_type
                          and r.owner_id = q.owner_id and r.priority = q.priority)
      order by q.owner_id
      limit ${limit}
      for update skip locked`;
    if (idle.length === 0) return 0;
    const rows = await tx`
      delete from queue_owners q
      using jsonb_to_recordset(${tx.json(idle)}) as i(analysis_type text, priority int, owner_id bigint)
      where q.analysis_type = i.analysis_type and q.priority = i.priority and q.owner_id = i.owner_id
        and not exists (select 1 from runs r where r.status = 'queued' and r.analysis_type = q.analysis_type
                          and r.owner_id = q.owner_id and r.priority = q.priority)
      returning 1`;
    return rows.length;
  });
}
