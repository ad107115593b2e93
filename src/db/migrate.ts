// Applies migrations/ with drizzle's migrator. Serialised across processes by an advisory lock,
// so several instances starting at once do not race over the same migration.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type postgres from "postgres";
import { createDatabase, firstAnswer } from "./client.ts";

export const MIGRATIONS_DIR = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  "..",
  "..",
  "migrations",
);
/** Arbitrary, fixed: the advisory lock key that serialises migrators. */
const MIGRATION_LOCK_KEY = 0x61737361; // "assa"

/**
 * How long `assay migrate` and `assay token` wait for the database's first answer (firstAnswer) before
 * they fail: postgres.js's own connect timeout, which was their bound before they had one, so a
 * database slow to wake (a paused serverless one resumes in 15 to 30 s) is still waited for. (Start-up
 * of `api`, `worker` and `all` probes for DB_ANSWER_MS and tries again.)
 */
export const COMMAND_ANSWER_MS = 30_000;
/** Their connect timeout: just after COMMAND_ANSWER_MS, so firstAnswer's message wins. */
export const COMMAND_CONNECT_MS = COMMAND_ANSWER_MS + 1_000;

/** Number of migrations the code expects to be applied. */
export function expectedMigrationCount(): number {
  const journal = JSON.parse(fs.readFileSync(path.join(MIGRATIONS_DIR, "meta", "_journal.json"), "utf8")) as {
    entries: unknown[];
  };
  return journal.entries.length;
}

/** How many migrations the database had applied before a run of the migrator, and after it. */
export interface MigrationCounts {
  before: number;
  after: number;
}

export async function runMigrations(url: string): Promise<MigrationCounts> {
  // Imported here, not at the top: drizzle's postgres-js driver costs ~0.6 s and ~160 MiB of heap to
  // load, and a worker or an API that does not migrate (every one but the embedded `assay all` and
  // `assay migrate`) must not pay for it at start-up (bench/startup.ts).
  const [{ drizzle }, { migrate }] = await Promise.all([
    import("drizzle-orm/postgres-js"),
    import("drizzle-orm/postgres-js/migrator"),
  ]);
  // A client of its own (drizzle's driver rewrites the parsers of the client it wraps), made as every
  // pool is: its connections paced, so a proxy with nothing behind it is not sent one per millisecond
  // for the 30 s of the bound.
  const { sql, close } = createDatabase(url, {
    max: 1,
    connectTimeoutMs: COMMAND_CONNECT_MS,
    applicationName: "assay-migrate",
  });
  try {
    // Bounded: a database that never answers failed no deploy script, it hung it (the lock's own wait,
    // for another migrator, is not).
    await firstAnswer(sql, COMMAND_ANSWER_MS);
    await sql`select pg_advisory_lock(${MIGRATION_LOCK_KEY})`;
    const before = await appliedMigrationCount(sql);
    await migrate(drizzle(sql), { migrationsFolder: MIGRATIONS_DIR });
    return { before, after: await appliedMigrationCount(sql) };
  } finally {
    await close();
  }
}

/** How many migrations the database has applied (0 when it has never been migrated). */
export async function appliedMigrationCount(sql: postgres.Sql): Promise<number> {
  // Two statements: a query naming a missing table fails to parse, whatever its CASE says.
  const [exists] = await sql`select to_regclass('drizzle.__drizzle_migrations') is not null as ok`;
  if (!exists?.ok) return 0;
  const [row] = await sql<{ n: number }[]>`select count(*)::int as n from drizzle.__drizzle_migrations`;
  return row?.n ?? 0;
}
