// Fair share (the rotation the claim serves owners in): queue_owners has a row per analysis type,
// priority and owner with queued runs, and `pass`, how many runs the owner has been given at that
// level. The claim takes the owners with the lowest pass first, and at the same pass the one that
// reached it first (`since`); a newcomer starts at the highest pass, the back of the line (see
// queueOwnersJoin), so it is served after those already waiting there, one turn each, without a
// burst — and a stream of newcomers cannot keep an owner with a backlog waiting. The table only
// orders claims: every run is claimed from `runs`, so a stale row can make a claim less fair, never
// lose a run.
//
// Rows come and go safely: every statement that makes a run queued (create, retry, reaper) upserts
// its owner's row with DO UPDATE, which waits for a row lock; queueOwnersPrune locks rows first (skip
// locked) and decides in a second statement, whose snapshot post-dates the lock, that an owner has
// nothing queued (queueOwnersPruneIdle does the same for one type). A run made queued concurrently
// is either seen by that statement, or its upsert waits for the delete and inserts the row again.
// After a claim, queueOwnersTidy also deletes rows the claim walked past with nothing queued: there
// the upsert's `version` bump is what protects a row whose owner got runs after the walk's snapshot.
//
// Lock order: queue_owners rows are locked in owner order by every statement that locks several.
import type { PendingQuery, Row } from "postgres";
import type { Sql } from "../../db/client.ts";
import { commitMode } from "./shared.ts";

/** A task's priority when none is given: 0 runs first, 9 last. */
export const DEFAULT_PRIORITY = 5;
export const PRIORITIES = { min: 0, max: 9 } as const;

/**
 * One row, `queued`, when the owner of the queue_owners row `q` has a run queued at the row's type and
 * priority (due or not), else none: one probe of runs_claim_idx, whose order with LIMIT 1 keeps the
 * planner on that index — as EXISTS or NOT EXISTS, with statistics taken when the queue was empty, it
 * scanned every queued run per row (110 ms a claim beside 60 rows).
 */
export function ownerQueued(sql: Sql) {
  return sql`select 1 as queued from runs r
    where r.status = 'queued' and r.analysis_type = q.analysis_type
      and r.owner_id = q.owner_id and r.priority = q.priority
    order by r.turn, r.id
    limit 1`;
}

/**
 * A data-modifying statement for a WITH clause: `rows` yields (analysis_type, priority, owner_id)
 * triples, distinct; each owner joins the rotation with `since` now, after the owners already waiting
 * at its pass, or keeps its row.
 *
 * Where it joins: at the highest pass of its level — the back of the line, after every owner already
 * waiting, as deficit round robin appends a newly active flow to its list. The claim serves the lowest
 * pass first, so no owner is more than about a turn ahead of the rest, and the newcomer waits at most
 * a round. Rows whose passes stopped below (nothing due: a queue that has just emptied, only runs in
 * backoff; held at the per-user limit) cannot pull it down, however they were served since. Four rules
 * before this one let a newcomer in too low (found in review, 2026-12-03; fair-share.test.ts has each
 * case): the lowest pass of every row started it below the owners being served, and it took every slot
 * until it caught up; three anchored on the rows served last, which could be stopped rows served again
 * at their old passes (up to a newcomer taking 20 of 20 claims, or every newcomer of a stream stacking
 * below an owner with a backlog).
 *
 * An owner that already has a row keeps its place while it has a run due at that level (by this
 * statement's snapshot, which sees neither the runs this statement inserts nor a run it puts back):
 * it is waiting for its turn, and lifting it to the back of the line whenever it queued more let a
 * user who submits steadily be passed over every round (0 of 30 claims). An owner with nothing due is
 * lifted to the join pass like a newcomer (its pass had stopped while the others moved on). A row
 * below the rotation with runs queued is raised after the claims meanwhile (queueOwnersTidy), so
 * keeping its place never keeps it far behind. `version` goes up on every upsert: see
 * queueOwnersTidy.
 */
export function queueOwnersJoin(sql: Sql, rows: PendingQuery<Row[]>) {
  return sql`
    insert into queue_owners as q (analysis_type, priority, owner_id, pass, since)
    select j.analysis_type, j.priority, j.owner_id,
           coalesce((select max(n.pass) from queue_owners n
                     where n.analysis_type = j.analysis_type and n.priority = j.priority), 0),
           statement_timestamp()
    from (select distinct * from (${rows}) x(analysis_type, priority, owner_id)) j
    order by j.owner_id, j.analysis_type, j.priority
    on conflict (analysis_type, priority, owner_id) do update set
      -- Always a new version: a claim that found the owner with nothing queued (by a snapshot taken
      -- before these runs) must not delete the row (queueOwnersTidy).
      version = q.version + 1,
      (pass, since) = (
        select case when d.due then q.pass else greatest(q.pass, excluded.pass) end,
               case when not d.due and excluded.pass > q.pass then excluded.since else q.since end
        from (select exists (select 1 from runs r
                             where r.status = 'queued' and r.analysis_type = q.analysis_type
                               and r.owner_id = q.owner_id and r.priority = q.priority
                               and r.run_after <= now()) as due) d)
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
 * Deletes up to `limit` rows whose owner has nothing queued at their level (the reaper's prune). Two
 * statements: the rows are locked first, then judged by a snapshot taken after the lock (see the top
 * of this file). Each row is judged by one index probe (ownerQueued), not NOT EXISTS. Commits
 * asynchronously: a prune lost in a crash only leaves rows the next prune removes.
 */
export function queueOwnersPrune(sql: Sql, limit = 500): Promise<number> {
  return pruneIdleRows(sql, null, limit);
}

/**
 * queueOwnersPrune for one analysis type, for a worker that found rows there whose owner has nothing
 * queued beside an owner alone (runClaimSole then claims nothing), so that its next claim is the sole
 * owner's again. Returns how many rows went.
 */
export function queueOwnersPruneIdle(sql: Sql, analysisType: string, limit = 1000): Promise<number> {
  return pruneIdleRows(sql, analysisType, limit);
}

async function pruneIdleRows(sql: Sql, analysisType: string | null, limit: number): Promise<number> {
  return sql.begin(async (tx) => {
    const t = tx as unknown as Sql;
    // The transaction's commit mode, set in the first statement (no round trip of its own).
    const idle = await tx<{ analysis_type: string; priority: number; owner_id: string }[]>`
      select q.analysis_type, q.priority, q.owner_id::text from queue_owners q
      left join lateral (${ownerQueued(t)}) x on true
      where ${commitMode(t, false)} and x.queued is null
        ${analysisType === null ? tx`` : tx`and q.analysis_type = ${analysisType}`}
      order by q.owner_id
      limit ${limit}
      for update of q skip locked`;
    if (idle.length === 0) return 0;
    const rows = await tx`
      delete from queue_owners q
      using jsonb_to_recordset(${tx.json(idle)}) as i(analysis_type text, priority int, owner_id bigint)
      where q.analysis_type = i.analysis_type and q.priority = i.priority and q.owner_id = i.owner_id
        and (${ownerQueued(t)}) is null
      returning 1`;
    return rows.length;
  });
}
