// The database a benchmark runs against: DATABASE_URL when set (an empty database; it is migrated),
// else a throwaway embedded PostgreSQL with default (durable) settings, fsync on.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { startEmbeddedPostgres } from "../../src/db/embedded.ts";
import { runMigrations } from "../../src/db/migrate.ts";

export interface BenchDatabase {
  url: string;
  stop(): Promise<void>;
}

export async function benchDatabase(): Promise<BenchDatabase> {
  if (process.env.DATABASE_URL) {
    await runMigrations(process.env.DATABASE_URL);
    return { url: process.env.DATABASE_URL, stop: async () => {} };
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bench-"));
  const settings = process.env.BENCH_PG_SETTINGS
    ? (JSON.parse(process.env.BENCH_PG_SETTINGS) as Record<string, string>)
    : {};
  const pg = await startEmbeddedPostgres({ dataDir: path.join(dir, "pg"), persistent: false, settings });
  await runMigrations(pg.url);
  return {
    url: pg.url,
    stop: async () => {
      await pg.stop();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
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
