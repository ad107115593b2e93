// Reading the event mailbox (`task_events`).
import { isoTimeSql, type Sql } from "../db/client.ts";
import { TERMINAL_TASK_STATUSES } from "../tasks/states.ts";

export interface TaskEvent {
  id: string;
  taskId: string;
  runId: string | null;
  type: string;
  data: Record<string, unknown>;
  createdAt: string;
}

/**
 * Events of a task after `afterId` (exclusive), in numeric id order. Every column is qualified: an
 * ORDER BY name matches an output column before a table column, and `id::text` is output as `id`,
 * so `order by id` here once sorted the page as text (…, 99, 100 came out as 100, …, 99).
 */
export async function eventsAfter(
  sql: Sql,
  taskId: string,
  afterId: string | null,
  limit: number,
): Promise<TaskEvent[]> {
  return sql<TaskEvent[]>`
    select e.id::text as id, e.task_id::text as "taskId", e.run_id::text as "runId", e.type, e.data,
           ${isoTimeSql(sql, "e.created_at")} as "createdAt"
    from task_events e
    where e.task_id = ${taskId} ${afterId ? sql`and e.id > ${afterId}` : sql``}
    order by e.id
    limit ${limit}`;
}

/** The event types that close a task: a stream ends after sending one. */
const FINAL_EVENTS: ReadonlySet<string> = new Set(TERMINAL_TASK_STATUSES.map((s) => `task.${s}`));
export const isFinalEvent = (e: TaskEvent) => FINAL_EVENTS.has(e.type);

/**
 * Whether `id` is one of the task's events: a client's Last-Event-ID (or a log's `after`) that names
 * none is a position the table does not know — most likely one from before the database was restored
 * from an older backup, whose event ids are being handed out again — and events after it by number
 * are not the events after what the client saw. One lookup by the primary key.
 */
export async function isTaskEvent(sql: Sql, taskId: string, id: string): Promise<boolean> {
  const [row] = await sql<{ known: boolean }[]>`
    select exists (select 1 from task_events e where e.id = ${id} and e.task_id = ${taskId}) as known`;
  return row?.known === true;
}
