// Shared pieces of the queue statements: channels, limits, and the tails that every statement
// which ends runs or writes events uses. Locking order, everywhere: run rows first, then task rows in
// id order; a statement touching several tasks locks them with `... order by id for update` first.
import { isoTimeSql, type Sql } from "../../db/client.ts";
import { LIVE_RUN_STATUSES, RUN_STATUSES } from "../../tasks/states.ts";

/** Retry delays never exceed this. */
export const MAX_BACKOFF_MS = 5 * 60 * 1000;
/** Wake-up channel: the payload is the analysis type that has work. */
export const WAKEUP_CHANNEL = "assay_runs";
/**
 * A task was created: `{"type", "taskId", "runId", "ownerId", "priority"}` (ids as numbers; `runId` its
 * first run), sent just before the wake-up of WAKEUP_CHANNEL, so a worker may claim a newcomer's first
 * run at once (runClaimNewcomer).
 */
export const TASK_CREATED_CHANNEL = "assay_task_created";
/** Cancel channel: the payload is a task id whose live runs were just marked cancelling. */
export const CANCEL_CHANNEL = "assay_cancel";
/** Event channel: `{taskId, events: [...]}`, or `{taskId, eventId}` when that would not fit. */
export const EVENTS_CHANNEL = "assay_events";
/** NOTIFY payloads must stay under 8000 bytes; above this the doorbell is sent instead. */
export const NOTIFY_MAX_BYTES = 7000;
/**
 * The bytes of one event's JSON in a payload (json_build_object's `"key" : value, ` layout), exactly,
 * from its columns: the keys, spacing, quotes and timestamp are 106 bytes, a null run id 2 more than
 * the quotes it goes without; the rest is the ids, the type and the data as text. Plus 2 for the
 * separator in the array (one fewer than the events), so a task's payload is its events' sum plus
 * PAYLOAD_WRAPPER_BYTES and its id's digits. Checked against the built JSON in
 * test/integration/events.test.ts.
 */
export const EVENT_PAYLOAD_BYTES = `(108 + octet_length(id::text) + octet_length(task_id::text)
  + coalesce(octet_length(run_id::text), 2) + octet_length(type) + octet_length(data::text))`;
/** `{"taskId" : "", "events" : []}` less the one separator too many that the events' sum counts. */
export const PAYLOAD_WRAPPER_BYTES = 28;
/**
 * More events than this never fit: an event is at least 123 bytes (EVENT_PAYLOAD_BYTES with one-digit
 * ids, a null run id, the shortest type, `run.retry`, and `{}`), 57 of them at most in 7,000. A task's
 * batch of more is not sized at all (a reaper's or a prefetched drain's batch of hundreds).
 */
const MAX_NOTIFIED_EVENTS = 64;

/**
 * `in (...)` over the live run statuses, written into the statement as literals rather than sent as
 * parameters. PostgreSQL plans a prepared statement once and reuses that generic plan only when it is
 * about as cheap as a plan made for the values at hand; a partial index whose predicate names these
 * statuses (runs_live_idx, runs_claim_idx) is usable by the generic plan only when the statement names
 * them too. With parameters, the hot queue statements were re-planned on every execution, and
 * planning was half of PostgreSQL's CPU per run.
 */
export function inLive(sql: Pick<Sql, "unsafe">) {
  return sql.unsafe(`in (${LIVE_RUN_STATUSES.map((s) => `'${s}'`).join(", ")})`);
}

/**
 * The WHERE clause of a statement that updates the runs a batch names (completion, progress,
 * heartbeat), for `runs r` and a CTE `i` (id, token): the runs of the batch, by primary key, still
 * held by the batch's lease and live. Liveness is written as `not in` the other statuses (built from
 * the same list as inLive(), so a new status cannot fall through) because inLive() here let
 * PostgreSQL take runs_live_idx — few live rows by its statistics — and read every entry that index
 * had collected since the last vacuum (each state change or heartbeat of a live run leaves one:
 * hundreds per live run), then their heap pages. The ids come from the batch as an array, not from a
 * parameter, so generic and custom plans estimate them alike and the generic plan is kept.
 */
export function matchesLease(sql: Sql) {
  const others = RUN_STATUSES.filter((s) => !(LIVE_RUN_STATUSES as readonly string[]).includes(s));
  return sql`r.id = any(array(select id from i)) and r.id = i.id and r.lease_token = i.token
        and r.status ${sql.unsafe(`not in (${others.map((s) => `'${s}'`).join(", ")})`)}`;
}

/** Element type oid for sql.array() of bigint ids. */
export const INT8_OID = 20;

export type Json = Parameters<Sql["json"]>[0];

export interface Lease {
  id: number;
  token: string;
}

/** Any UTF-16 surrogate: only a string holding one can hold half a pair. */
const SURROGATE = /[\uD800-\uDFFF]/;
/** Half a surrogate pair: a high one not followed by a low one, or a low one not after a high one. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/**
 * A string as PostgreSQL's text and jsonb can hold it: without U+0000 (neither type can: jsonb refuses
 * the escape with 22P05, failing the whole statement) and with each lone surrogate (half a UTF-16 pair,
 * which has no UTF-8 form: jsonb refuses its escape, a text parameter turns it into U+FFFD) replaced
 * by U+FFFD. Anything else comes back as it was — the same string when there was nothing to change.
 */
export function pgText(s: string): string {
  let out = s;
  // Surrogates first: a NUL between the two halves of a broken pair must not join them.
  if (SURROGATE.test(out)) out = out.replace(LONE_SURROGATE, "\uFFFD");
  if (out.includes("\u0000")) out = out.replaceAll("\u0000", "");
  return out;
}

/**
 * A value bound for a statement's JSON input with pgText() applied to every string in it, object keys
 * included, as JSON.stringify would reach them (arrays and objects without toJSON). The batch
 * statements that write what attempts report (runComplete, runRetry, runProgress) take their input
 * through this: a run's stderr tail, a result's metrics (keys and values), error and progress
 * messages come from analysis programs and handlers, and one NUL among them refused the whole batch.
 * Returns the value itself when nothing in it needed changing (no copy on the hot path).
 */
export function pgSafe<T>(value: T): T {
  return unsafe(value) ? (clean(value) as T) : value;
}

const unsafeText = (s: string) => SURROGATE.test(s) || s.includes("\u0000");

/** Whether anything in `value` needs pgText(): a walk that allocates nothing (the common case). */
function unsafe(value: unknown): boolean {
  if (typeof value === "string") return unsafeText(value);
  if (typeof value !== "object" || value === null) return false;
  if (Array.isArray(value)) {
    for (const v of value) if (unsafe(v)) return true;
    return false;
  }
  if (typeof (value as { toJSON?: unknown }).toJSON === "function") return false;
  for (const k in value) {
    if (!Object.hasOwn(value, k)) continue;
    if (unsafeText(k) || unsafe((value as Record<string, unknown>)[k])) return true;
  }
  return false;
}

function clean(value: unknown): unknown {
  if (typeof value === "string") return pgText(value);
  if (typeof value !== "object" || value === null) return value;
  if (Array.isArray(value)) {
    let copy: unknown[] | undefined;
    for (let i = 0; i < value.length; i++) {
      const v = clean(value[i]);
      if (v !== value[i]) {
        copy ??= [...value];
        copy[i] = v;
      }
    }
    return copy ?? value;
  }
  if (typeof (value as { toJSON?: unknown }).toJSON === "function") return value;
  let changed = false;
  const entries = Object.entries(value).map(([k, v]) => {
    const key = pgText(k);
    const cleaned = clean(v);
    if (key !== k || cleaned !== v) changed = true;
    return [key, cleaned] as const;
  });
  return changed ? Object.fromEntries(entries) : value;
}

/**
 * Rows in id order. A batch statement joins its input to `runs` with the input as the probing side,
 * so the run rows are locked in input order; in id order, like `taskCancel` locks a task's runs, two
 * statements cannot lock the same runs in opposite orders and deadlock.
 */
export function byId<T extends { id: number }>(rows: readonly T[]): T[] {
  return [...rows].sort((a, b) => a.id - b.id);
}

/**
 * The tail shared by every statement that ends runs (completion, reaper): given a CTE `done`
 * (id, task_id, status, attempt, error_code) of runs that just turned terminal — and, with
 * `withRequeued`, a CTE `requeued` (id, task_id, attempt, error_code, run_after, refunded) of runs put back in
 * the queue —
 * locks their tasks in id order, adds the outcomes to the counters, flips tasks whose counters reach
 * their total, appends the events and announces them. Defines `counted` (id, status, finished) and
 * `notified`. With `runEvents: false` only the tasks' closing events are appended: the caller has
 * recorded the runs' endings in one event of its own (a cancel's queued runs, see taskCancel). With
 * `runStarts`, `done` also has `run_started` (the run's started_at) for the task's start.
 */
export function countIntoTasks(sql: Sql, withRequeued = false, { runEvents = true, runStarts = false } = {}) {
  return sql`
    agg as (
      select task_id,
        count(*) filter (where status = 'succeeded')::int as s,
        count(*) filter (where status = 'failed')::int as f,
        count(*) filter (where status = 'timed_out')::int as x,
        count(*) filter (where status = 'cancelled')::int as c,
        bool_or(attempt > 0) as started${runStarts ? sql`, min(run_started) as first_started` : sql``}
      from done group by task_id
    ),
    locked as materialized (
      select id from tasks
      where id in (select task_id from agg ${withRequeued ? sql`union select task_id from requeued` : sql``})
      order by id for update
    ),
    counted as (
      update tasks t set
        succeeded_count = t.succeeded_count + a.s,
        failed_count = t.failed_count + a.f,
        timed_out_count = t.timed_out_count + a.x,
        cancelled_count = t.cancelled_count + a.c,
        status = case
          when t.succeeded_count + a.s + t.failed_count + a.f + t.timed_out_count + a.x
               + t.cancelled_count + a.c < t.total_count then
            case when t.status = 'queued' and a.started then 'running' else t.status end
          when t.status = 'cancelling' then 'cancelled'
          when t.succeeded_count + a.s = t.total_count then 'succeeded'
          when t.failed_count + a.f = t.total_count then 'failed'
          when t.timed_out_count + a.x = t.total_count then 'timed_out'
          when t.cancelled_count + a.c = t.total_count then 'cancelled'
          when t.succeeded_count + a.s > 0 then 'partially_succeeded'
          else 'failed' end,
        finished_at = case
          when t.succeeded_count + a.s + t.failed_count + a.f + t.timed_out_count + a.x
               + t.cancelled_count + a.c = t.total_count then now()
          else t.finished_at end,
        -- A run that ended after it started may be the first news of its task starting.
        -- With the runs' own starts (runStarts), the earliest, also against a start a running mark
        -- set meanwhile: their finished_at may be backdated (a completion that waited for company),
        -- and the task must not start after they ended. (least() skips nulls.)
        started_at = case when a.started
          then ${runStarts ? sql`least(t.started_at, a.first_started, now())` : sql`coalesce(t.started_at, now())`}
          else t.started_at end,
        updated_at = now()
      from agg a, locked l
      where t.id = a.task_id and l.id = a.task_id
      returning t.id, t.status,
        t.succeeded_count + t.failed_count + t.timed_out_count + t.cancelled_count = t.total_count as finished
    ),
    -- One insert, ordered, after the task locks (it reads counted and locked): a task's events
    -- get ids in commit order, and its closing event the largest.
    events as (
      insert into task_events (task_id, run_id, type, data)
      select task_id, run_id, type, data from (
        select task_id, id as run_id, 'run.' || status as type,
               jsonb_build_object('status', status, 'attempt', attempt, 'errorCode', error_code) as data,
               0 as ord, id as k
        from done ${runEvents ? sql`` : sql`where false`}
        ${
          withRequeued
            ? sql`union all
        select task_id, id, 'run.retry',
               jsonb_build_object('status', 'queued', 'attempt', attempt, 'errorCode', error_code,
                                  'runAfter', ${isoTimeSql(sql, "run_after")})
                 -- Only when true: the attempt was not counted (given back by its worker, or the store
                 -- was away), and 'attempt' is already one fewer.
                 || case when refunded then '{"refunded": true}'::jsonb else '{}'::jsonb end, 0, id
        from requeued where task_id in (select id from locked)`
            : sql``
        }
        union all
        select id, null, 'task.' || status, jsonb_build_object('status', status), 1, id
        from counted where finished
      ) e
      order by ord, k
      returning id, task_id, run_id, type, data, created_at
    ),
    ${notifyEvents(sql)}`;
}

/**
 * Announces the rows of the CTE `events` on EVENTS_CHANNEL: one notification per task, carrying its
 * events when the payload fits in NOTIFY_MAX_BYTES, else only `{taskId, eventId}` (a doorbell: the
 * listener reads the table). Delivered at commit, so listeners never see an event that is not in the
 * table. An oversized batch can therefore never fail the statement. Defines `notified`.
 */
export function notifyEvents(sql: Sql) {
  return sql`
    notified as (
      select pg_notify(${EVENTS_CHANNEL},
        case when octet_length(p.full_payload) <= ${NOTIFY_MAX_BYTES} then p.full_payload
             else json_build_object('taskId', p.task_id::text, 'eventId', p.max_id::text)::text end)
      from (
        -- Events that cannot fit get the doorbell without building their payload (the FILTER skips
        -- the rows, the CASE only what is left; a null size is too large): a task's batch of more
        -- than MAX_NOTIFIED_EVENTS is not even sized, and a smaller one's exact size is summed from
        -- the columns first, at ~2 µs an event against ~7.5 to build it (a drain's completion
        -- batches of 36–70 runs built theirs only to throw it away, a fifth of the statement).
        select task_id, max(id) as max_id,
               case when max(bytes) <= ${sql.unsafe(String(NOTIFY_MAX_BYTES))} then
               json_build_object('taskId', task_id::text, 'events', json_agg(json_build_object(
                 'id', id::text, 'taskId', task_id::text, 'runId', run_id::text, 'type', type,
                 'data', data, 'createdAt', ${isoTimeSql(sql, "created_at")}) order by id)
                 filter (where bytes <= ${sql.unsafe(String(NOTIFY_MAX_BYTES))}))::text
               end as full_payload
        from (
          select *, ${sql.unsafe(String(PAYLOAD_WRAPPER_BYTES))} + octet_length(task_id::text)
                    + sum(case when n <= ${sql.unsafe(String(MAX_NOTIFIED_EVENTS))}
                               then ${sql.unsafe(EVENT_PAYLOAD_BYTES)} end) over (partition by task_id) as bytes
          from (select *, count(*) over (partition by task_id) as n from events) counted
        ) e
        group by task_id
      ) p
    )`;
}

/**
 * A WHERE condition that is always true and evaluated once: it sets how the statement's own
 * transaction commits — asynchronously unless `durable` (then the server's setting, whatever it is).
 */
export function commitMode(sql: Sql, durable: boolean) {
  return sql`(select set_config('synchronous_commit',
             case when ${durable} then current_setting('synchronous_commit') else 'off' end, true)) is not null`;
}
