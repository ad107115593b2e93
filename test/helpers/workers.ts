// Worker processes for multi-process tests.
import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";
import type { Sql } from "../../src/db/client.ts";
import { ROOT, watch } from "./cli.ts";

export interface WorkerSpec {
  /** `program`: run the behave.mjs fixture as a real process (outputs under `dataDir`). */
  types: Record<string, { sleepMs: number; globalLimit?: number; program?: boolean }>;
  dataDir?: string;
  concurrency: number;
  /** ASSAY_USER_CONCURRENCY. */
  userLimit?: number;
  leaseTtlMs: number;
  reapIntervalMs: number;
  graceMs?: number;
}

export interface WorkerProcess {
  child: ChildProcess;
  id: string;
  /** Resolves with the exit code when the process ends. */
  exited: Promise<number | null>;
}

export async function startWorkerProcess(url: string, spec: WorkerSpec): Promise<WorkerProcess> {
  const child = spawn(
    process.execPath,
    ["--import", "tsx", path.join(ROOT, "test/fixtures/queue-worker.ts")],
    {
      env: { ...process.env, DATABASE_URL: url, WORKER_SPEC: JSON.stringify(spec) },
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  const exited = new Promise<number | null>((resolve) => child.on("close", (code) => resolve(code)));
  const [, id] = await watch(child).waitFor(/ready (\S+)/);
  return { child, id: id as string, exited };
}

export async function createExecutionsTable(sql: Sql): Promise<void> {
  await sql`
    create table test_executions (
      id bigserial primary key, run_id bigint not null, attempt int not null, worker_id text not null,
      lease_token uuid not null, started_at timestamptz not null default clock_timestamp(), ended_at timestamptz
    )`;
}

/**
 * The most executions that overlapped in time (ended ones, plus open ones as still running; with
 * `endedOnly`, ended ones only — an execution of a SIGKILLed worker never ends).
 */
export async function maxOverlap(sql: Sql, runIds?: number[], endedOnly = false): Promise<number> {
  const [row] = await sql<{ n: number }[]>`
    with e as (
      select started_at, coalesce(ended_at, 'infinity') as ended_at from test_executions
      where ${runIds ? sql`run_id = any(${sql.array(runIds, 20)}::bigint[])` : sql`true`}
        and (${!endedOnly} or ended_at is not null)
    ),
    points as (select started_at as t, 1 as d from e union all select ended_at, -1 from e)
    select coalesce(max(running), 0)::int as n from (
      select sum(d) over (order by t, d) as running from points
    ) x`;
  return row?.n ?? 0;
}
