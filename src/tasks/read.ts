// Reading tasks and runs for the API: owner-scoped (admins see all), newest first, keyset pagination.
import type { Principal } from "../auth/tokens.ts";
import { isoTime, type Sql } from "../db/client.ts";
import { INT8_OID } from "../queue/sql.ts";
import { TERMINAL_TASK_STATUSES } from "./states.ts";

export interface TaskView {
  taskId: string;
  analysisType: string;
  status: string;
  totalCount: number;
  succeededCount: number;
  failedCount: number;
  timedOutCount: number;
  cancelledCount: number;
  /** Finished runs count 100, live runs their reported progress, queued runs 0. */
  progressPercent: number;
  parameters: Record<string, unknown>;
  createdAt: string;
  startedAt: string | null;
  finishedAt: string | null;
}

export interface RunView {
  runId: string;
  inputFileId: string;
  fileName: string;
  status: string;
  attempt: number;
  errorCode: string | null;
  errorMessage: string | null;
  progressPercent: number;
  metrics: Record<string, unknown> | null;
  startedAt: string | null;
  finishedAt: string | null;
}

const opt = (v: string | Date | null) => (v === null ? null : isoTime(v));

type TaskRow = Omit<TaskView, "createdAt" | "startedAt" | "finishedAt" | "progressPercent"> & {
  createdAt: string;
  startedAt: string | null;
  finishedAt: string | null;
  progressSum: number;
};

function taskView(r: TaskRow): TaskView {
  const { progressSum, ...rest } = r;
  const done = r.succeededCount + r.failedCount + r.timedOutCount + r.cancelledCount;
  const percent = done === r.totalCount ? 100 : Math.floor(progressSum / r.totalCount);
  return {
    ...rest,
    progressPercent: Math.min(100, percent),
    createdAt: isoTime(r.createdAt),
    startedAt: opt(r.startedAt),
    finishedAt: opt(r.finishedAt),
  };
}

/** The one visibility rule for tasks (alias `t`): an admin sees all, a user their own. */
export const visible = (sql: Sql, p: Principal) => sql`(${p.role === "admin"} or t.owner_id = ${p.userId})`;

/** Whether `p` may see task `taskId` (a cheap check: no progress, no runs read). */
export async function taskVisible(sql: Sql, p: Principal, taskId: string): Promise<boolean> {
  const rows = await sql`select 1 from tasks t where t.id = ${taskId} and ${visible(sql, p)}`;
  return rows.length === 1;
}

/** Which of `taskIds` exist and have not ended (no visibility check: callers made it). */
export async function tasksOpen(sql: Sql, taskIds: readonly string[]): Promise<Set<string>> {
  const rows = await sql<{ id: string }[]>`
    select t.id::text as id from tasks t
    where t.id = any(${sql.array([...taskIds], INT8_OID)}::bigint[])
      and t.status not in ${sql([...TERMINAL_TASK_STATUSES])}`;
  return new Set(rows.map((r) => r.id));
}

function taskSelect(sql: Sql) {
  return sql`
    t.id::text as "taskId", t.analysis_type as "analysisType", t.status, t.total_count as "totalCount",
    t.succeeded_count as "succeededCount", t.failed_count as "failedCount",
    t.timed_out_count as "timedOutCount", t.cancelled_count as "cancelledCount", t.parameters,
    t.created_at as "createdAt", t.started_at as "startedAt", t.finished_at as "finishedAt"`;
}

/** Progress of unfinished tasks needs their runs; finished tasks are 100 without reading them. */
function progressSum(sql: Sql) {
  return sql`case when t.finished_at is not null then 0 else
    (select coalesce(sum(case when r.status in ('succeeded','failed','timed_out','cancelled') then 100
                              else r.progress end), 0)::int
       from runs r where r.task_id = t.id) end as "progressSum"`;
}

export async function taskGet(sql: Sql, p: Principal, taskId: string): Promise<TaskView | undefined> {
  const [row] = await sql<TaskRow[]>`
    select ${taskSelect(sql)}, ${progressSum(sql)}
    from tasks t where t.id = ${taskId} and ${visible(sql, p)}`;
  return row && taskView(row);
}

export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

export async function taskList(
  sql: Sql,
  p: Principal,
  o: { status?: string; limit: number; cursor?: string },
): Promise<Page<TaskView>> {
  const rows = await sql<TaskRow[]>`
    select ${taskSelect(sql)}, ${progressSum(sql)}
    from tasks t
    where ${visible(sql, p)}
      ${o.status ? sql`and t.status = ${o.status}` : sql``}
      ${o.cursor ? sql`and t.id < ${o.cursor}` : sql``}
    order by t.id desc
    limit ${o.limit + 1}`;
  const items = rows.slice(0, o.limit).map(taskView);
  return { items, nextCursor: rows.length > o.limit ? (items.at(-1)?.taskId ?? null) : null };
}

/** Runs of a task visible to `p`, in id order; undefined when the task is not visible. */
export async function runList(
  sql: Sql,
  p: Principal,
  taskId: string,
  o: { limit: number; cursor?: string },
): Promise<Page<RunView> | undefined> {
  if (!(await taskVisible(sql, p, taskId))) return undefined;
  const rows = await sql<(RunView & { startedAt: string | null; finishedAt: string | null })[]>`
    select r.id::text as "runId", r.input_file_id::text as "inputFileId", r.input_name as "fileName",
           r.status, r.attempt, r.error_code as "errorCode", r.error_message as "errorMessage",
           r.progress as "progressPercent", r.result -> 'metrics' as metrics,
           r.started_at as "startedAt", r.finished_at as "finishedAt"
    from runs r
    where r.task_id = ${taskId} ${o.cursor ? sql`and r.id > ${o.cursor}` : sql``}
    order by r.id
    limit ${o.limit + 1}`;
  const items = rows
    .slice(0, o.limit)
    .map((r) => ({ ...r, startedAt: opt(r.startedAt), finishedAt: opt(r.finishedAt) }));
  return { items, nextCursor: rows.length > o.limit ? (items.at(-1)?.runId ?? null) : null };
}
