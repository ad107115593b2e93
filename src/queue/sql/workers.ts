// Worker registration and wake-ups.
import type { Sql } from "../../db/client.ts";
import { WAKEUP_CHANNEL } from "./shared.ts";

export interface WorkerInfo {
  id: string;
  host: string;
  pid: number;
  analysisTypes: string[];
  concurrency: number;
}

/** Registers (or re-registers) a worker and records that its types are served. */
export async function workerRegister(sql: Sql, w: WorkerInfo): Promise<void> {
  await sql`
    with w as (
      insert into workers (id, host, pid, analysis_types, concurrency)
      values (${w.id}, ${w.host}, ${w.pid}, ${w.analysisTypes}::text[], ${w.concurrency})
      on conflict (id) do update set heartbeat_at = now()
    )
    insert into analysis_type_seen (analysis_type, last_seen_at)
    select unnest(${w.analysisTypes}::text[]), now()
    on conflict (analysis_type) do update set last_seen_at = now()`;
}

/** The worker is alive: its row and its types' last-seen time move forward. */
export async function workerHeartbeat(sql: Sql, w: WorkerInfo): Promise<void> {
  await workerRegister(sql, w);
}

export async function workerDelete(sql: Sql, workerId: string): Promise<void> {
  await sql`delete from workers where id = ${workerId}`;
}

/** Deletes worker rows whose heartbeat is older than `staleMs`; returns how many. */
export async function workerDeleteStale(sql: Sql, staleMs: number): Promise<number> {
  const rows = await sql`
    delete from workers where heartbeat_at < now() - ${staleMs} * interval '1 millisecond' returning id`;
  return rows.length;
}

/** Wakes workers that can run `analysisType` (delivered at commit when called in a transaction). */
export async function runWake(sql: Sql, analysisType: string): Promise<void> {
  await sql`select pg_notify(${WAKEUP_CHANNEL}, ${analysisType})`;
}
