// The database a benchmark runs against: DATABASE_URL when set (an empty database; it is migrated),
// else a throwaway embedded PostgreSQL with default (durable) settings, fsync on.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { Sql } from "../../src/db/client.ts";
import { startEmbeddedPostgres } from "../../src/db/embedded.ts";
import { runMigrations } from "../../src/db/migrate.ts";

export interface BenchDatabase {
  url: string;
  /**
   * CPU milliseconds the PostgreSQL server has used so far (all its processes, from /proc), or
   * undefined when the server is not ours to look at (DATABASE_URL).
   */
  serverCpuMs(): number | undefined;
  stop(): Promise<void>;
}

const TICKS_PER_SECOND = 100; // USER_HZ on Linux

/** utime, stime, cutime, cstime and ppid of a process, from /proc/<pid>/stat. */
function procStat(pid: number): { own: number; children: number; ppid: number } | undefined {
  try {
    const text = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = text
      .slice(text.lastIndexOf(")") + 2)
      .split(" ")
      .map(Number);
    return {
      ppid: f[1] as number,
      own: ((f[11] as number) + (f[12] as number)) * (1000 / TICKS_PER_SECOND),
      children: ((f[13] as number) + (f[14] as number)) * (1000 / TICKS_PER_SECOND),
    };
  } catch {
    return undefined;
  }
}

/** The postmaster and its live children, and what its exited children used (counted when reaped). */
function clusterCpuMs(postmasterPid: number): number {
  const postmaster = procStat(postmasterPid);
  if (!postmaster) return Number.NaN;
  let total = postmaster.own + postmaster.children;
  for (const name of fs.readdirSync("/proc")) {
    const pid = Number(name);
    if (!Number.isInteger(pid)) continue;
    const stat = procStat(pid);
    if (stat?.ppid === postmasterPid) total += stat.own;
  }
  return total;
}

export async function benchDatabase(): Promise<BenchDatabase> {
  if (process.env.DATABASE_URL) {
    await runMigrations(process.env.DATABASE_URL);
    return { url: process.env.DATABASE_URL, serverCpuMs: () => undefined, stop: async () => {} };
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bench-"));
  const settings = process.env.BENCH_PG_SETTINGS
    ? (JSON.parse(process.env.BENCH_PG_SETTINGS) as Record<string, string>)
    : {};
  const pg = await startEmbeddedPostgres({ dataDir: path.join(dir, "pg"), persistent: false, settings });
  await runMigrations(pg.url);
  const pidFile = path.join(fs.realpathSync(path.join(dir, "pg")), "postmaster.pid");
  const postmasterPid = Number(fs.readFileSync(pidFile, "utf8").split("\n")[0]);
  return {
    url: pg.url,
    serverCpuMs: () => clusterCpuMs(postmasterPid),
    stop: async () => {
      await pg.stop();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

let checkpointRefused = false;

/**
 * A CHECKPOINT, before a measurement: the WAL written so far becomes segments to recycle. A fresh
 * cluster has none, so each 16 MB of WAL a measured workload writes makes one commit create a segment
 * (zero-filled and fsynced: `IO:WalInitSync`, ~10–20 ms here) while the commits behind it wait on
 * it and on the NOTIFY lock it holds — a stall a server that has run a while, recycling its segments
 * at each checkpoint, does not have (docs/architecture.md, Capacity). A database where the benchmark's
 * role may not checkpoint (DATABASE_URL; it needs superuser or pg_checkpoint) is measured as it is,
 * said once on stderr.
 */
export async function checkpoint(sql: Sql): Promise<void> {
  if (checkpointRefused) return;
  try {
    await sql`checkpoint`;
  } catch (err) {
    if ((err as { code?: string }).code !== "42501") throw err;
    checkpointRefused = true;
    process.stderr.write("bench: CHECKPOINT refused (not superuser or pg_checkpoint); measuring without\n");
  }
}

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return 0;
  const i = Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1);
  return sorted[Math.max(0, i)] as number;
}

export interface BenchLine {
  workload: string;
  N: number;
  C: number;
  seconds: number;
  rate: number;
  p50_ms: number;
  p90_ms: number;
  p99_ms: number;
  ok: boolean;
  [extra: string]: unknown;
}

/** One JSON line per workload, latencies in ms (rounded to 0.01). */
export function report(
  workload: string,
  n: number,
  c: number,
  seconds: number,
  latencies: number[],
  ok: boolean,
  extra = {},
) {
  const sorted = [...latencies].sort((a, b) => a - b);
  const r = (x: number) => Math.round(x * 100) / 100;
  const line: BenchLine = {
    workload,
    N: n,
    C: c,
    seconds: r(seconds),
    rate: Math.round(n / seconds),
    p50_ms: r(percentile(sorted, 50)),
    p90_ms: r(percentile(sorted, 90)),
    p99_ms: r(percentile(sorted, 99)),
    ok,
    ...extra,
  };
  console.log(JSON.stringify(line));
  return line;
}
