// Reading the event mailbox (`task_events`).
import { isoTime, type Sql } from "../db/client.ts";
import { TERMINAL_TASK_STATUSES } from "../tasks/states.ts";

export interface TaskEvent {
  id: string;
  taskId: string;
  runId: string | null;
  type: string;
  data: Record<string, unknown>;
  createdAt: string;
}

/** Events of a task after `afterId` (exclusive), in id order. */
export async function eventsAfter(
  sql: Sql,
  taskId: string,
  afterId: string | null,
  limit: number,
): Promise<TaskEvent[]> {
  const rows = await sql<(Omit<TaskEvent, "createdAt"> & { createdAt: Date })[]>`
    select id::text, task_id::text as "taskId", run_id::text as "runId", type, data, created_at as "createdAt"
    from task_events
    where task_id = ${taskId} ${afterId ? sql`and id > ${afterId}` : sql``}
    order by id
    limit ${limit}`;
  return rows.map((r) => ({ ...r, createdAt: isoTime(r.createdAt) }));
}

/** The event types that close a task: a stream ends after sending one. */
const FINAL_EVENTS: ReadonlySet<string> = new Set(TERMINAL_TASK_STATUSES.map((s) => `task.${s}`));
export const isFinalEvent = (e: TaskEvent) => FINAL_EVENTS.has(e.type);
