// Fan-out (DESIGN §4.1): one transaction creates a task and its N runs with one set-based insert
// that checks ownership and snapshots each input file into its run.
import { createHash } from "node:crypto";
import type { Principal } from "../auth/tokens.ts";
import type { Sql } from "../db/client.ts";
import { INT8_OID, runWake } from "../queue/sql.ts";

export interface TaskCreateInput {
  analysisType: string;
  /** Distinct file ids (callers collapse duplicates). */
  fileIds: string[];
  parameters: Record<string, unknown>;
  maxAttempts: number;
  priority?: number;
  idempotencyKey?: string;
}

export type TaskCreateResult =
  | { kind: "created"; taskId: string }
  | { kind: "existing"; taskId: string; status: string }
  | { kind: "files-missing" }
  | { kind: "idempotency-conflict" };

class FilesMissing extends Error {}

/** Canonical request digest: the same key with a different request is a conflict, not a replay. */
function requestHash(input: TaskCreateInput): string {
  const canonical = JSON.stringify([
    input.analysisType,
    [...input.fileIds].sort(),
    sortKeys(input.parameters),
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
  if (input.idempotencyKey) {
    const existing = await taskByIdempotencyKey(sql, owner.userId, input.idempotencyKey, hash);
    if (existing) return existing;
  }
  try {
    return await sql.begin(async (tx) => {
      const [task] = await tx<{ id: string }[]>`
        insert into tasks (owner_id, analysis_type, parameters, total_count, idempotency_key, request_hash)
        values (${owner.userId}, ${input.analysisType}, ${tx.json(input.parameters as never)},
                ${input.fileIds.length}, ${input.idempotencyKey ?? null}, ${hash})
        returning id::text`;
      if (!task) throw new Error("task insert returned no row");
      // Ownership is part of the statement: a missing or foreign id simply inserts no run.
      const [inserted] = await tx<{ n: number }[]>`
        with ins as (
          insert into runs (task_id, analysis_type, max_attempts, priority, input_file_id,
                            input_storage_key, input_name, input_size_bytes, input_sha256)
          select ${task.id}, ${input.analysisType}, ${input.maxAttempts}, ${input.priority ?? 0}, f.id,
                 f.storage_key, f.name, f.size_bytes, f.sha256
          from files f
          where f.id = any(${tx.array(input.fileIds, INT8_OID)}::bigint[])
            and (${owner.role === "admin"} or f.owner_id = ${owner.userId})
          order by f.id
          returning 1
        )
        select count(*)::int as n from ins`;
      if (inserted?.n !== input.fileIds.length) throw new FilesMissing();
      await tx`insert into task_events (task_id, type, data)
               values (${task.id}, 'task.queued', ${tx.json({ status: "queued", totalCount: input.fileIds.length })})`;
      await runWake(tx as unknown as Sql, input.analysisType);
      return { kind: "created" as const, taskId: task.id };
    });
  } catch (err) {
    if (err instanceof FilesMissing) return { kind: "files-missing" };
    // Two requests with one idempotency key raced: the loser returns the winner's task.
    if ((err as { code?: string }).code === "23505" && input.idempotencyKey) {
      const existing = await taskByIdempotencyKey(sql, owner.userId, input.idempotencyKey, hash);
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
): Promise<TaskCreateResult | undefined> {
  const [row] = await sql<{ id: string; status: string; requestHash: string | null }[]>`
    select id::text, status, request_hash as "requestHash" from tasks
    where owner_id = ${ownerId} and idempotency_key = ${key}`;
  if (!row) return undefined;
  if (row.requestHash !== hash) return { kind: "idempotency-conflict" };
  return { kind: "existing", taskId: row.id, status: row.status };
}
