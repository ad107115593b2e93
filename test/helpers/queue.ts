// Fixtures for queue tests: users, file rows, tasks created through the real fan-out, and waiting on
// conditions in the database (never fixed sleeps).
import type { Principal, Role } from "../../src/auth/tokens.ts";
import type { Sql } from "../../src/db/client.ts";
import { taskCreate } from "../../src/tasks/create.ts";
import { TERMINAL_TASK_STATUSES } from "../../src/tasks/states.ts";

export async function seedUser(sql: Sql, name: string, role: Role = "user"): Promise<Principal> {
  const [row] = await sql<{ id: number }[]>`
    insert into users (name, role) values (${name}, ${role})
    on conflict (name) do update set role = excluded.role returning id::float8`;
  return { userId: row?.id as number, name, role };
}

/** File rows (no bytes: handler-based tests never read them). */
export async function seedFiles(sql: Sql, owner: Principal, n: number): Promise<string[]> {
  const rows = await sql<{ id: string }[]>`
    with next as (select nextval(pg_get_serial_sequence('files', 'id')) as id from generate_series(1, ${n}))
    insert into files (id, owner_id, name, content_type, size_bytes, sha256, storage_key)
    select id, ${owner.userId}, 'f' || id || '.csv', 'text/csv', 10, repeat('0', 64), 'files/' || id from next
    returning id::text`;
  return rows.map((r) => r.id);
}

export async function createTask(
  sql: Sql,
  owner: Principal,
  type: string,
  files: number | string[],
  options: { maxAttempts?: number; parameters?: Record<string, unknown>; priority?: number } = {},
): Promise<string> {
  const fileIds = typeof files === "number" ? await seedFiles(sql, owner, files) : files;
  const result = await taskCreate(sql, owner, {
    analysisType: type,
    fileIds,
    parameters: options.parameters ?? {},
    maxAttempts: options.maxAttempts ?? 3,
    ...(options.priority === undefined ? {} : { priority: options.priority }),
  });
  if (result.kind !== "created") throw new Error(`task not created: ${result.kind}`);
  return result.taskId;
}

export interface TaskRow {
  status: string;
  total: number;
  succeeded: number;
  failed: number;
  timedOut: number;
  cancelled: number;
}

export async function taskRow(sql: Sql, taskId: string): Promise<TaskRow> {
  const [row] = await sql<TaskRow[]>`
    select status, total_count as total, succeeded_count as succeeded, failed_count as failed,
           timed_out_count as "timedOut", cancelled_count as cancelled
    from tasks where id = ${taskId}`;
  if (!row) throw new Error(`no task ${taskId}`);
  return row;
}

/** Counts of the task's runs by status, from the runs themselves. */
export async function runCounts(sql: Sql, taskId: string): Promise<Record<string, number>> {
  const rows = await sql<{ status: string; n: number }[]>`
    select status, count(*)::int as n from runs where task_id = ${taskId} group by status`;
  return Object.fromEntries(rows.map((r) => [r.status, r.n]));
}

/**
 * Polls `check` until it returns a truthy value (or throws after `timeoutMs`, on the monotonic clock:
 * tests move Date.now).
 */
export async function waitFor<T>(
  check: () => Promise<T>,
  timeoutMs = 30_000,
  what = "condition",
): Promise<NonNullable<T>> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value as NonNullable<T>;
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export const waitForTerminal = (sql: Sql, taskId: string, timeoutMs = 60_000) =>
  waitFor(
    async () => {
      const row = await taskRow(sql, taskId);
      return (TERMINAL_TASK_STATUSES as readonly string[]).includes(row.status) ? row : undefined;
    },
    timeoutMs,
    `task ${taskId} to finish`,
  );

/**
 * Moves `table`'s id sequence so that its next ids cross a power of ten after `before` of them
 * (…97, …98, …99, 100…): ids compared or sorted as text then come out in the wrong order.
 * Returns the first id at or above the power of ten.
 */
export async function idsCrossPowerOfTen(sql: Sql, table: string, before: number): Promise<bigint> {
  const [row] = await sql<{ next: string }[]>`
    select nextval(pg_get_serial_sequence(${table}, 'id'))::text as next`;
  let power = 10n;
  while (power <= BigInt(row?.next ?? 1) + BigInt(before)) power *= 10n;
  await sql`select setval(pg_get_serial_sequence(${table}, 'id'), ${(power - BigInt(before) - 1n).toString()})`;
  return power;
}

/** A task's events straight from the table, as [id, type], in numeric id order. */
export async function tableEvents(sql: Sql, taskId: string, after = "0"): Promise<[string, string][]> {
  const rows = await sql<{ id: string; type: string }[]>`
    select e.id, e.type from task_events e where e.task_id = ${taskId} and e.id > ${after} order by e.id`;
  return rows.map((r) => [String(r.id), r.type]);
}

/**
 * How many progress flushes (runProgress, recognised by its SQL) of other sessions in this database
 * are waiting for a lock: the sign that one has taken its snapshot and is blocked on a row.
 */
export async function progressFlushesWaiting(sql: Sql): Promise<number> {
  const rows = await sql`
    select 1 from pg_stat_activity
    where datname = current_database() and pid <> pg_backend_pid()
      and wait_event_type = 'Lock' and query like '%progress int%'`;
  return rows.length;
}

/** A promise with its resolve and reject at hand (Promise.withResolvers is ES2024; the lib is ES2023). */
export function deferred(): { promise: Promise<void>; resolve(): void; reject(e: unknown): void } {
  let resolve!: () => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}
