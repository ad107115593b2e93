// Fan-out (DESIGN §4.1): one transaction creates a task and its N runs with one set-based insert
// that checks ownership and snapshots each input file into its run.
import { createHash } from "node:crypto";
import type { Principal } from "../auth/tokens.ts";
import type { Sql } from "../db/client.ts";
import {
  DEFAULT_PRIORITY,
  INT8_OID,
  queueOwnersJoin,
  TASK_CREATED_CHANNEL,
  WAKEUP_CHANNEL,
} from "../queue/sql.ts";

export interface TaskCreateInput {
  analysisType: string;
  /** Distinct file ids (callers collapse duplicates). */
  fileIds: string[];
  parameters: Record<string, unknown>;
  maxAttempts: number;
  /** 0–9, lower first (default 5); only an admin may set it (checked by the route). */
  priority?: number;
  idempotencyKey?: string;
}

export type TaskCreateResult =
  | { kind: "created"; taskId: string }
  | { kind: "existing"; taskId: string; status: string }
  | { kind: "files-missing" }
  | { kind: "idempotency-conflict" };

/**
 * Canonical request digest: the same key with a different request is a conflict, not a replay. The
 * priority counts only when it is not the default, so the hashes of requests made before priorities
 * existed stay the same, and `"priority": 5` is the same request as none (it was a 409 until
 * 2026-12-07: an automation trial). `asGiven`: the digest as it was made before then, with a
 * priority of 5 given counted (a key stored so is still matched by its replay).
 */
export function requestHash(input: TaskCreateInput, asGiven = false): string {
  const counted = asGiven
    ? input.priority !== undefined
    : (input.priority ?? DEFAULT_PRIORITY) !== DEFAULT_PRIORITY;
  const canonical = JSON.stringify([
    input.analysisType,
    [...input.fileIds].sort(),
    sortKeys(input.parameters),
    ...(counted ? [input.priority] : []),
  ]);
  return createHash("sha256").update(canonical).digest("hex");
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value && typeof value === "object") {
    return Object.fromEntries(
      Object.entries(value as Record<string, unknown>)
        .sort(([a], [b]) => (a < b ? -1 : 1))
        .map(([k, v]) => [k, sortKeys(v)]),
    );
  }
  return value;
}

export async function taskCreate(
  sql: Sql,
  owner: Principal,
  input: TaskCreateInput,
): Promise<TaskCreateResult> {
  if (input.fileIds.length === 0)
    throw new Error("taskCreate needs at least one file (checked by the caller)");
  const hash = requestHash(input);
  // With no priority, as a request with 5 given was digested: that request replayed without one.
  const legacyHash = requestHash({ ...input, priority: input.priority ?? DEFAULT_PRIORITY }, true);
  const priority = input.priority ?? DEFAULT_PRIORITY;
  if (input.idempotencyKey) {
    const existing = await taskByIdempotencyKey(sql, owner.userId, input.idempotencyKey, hash, legacyHash);
    if (existing) return existing;
  }
  try {
    // One statement, so one round trip and atomic by itself: the task, its runs and its first event
    // are inserted only when every file is visible to the owner; the NOTIFY is delivered at commit.
    const [row] = await sql<{ id: string | null }[]>`
      with
      -- Locked against a delete of the files (DELETE /api/files/:fileId) until the commit: a delete
      -- that came first makes this a 404 (the locking read skips a row deleted meanwhile); one that
      -- comes after waits, and the runs made here then fail as runs of a deleted file do. Unlocked, a
      -- create whose snapshot predated a delete made runs of a file already gone (~0.1 s of 100,000
      -- files' 1.5 s create).
      f as (
        select id, storage_key, name, size_bytes, sha256 from files
        where id = any(${sql.array(input.fileIds, INT8_OID)}::bigint[])
          and (${owner.role === "admin"} or owner_id = ${owner.userId})
        for key share
      ),
      complete as (select count(*) = ${input.fileIds.length} as ok from f),
      t as (
        insert into tasks (owner_id, analysis_type, parameters, total_count, priority, idempotency_key,
                           request_hash)
        select ${owner.userId}, ${input.analysisType}, ${sql.json(input.parameters as never)},
               ${input.fileIds.length}, ${priority}, ${input.idempotencyKey ?? null}, ${hash}
        from complete where ok
        returning id
      ),
      -- Fair share within the owner: the new runs take turns from where the owner's queued runs of
      -- this type and priority stand now, so this task interleaves with the owner's others instead of
      -- waiting behind them.
      frontier as (
        select coalesce(min(q.turn), 0) as turn from runs q
        where q.status = 'queued' and q.analysis_type = ${input.analysisType}
          and q.owner_id = ${owner.userId} and q.priority = ${priority}
      ),
      r as (
        insert into runs (task_id, analysis_type, owner_id, max_attempts, priority, turn, input_file_id,
                          input_storage_key, input_name, input_size_bytes, input_sha256)
        select t.id, ${input.analysisType}, ${owner.userId}, ${input.maxAttempts}, ${priority},
               frontier.turn + row_number() over (order by f.id) - 1, f.id,
               f.storage_key, f.name, f.size_bytes, f.sha256
        from t, f, frontier
        order by f.id
        returning id
      ),
      -- Fair share between owners: the owner joins the claim's rotation (see queueOwnersJoin) — after
      -- every run is inserted (it reads r), so the owner's row is locked only for the commit, not while
      -- 100,000 runs go in (claims serving the owner wait for that lock).
      joined as (${queueOwnersJoin(
        sql,
        sql`select ${input.analysisType}::text, ${priority}::int, ${owner.userId}::bigint from t, (select count(*) from r) n`,
      )}),
      -- The first event goes to the table only: nobody can be subscribed to a task that did not
      -- exist before this statement, and every stream starts by reading its backlog.
      events as (
        insert into task_events (task_id, type, data)
        select id, 'task.queued', jsonb_build_object('status', 'queued', 'totalCount', ${input.fileIds.length}::int)
        from t
      ),
      -- The task's own notification first (a worker may claim a newcomer's first run at once:
      -- runClaimNewcomer), then the wake-up; one row, evaluated left to right.
      wake as (
        select pg_notify(${TASK_CREATED_CHANNEL},
                         json_build_object('type', ${input.analysisType}::text, 'taskId', id,
                                           'runId', (select min(id) from r),
                                           'ownerId', ${owner.userId}::bigint, 'priority', ${priority}::int)::text),
               pg_notify(${WAKEUP_CHANNEL}, ${input.analysisType})
        from t)
      select (select id::text from t) as id, (select count(*) from wake) as woken,
             (select count(*) from joined) as joined`;
    return row?.id ? { kind: "created", taskId: row.id } : { kind: "files-missing" };
  } catch (err) {
    // Two requests with one idempotency key raced: the loser returns the winner's task.
    if ((err as { code?: string }).code === "23505" && input.idempotencyKey) {
      const existing = await taskByIdempotencyKey(sql, owner.userId, input.idempotencyKey, hash, legacyHash);
      if (existing) return existing;
    }
    throw err;
  }
}

async function taskByIdempotencyKey(
  sql: Sql,
  ownerId: number,
  key: string,
  hash: string,
  /** The digest as made before 2026-12-07 with a priority of 5 given (requestHash(…, true)). */
  legacyHash: string,
): Promise<TaskCreateResult | undefined> {
  const [row] = await sql<{ id: string; status: string; requestHash: string | null }[]>`
    select id::text, status, request_hash as "requestHash" from tasks
    where owner_id = ${ownerId} and idempotency_key = ${key}`;
  if (!row) return undefined;
  if (row.requestHash !== hash && row.requestHash !== legacyHash) return { kind: "idempotency-conflict" };
  return { kind: "existing", taskId: row.id, status: row.status };
}
