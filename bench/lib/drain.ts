// Shared by the queue benchmarks: seed N files, create one task of N runs, drain it with one worker.
import { performance } from "node:perf_hooks";
import { loadConfig } from "../../src/config.ts";
import type { Sql } from "../../src/db/client.ts";
import { createLogger } from "../../src/log.ts";
import { Worker } from "../../src/queue/worker.ts";
import { taskCreate } from "../../src/tasks/create.ts";
import { checkpoint } from "./db.ts";

export interface DrainResult {
  seconds: number;
  ok: boolean;
  latencies: number[];
}

export async function seedOwnerAndFiles(sql: Sql, name: string, n: number) {
  const [user] = await sql<
    { id: number }[]
  >`insert into users (name, role) values (${name}, 'admin') returning id::float8`;
  const owner = { userId: user?.id as number, name, role: "admin" as const };
  const fileIds = (
    await sql<{ id: string }[]>`
      with next as (select nextval(pg_get_serial_sequence('files', 'id')) as id from generate_series(1, ${n}))
      insert into files (id, owner_id, name, content_type, size_bytes, sha256, storage_key)
      select id, ${owner.userId}, 'f.csv', 'text/csv', 1, repeat('0', 64), 'files/' || id from next
      returning id::text`
  ).map((r) => r.id);
  return { owner, fileIds };
}

/** `users` users (user role) with `files` files each, for fair-share workloads. */
export async function seedUsersAndFiles(sql: Sql, prefix: string, users: number, files: number) {
  const out: { owner: { userId: number; name: string; role: "admin" }; fileIds: string[] }[] = [];
  for (let i = 0; i < users; i++) {
    const seeded = await seedOwnerAndFiles(sql, `${prefix}-${i}`, files);
    out.push(seeded);
  }
  return out;
}

/** One task of `fileIds.length` runs of the no-op type; returns its id. */
export async function createNoopTask(
  sql: Sql,
  owner: { userId: number; name: string; role: "admin" },
  fileIds: string[],
): Promise<string> {
  const created = await taskCreate(sql, owner, {
    analysisType: "noop",
    fileIds,
    parameters: {},
    maxAttempts: 3,
  });
  if (created.kind !== "created") throw new Error("create failed");
  return created.taskId;
}

/**
 * Drains task `taskId` (of `n` no-op runs) with one worker, timed from the worker's start until the
 * task has succeeded; `ok` only when the task's counter and its runs both say `n` succeeded.
 */
export async function drainTask(
  sql: Sql,
  taskId: string,
  n: number,
  concurrency: number,
  prefetch = 0,
): Promise<DrainResult> {
  return drainTasks(sql, [taskId], n, concurrency, prefetch);
}

/**
 * drainTask over several tasks (of `n` runs in all): timed until every one has succeeded, from a
 * checkpoint (not timed).
 */
export async function drainTasks(
  sql: Sql,
  taskIds: string[],
  n: number,
  concurrency: number,
  prefetch = 0,
): Promise<DrainResult> {
  const { prefetchWindowMs, completionDelayMs } = loadConfig();
  const worker = new Worker({
    sql,
    logger: createLogger({ level: "warn", destination: process.stderr }),
    types: { noop: { handler: async () => ({ status: "succeeded" }) } },
    concurrency,
    leaseTtlMs: 30_000,
    pollIntervalMs: 2000,
    retryBaseMs: 1000,
    prefetch,
    // As `assay worker` claims and records outcomes: the configured automatic prefetch and completion
    // delay (ASSAY_PREFETCH_WINDOW_MS, ASSAY_COMPLETION_DELAY_MS; 200 ms each unless set).
    prefetchWindowMs,
    completionDelayMs,
  });
  // Its segments recycled (see checkpoint()), as a server that has run a while.
  await checkpoint(sql);
  const start = performance.now();
  await worker.start();
  const ids = sql.array(taskIds, 20);
  for (;;) {
    const [t] = await sql<{ open: number }[]>`
      select count(*)::int as open from tasks where id = any(${ids}::bigint[]) and status <> 'succeeded'`;
    if (t?.open === 0) break;
    await new Promise((res) => setTimeout(res, 5));
  }
  const seconds = (performance.now() - start) / 1000;
  await worker.stop();
  const [check] = await sql<{ counted: number; actual: number; latencies: number[] }[]>`
    select (select sum(t.succeeded_count)::int from tasks t where t.id = any(${ids}::bigint[])) as counted,
           (select count(*)::int from runs r where r.task_id = any(${ids}::bigint[]) and r.status = 'succeeded') as actual,
           (select array_agg(extract(epoch from r.finished_at - r.started_at) * 1000) from runs r
              where r.task_id = any(${ids}::bigint[])) as latencies`;
  return {
    seconds,
    ok: check?.counted === n && check?.actual === n,
    latencies: (check?.latencies ?? []).map(Number),
  };
}
