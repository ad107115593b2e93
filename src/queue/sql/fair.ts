// Fair share (the rotation the claim serves owners in): queue_owners has a row per analysis type,
// priority and owner with queued runs, and `pass`, how many runs the owner has been given at that
// level. The claim takes the owners with the lowest pass first, and at the same pass the one that
// reached it first (`since`); a newcomer starts at the lowest pass of those already waiting, so it is
// served after those already waiting there, one turn each, without a burst (but see queueOwnersJoin's
// known hole) — and a stream of newcomers cannot keep an owner with a backlog waiting. The table only
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

/**
 * A data-modifying statement for a WITH clause: `rows` yields (analysis_type, priority, owner_id)
 * triples, distinct; each owner joins the rotation at the lowest pass of its level with `since` now
 * (after the owners that reached that pass before), or keeps its row.
 *
 * Known hole: a row whose owner has nothing due (its queue emptied and the reaper has not pruned the
 * row yet; only runs in backoff) stops advancing, and a newcomer joining at its pass is served ahead of
 * the active owners until it catches up. Taking the lowest pass among owners with a run due instead
 * (an EXISTS probe per owner, even bounded to the 64 lowest) made the create statement slow enough to
 * triple B's pickup under A's drain (bench/queue.ts pickup:fair p50 6 → 20 ms), so it was not kept.
 */
export function queueOwnersJoin(sql: Sql, rows: PendingQuery<Row[]>) {
  return sql`
    insert into queue_owners as q (analysis_type, priority, owner_id, pass, since)
    select j.analysis_type, j.priority, j.owner_id,
           coalesce((select min(o.pass) from queue_owners o
                     where o.analysis_type = j.analysis_type and o.priority = j.priority), 0),
           statement_timestamp()
    from (select distinct * from (${rows}) x(analysis_type, priority, owner_id)) j
    order by j.owner_id, j.analysis_type, j.priority
    on conflict (analysis_type, priority, owner_id) do update set pass = q.pass
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
