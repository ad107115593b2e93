// Retention's statement (the service is src/queue/retention.ts).
import type { Sql } from "../../db/client.ts";
import { TERMINAL_TASK_STATUSES } from "../../tasks/states.ts";

/**
 * Deletes up to `limit` terminal tasks finished more than `retentionDays` ago, oldest first — their
 * runs and events go with them (ON DELETE CASCADE). Safe to run everywhere at once (SKIP LOCKED).
 * Returns the ids of the tasks deleted.
 */
export async function taskDeleteExpired(sql: Sql, retentionDays: number, limit: number): Promise<string[]> {
  const rows = await sql<{ id: string }[]>`
    with due as (
      select id from tasks
      where status in ${sql(TERMINAL_TASK_STATUSES)}
        and finished_at < now() - ${retentionDays} * interval '1 day'
      order by finished_at
      limit ${limit}
      for update skip locked
    )
    delete from tasks t using due where t.id = due.id
    returning t.id::text`;
  return rows.map((r) => r.id);
}
