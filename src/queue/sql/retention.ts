// Retention's statements (the services are src/queue/retention.ts and src/queue/store-sweep.ts).
import type { Sql } from "../../db/client.ts";
import { TERMINAL_TASK_STATUSES } from "../../tasks/states.ts";
import { INT8_OID, type Json } from "./shared.ts";

/**
 * Deletes up to `limit` terminal tasks finished more than `retentionDays` ago, oldest first, and no
 * more of them than keeps their runs within `runBudget` (the oldest one goes whatever its size) — their
 * runs and events go with them (the trigger tasks_delete_children), so the statement's size follows the
 * runs it deletes, not the number of tasks: twenty tasks of 100,000 runs were two million runs and
 * their events in one transaction. Safe to run everywhere at once (SKIP LOCKED). Returns the ids of the
 * tasks deleted.
 */
export async function taskDeleteExpired(
  sql: Sql,
  retentionDays: number,
  limit: number,
  runBudget: number,
): Promise<string[]> {
  // Window functions cannot sit beside FOR UPDATE: the candidates are locked first, then picked. The
  // ones not picked stay locked only until this statement commits.
  const rows = await sql<{ id: string }[]>`
    with due as (
      select id, finished_at, total_count from tasks
      where status in ${sql(TERMINAL_TASK_STATUSES)}
        and finished_at < now() - ${retentionDays} * interval '1 day'
      order by finished_at
      limit ${limit}
      for update skip locked
    ), picked as (
      select id from (
        select id,
               row_number() over w as n,
               sum(total_count) over w as runs
        from due
        window w as (order by finished_at, id)
      ) c
      where n = 1 or runs <= ${runBudget}
    )
    delete from tasks t using picked where t.id = picked.id
    returning t.id::text`;
  return rows.map((r) => r.id);
}

/** Which of these file ids have a row (the store sweep keeps their objects). */
export async function fileIdsKnown(sql: Sql, ids: readonly string[]): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const rows = await sql<{ id: string }[]>`
    select f.id::text as id from files f where f.id = any(${sql.array([...ids], INT8_OID)}::bigint[])`;
  return new Set(rows.map((r) => r.id));
}

/** An output folder as its objects' keys name it: `<taskId>/<runId>` (before output keys) or an attempt's. */
export interface OutputFolder {
  /** `<taskId>/<folder>`, as runs.output_key would name it. */
  key: string;
  taskId: string;
  runId: string;
  /** The attempt's lease token; null for a folder of the old scheme (`<taskId>/<runId>`). */
  token: string | null;
}

/**
 * Which of these output folders a row still references: the run's recorded output, a run that
 * succeeded before output keys existed (the old scheme), or an attempt that still holds its lease (its
 * completion is still to come). Returns their keys.
 */
export async function outputFoldersReferenced(
  sql: Sql,
  folders: readonly OutputFolder[],
): Promise<Set<string>> {
  if (folders.length === 0) return new Set();
  const input = folders.map((f) => ({ key: f.key, task_id: f.taskId, run_id: f.runId, token: f.token }));
  const rows = await sql<{ key: string }[]>`
    select i.key
    from jsonb_to_recordset(${sql.json(input as unknown as Json)}) as i(key text, task_id bigint, run_id bigint, token uuid)
    where exists (
      select 1 from runs r
      where r.id = i.run_id and r.task_id = i.task_id
        and (r.output_key = i.key
             or (i.token is null and r.output_key is null and r.status = 'succeeded')
             or (i.token is not null and r.lease_token = i.token)))`;
  return new Set(rows.map((r) => r.key));
}
