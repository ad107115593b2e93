// Cancelling a task (DESIGN §3, seed §9): one transaction marks the task `cancelling`, ends its queued
// runs at once (counted through the same tail as every other ending, recorded as one number in the
// `task.cancelling` event rather than an event per run), marks its live runs `cancelling`, and tells
// the workers. The owning worker kills the process group, waits for `close`,
// removes the partial output and completes the run `cancelled`; its heartbeat is the backstop for a
// missed NOTIFY, and the reaper ends the cancelling runs of a dead worker.
import type { Principal } from "../auth/tokens.ts";
import type { Sql } from "../db/client.ts";
import { CANCEL_CHANNEL, notifyEvents, runCancelQueued } from "../queue/sql.ts";
import { visible } from "./read.ts";
import { TERMINAL_TASK_STATUSES } from "./states.ts";

export type CancelResult =
  | { kind: "not-found" }
  | { kind: "finished"; status: string }
  | { kind: "cancelling"; status: string; cancelledQueued: number; cancellingLive: number };

export async function taskCancel(sql: Sql, p: Principal, taskId: string): Promise<CancelResult> {
  return sql.begin(async (tx): Promise<CancelResult> => {
    const [task] = await tx<{ status: string }[]>`
      select t.status from tasks t where t.id = ${taskId} and ${visible(tx as unknown as Sql, p)}`;
    if (!task) return { kind: "not-found" };
    if ((TERMINAL_TASK_STATUSES as readonly string[]).includes(task.status))
      return { kind: "finished", status: task.status };
    // Run rows first, then the task row: the same order as completions, so the two cannot deadlock.
    // Queued runs too (~60 ms for 66,000): runFailUnserved locks queued runs before their task, and
    // the update below would otherwise take them after the task row.
    // They stay locked to the end, so the queued ones counted here are the ones runCancelQueued ends.
    const [held] = await tx<{ queued: number }[]>`
      with held as materialized (
        select id, status from runs where task_id = ${taskId} and status in ('queued', 'starting', 'running')
        order by id for update
      )
      select count(*) filter (where status = 'queued')::int as queued from held`;
    const queued = held?.queued ?? 0;
    const [moved] = await tx<{ status: string }[]>`
      update tasks set status = 'cancelling', updated_at = now()
      where id = ${taskId} and status in ('queued', 'running') returning status`;
    if (!moved) {
      // Cancelled again, or finished meanwhile: report the state as it is.
      const [now] = await tx<{ status: string }[]>`select status from tasks where id = ${taskId}`;
      const status = now?.status ?? "cancelling";
      return (TERMINAL_TASK_STATUSES as readonly string[]).includes(status)
        ? { kind: "finished", status }
        : { kind: "cancelling", status, cancelledQueued: 0, cancellingLive: 0 };
    }
    const [marked] = await tx<{ live: number }[]>`
      with moved as (
        update runs set status = 'cancelling'
        where task_id = ${taskId} and status in ('starting', 'running')
        returning id, task_id, attempt
      ),
      -- The live runs' events first, then the task's, which also records the queued runs' endings as
      -- one number (runCancelQueued below ends them without an event each): a reader that applies the
      -- log in order knows every live run by then, so the runs it still has queued are exactly those.
      events as (
        insert into task_events (task_id, run_id, type, data)
        select task_id, run_id, type, data from (
          select task_id, id as run_id, 'run.cancelling' as type,
                 jsonb_build_object('status', 'cancelling', 'attempt', attempt) as data, 0 as ord, id as k
          from moved
          union all
          select ${taskId}::bigint, null, 'task.cancelling',
                 jsonb_build_object('status', 'cancelling', 'cancelledQueued', ${queued}::int), 1, 0
        ) e
        order by ord, k
        returning id, task_id, run_id, type, data, created_at
      ),
      ${notifyEvents(tx as unknown as Sql)}
      select (select count(*)::int from moved) as live, (select count(*) from notified) as notified`;
    const live = marked?.live ?? 0;
    // The same runs, still locked: the number cannot differ (runCancelQueued throws if it did).
    const cancelled = await runCancelQueued(tx as unknown as Sql, taskId, queued);
    if (live > 0) await tx`select pg_notify(${CANCEL_CHANNEL}, ${taskId})`;
    const [after] = await tx<{ status: string }[]>`select status from tasks where id = ${taskId}`;
    return {
      kind: "cancelling",
      status: after?.status ?? "cancelling",
      cancelledQueued: cancelled,
      cancellingLive: live,
    };
  });
}
