// Reading tasks and runs for the API: owner-scoped (admins see all), newest first, keyset pagination.
import type { Principal } from "../auth/tokens.ts";
import { isoTime, type Sql } from "../db/client.ts";
import { INT8_OID, inLive, workerTypeAvailability } from "../queue/sql.ts";
import { unavailableReason } from "./analysis-types.ts";
import { TERMINAL_TASK_STATUSES } from "./states.ts";

export interface TaskView {
  taskId: string;
  analysisType: string;
  /** The owner's user name. */
  owner: string;
  status: string;
  totalCount: number;
  succeededCount: number;
  failedCount: number;
  timedOutCount: number;
  cancelledCount: number;
  /** Finished runs count 100, live runs their reported progress, queued runs 0. */
  progressPercent: number;
  parameters: Record<string, unknown>;
  /** 0–9, lower first. */
  priority: number;
  /**
   * Where a queued task stands: about how many runs of others will start before its first, an
   * estimate (see taskQueueEstimates). Null unless the task is queued.
   */
  queue: QueueEstimate | null;
  createdAt: string;
  startedAt: string | null;
  finishedAt: string | null;
}

export interface QueueEstimate {
  /** About how many runs start before this task's first one. */
  runsAhead: number;
  /** Other users waiting at the same priority, served in turn with this task's owner. */
  usersWaiting: number;
  /** Runs of a higher priority waiting (counted up to ESTIMATE_CAP), all of which go first. */
  higherPriority: number;
  /** Always true: the number depends on what arrives and finishes meanwhile. */
  estimate: true;
  /**
   * Why no live worker can run the task's type now (as GET /api/analysis-types says it), or null when
   * one can: such a task is not next whatever runsAhead says, and fails ANALYSIS_WORKER_UNAVAILABLE when
   * none comes. Null too when the caller did not ask (taskQueueEstimates alone).
   */
  noWorker: string | null;
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
  /** The latest progress message the run's program reported; null when none. */
  message: string | null;
  metrics: Record<string, unknown> | null;
  startedAt: string | null;
  finishedAt: string | null;
}

const opt = (v: string | Date | null) => (v === null ? null : isoTime(v));

type TaskRow = Omit<TaskView, "createdAt" | "startedAt" | "finishedAt" | "progressPercent" | "queue"> & {
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
    queue: null,
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
    t.id::text as "taskId", t.analysis_type as "analysisType",
    (select u.name from users u where u.id = t.owner_id) as owner, t.status, t.total_count as "totalCount",
    t.succeeded_count as "succeededCount", t.failed_count as "failedCount",
    t.timed_out_count as "timedOutCount", t.cancelled_count as "cancelledCount", t.parameters, t.priority,
    t.created_at as "createdAt", t.started_at as "startedAt", t.finished_at as "finishedAt"`;
}

/**
 * A task's progress: 100 for every finished run (its counters), plus what its live runs reported —
 * read from the live-runs index (owner, task), so a task of 100,000 runs costs a few rows, not a scan
 * of its runs. Queued runs count 0 (a retried run starts again).
 */
function progressSum(sql: Sql) {
  return sql`case when t.finished_at is not null then 0 else
    100 * (t.succeeded_count + t.failed_count + t.timed_out_count + t.cancelled_count)
    + (select coalesce(sum(r.progress), 0)::int from runs r
       where r.owner_id = t.owner_id and r.task_id = t.id and r.status ${inLive(sql)}) end as "progressSum"`;
}

/** A task visible to `p`, with its owner (what src/tasks/task-cache.ts checks visibility against). */
export async function taskGetOwned(
  sql: Sql,
  p: Principal,
  taskId: string,
  o: QueueReadOptions = {},
): Promise<{ task: TaskView; ownerId: number } | undefined> {
  const [row] = await sql<(TaskRow & { ownerId: number })[]>`
    select ${taskSelect(sql)}, ${progressSum(sql)}, t.owner_id::float8 as "ownerId"
    from tasks t where t.id = ${taskId} and ${visible(sql, p)}`;
  if (!row) return undefined;
  const { ownerId, ...rest } = row;
  const [task] = await withQueueEstimates(sql, [taskView(rest)], o);
  return task && { task, ownerId };
}

/** Counts in an estimate stop here: a backlog is never counted whole. */
export const ESTIMATE_CAP = 10_000;

/**
 * Where queued tasks stand, estimated from the claim's rotation (src/queue/sql/fair.ts) without
 * counting any backlog whole: the owner's own queued runs ahead of the task's first (its tasks take
 * turns by `turn`), `m`; each other user waiting at the same priority gets about as many runs in
 * turn, m + 1 or what it has queued if less (counted up to m + 1 each, ESTIMATE_CAP in all); every
 * queued run of a higher priority goes first (counted up to ESTIMATE_CAP). Runs of tasks that arrive later at a higher
 * priority, or of users whose turn comes, can change it: it is labelled an estimate.
 */
export async function taskQueueEstimates(sql: Sql, taskIds: string[]): Promise<Map<string, QueueEstimate>> {
  if (taskIds.length === 0) return new Map();
  // The first `limit` queued runs of a queue_owners row `w` (its owner, type and priority), read from
  // runs_claim_idx in the claim's order: the ORDER BY keeps the planner on that index.
  const ownerQueue = (limit: ReturnType<Sql["unsafe"]>) => sql`
    select 1 from runs q
    where q.status = 'queued' and q.analysis_type = w.analysis_type and q.owner_id = w.owner_id
      and q.priority = w.priority
    order by q.turn, q.id
    limit ${limit}`;
  const rows = await sql<{ taskId: string; mine: number; others: number; users: number; higher: number }[]>`
    select t.id::text as "taskId", m.n as mine, coalesce(o.runs, 0)::int as others, coalesce(o.users, 0)::int as users,
           h.n as higher
    from tasks t
    -- Every count reads runs_claim_idx in the claim's order (turn, id), one owner at a time, and
    -- stops at its limit: the ORDER BY keeps the planner on that index. Without it, with a limit it
    -- cannot know (m.n + 1), the planner read every queued run of the table for another owner's
    -- few; and the task's first queued run was looked up among the task's own runs: either way a
    -- queued 100,000-run task cost ~50 ms a read, and queued tasks are not cached.
    --
    -- m: where the task's first queued run stands in its owner's queue, read from the front, up to
    -- ESTIMATE_CAP + 1 runs (the task's runs all have its type, owner and priority). Not found that
    -- far: ESTIMATE_CAP, if it has a run queued at all (one claimed and not yet running leaves a task
    -- queued with none: no estimate; nor one whose first run is claimed, below). OFFSET 0 keeps it one
    -- subquery: pulled up, its expression was copied into every use of m.n.
    cross join lateral (
      select coalesce(
        (select x.k - 1 from (
           select q.task_id, row_number() over (order by q.turn, q.id) as k from runs q
           where q.status = 'queued' and q.analysis_type = t.analysis_type and q.owner_id = t.owner_id
             and q.priority = t.priority
           order by q.turn, q.id
           limit ${ESTIMATE_CAP + 1}
         ) x
         -- The first match in the subquery's order (no ORDER BY here: one would sort all it read
         -- rather than stop at the match; a scan, filter and limit keep their input's order).
         where x.task_id = t.id
         limit 1),
        case when exists (select 1 from runs r where r.task_id = t.id and r.status = 'queued')
             then ${ESTIMATE_CAP}::bigint end
      )::int as n
      -- A run of the task claimed (the task turns running only when one reports running): nothing
      -- is ahead of its first run any more, and its other queued runs' place said "N runs ahead" of a
      -- task already starting. Asked here, before the exists above, from runs_owner_live_idx (the
      -- owner's few live runs): a task whose runs are all claimed otherwise reached that exists,
      -- planned as a sequential scan of runs (70–100 ms a read with 100,000 runs in the table).
      where not exists (select 1 from runs s
                        where s.owner_id = t.owner_id and s.task_id = t.id and s.status ${inLive(sql)})
      offset 0
    ) m
    -- o: the other owners waiting at the task's level (one probe each), and their runs ahead of it,
    -- m + 1 each at most, ESTIMATE_CAP in all (without that cap a task deep in its owner's queue
    -- counted up to 10,001 runs of every other owner: 39 ms with 31 of them).
    cross join lateral (
      select (select count(*) from queue_owners w
              where w.analysis_type = t.analysis_type and w.priority = t.priority and w.owner_id <> t.owner_id
                and exists (select 1 from runs q
                            where q.status = 'queued' and q.analysis_type = w.analysis_type
                              and q.owner_id = w.owner_id and q.priority = w.priority)) as users,
             (select count(*) from (
                select 1 from queue_owners w
                cross join lateral (${ownerQueue(sql`m.n + 1`)}) y
                where w.analysis_type = t.analysis_type and w.priority = t.priority and w.owner_id <> t.owner_id
                limit ${ESTIMATE_CAP}
              ) z) as runs
    ) o
    cross join lateral (
      select count(*)::int as n from (
        select 1 from queue_owners w
        cross join lateral (${ownerQueue(sql.unsafe(String(ESTIMATE_CAP)))}) q
        where w.analysis_type = t.analysis_type and w.priority < t.priority
        limit ${ESTIMATE_CAP}
      ) z
    ) h
    where t.id = any(${sql.array(taskIds, INT8_OID)}::bigint[]) and m.n is not null`;
  return new Map(
    rows.map((r) => [
      r.taskId,
      {
        runsAhead: r.mine + r.others + r.higher,
        usersWaiting: r.users,
        higherPriority: r.higher,
        estimate: true,
        noWorker: null,
      },
    ]),
  );
}

export interface QueueReadOptions {
  /**
   * A worker whose heartbeat is older is not live (as the reaper judges): given, a queued task's
   * estimate says when no live worker can run its type (QueueEstimate.noWorker).
   */
  workerStaleMs?: number;
}

/** The tasks with their queue estimates filled in (queued tasks only). */
async function withQueueEstimates(sql: Sql, tasks: TaskView[], o: QueueReadOptions): Promise<TaskView[]> {
  const queued = tasks.filter((t) => t.status === "queued");
  const estimates = await taskQueueEstimates(
    sql,
    queued.map((t) => t.taskId),
  );
  if (estimates.size > 0 && o.workerStaleMs !== undefined) {
    // One look at the workers (a row per process: small) for the types of the tasks estimated.
    const types = [...new Set(queued.filter((t) => estimates.has(t.taskId)).map((t) => t.analysisType))];
    const availability = await workerTypeAvailability(sql, types, o.workerStaleMs);
    const why = new Map(availability.map((a) => [a.type, unavailableReason(a)]));
    for (const t of queued) {
      const e = estimates.get(t.taskId);
      if (e) e.noWorker = why.get(t.analysisType) ?? null;
    }
  }
  return tasks.map((t) => ({ ...t, queue: estimates.get(t.taskId) ?? null }));
}

export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

export async function taskList(
  sql: Sql,
  p: Principal,
  o: { status?: string; analysisType?: string; limit: number; cursor?: string } & QueueReadOptions,
): Promise<Page<TaskView>> {
  const rows = await sql<TaskRow[]>`
    select ${taskSelect(sql)}, ${progressSum(sql)}
    from tasks t
    where ${visible(sql, p)}
      ${o.status ? sql`and t.status = ${o.status}` : sql``}
      ${o.analysisType ? sql`and t.analysis_type = ${o.analysisType}` : sql``}
      ${o.cursor ? sql`and t.id < ${o.cursor}` : sql``}
    order by t.id desc
    limit ${o.limit + 1}`;
  const items = await withQueueEstimates(sql, rows.slice(0, o.limit).map(taskView), o);
  return { items, nextCursor: rows.length > o.limit ? (items.at(-1)?.taskId ?? null) : null };
}

/** Runs of a task visible to `p`, in id order (of one status, if given); undefined when the task is not visible. */
export async function runList(
  sql: Sql,
  p: Principal,
  taskId: string,
  o: { status?: string; limit: number; cursor?: string },
): Promise<{ page: Page<RunView>; ownerId: number } | undefined> {
  // One statement: the task's visibility and the page come back together (no row: not visible;
  // one row without a run: visible, nothing on this page).
  type Row = Omit<RunView, "runId"> & { runId: string | null; ownerId: number };
  const rows = await sql<Row[]>`
    select t.owner_id::float8 as "ownerId", r."runId", r."inputFileId", r."fileName", r.status, r.attempt,
           r."errorCode", r."errorMessage", r."progressPercent", r.message, r.metrics, r."startedAt",
           r."finishedAt"
    from tasks t
    left join lateral (
      select r.id, r.id::text as "runId", r.input_file_id::text as "inputFileId", r.input_name as "fileName",
             r.status, r.attempt, r.error_code as "errorCode", r.error_message as "errorMessage",
             r.progress as "progressPercent", r.message, r.result -> 'metrics' as metrics,
             r.started_at as "startedAt", r.finished_at as "finishedAt"
      from runs r
      where r.task_id = ${taskId} ${o.cursor ? sql`and r.id > ${o.cursor}` : sql``}
        ${o.status ? sql`and r.status = ${o.status}` : sql``}
      order by r.id
      limit ${o.limit + 1}
    ) r on true
    where t.id = ${taskId} and ${visible(sql, p)}
    order by r.id`;
  const first = rows[0];
  if (!first) return undefined;
  const runs = first.runId === null ? [] : rows;
  const items = runs.slice(0, o.limit).map(
    ({ runId, startedAt, finishedAt, ownerId: _, ...r }): RunView => ({
      runId: runId as string,
      ...r,
      startedAt: opt(startedAt),
      finishedAt: opt(finishedAt),
    }),
  );
  return {
    page: { items, nextCursor: runs.length > o.limit ? (items.at(-1)?.runId ?? null) : null },
    ownerId: first.ownerId,
  };
}
