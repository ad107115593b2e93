// Applies migrations/ with drizzle's migrator. Serialised across processes by an advisory lock, so
// several instances starting at once do not race over the same migration; each statement waits at
// most lock_timeout for a table's lock, and an attempt that times out is rolled back and made again.
// Also tells how the database's schema stands against this code (schemaState), for start-up.
import fs from "node:fs";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
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

/**
 * How long each statement of a migration may wait for a table's lock (PostgreSQL's `lock_timeout`)
 * before its attempt is rolled back and made again. An ALTER TABLE waits for every transaction open
 * on its table, and while it waits, every statement on that table queues behind it: a long transaction
 * (a big cancel, a report left open) froze the queue's claims and the API's reads for as long as it
 * lasted. With the bound they stall at most this long per attempt.
 */
export const MIGRATION_LOCK_TIMEOUT_MS = 2_000;
/** How long the attempts go on before `assay migrate` gives up, saying which sessions held it up. */
export const MIGRATION_RETRY_FOR_MS = 10 * 60_000;
/** The pause after a first attempt that timed out; doubled after each, up to MIGRATION_PAUSE_MAX_MS. */
const MIGRATION_PAUSE_MS = 1_000;
const MIGRATION_PAUSE_MAX_MS = 15_000;

interface JournalEntry {
  tag: string;
  /** drizzle's `folderMillis`: what `drizzle.__drizzle_migrations.created_at` records. */
  when: number;
}

function journal(): JournalEntry[] {
  const parsed = JSON.parse(fs.readFileSync(path.join(MIGRATIONS_DIR, "meta", "_journal.json"), "utf8")) as {
    entries: JournalEntry[];
  };
  return parsed.entries;
}

/** Number of migrations the code expects to be applied. */
export function expectedMigrationCount(): number {
  return journal().length;
}

/** How many migrations the database had applied before a run of the migrator, and after it. */
export interface MigrationCounts {
  before: number;
  after: number;
}

/** A session whose transaction has been open for a while: what a migration's lock may wait for. */
export interface OpenTransaction {
  pid: number;
  applicationName: string;
  state: string;
  seconds: number;
}

/** An attempt of the migrator that waited `lock_timeout` for a lock and was rolled back. */
export interface MigrationWait {
  attempt: number;
  /** The migration whose statement waited (its tag), when it could be told. */
  migration: string | undefined;
  /** Sessions with a transaction open longer than the lock timeout, oldest first (at most 5). */
  holders: OpenTransaction[];
  /** The pause before the next attempt. */
  retryInMs: number;
}

export interface MigrateOptions {
  /** `lock_timeout` of each attempt (default MIGRATION_LOCK_TIMEOUT_MS). */
  lockTimeoutMs?: number;
  /** How long attempts go on (default MIGRATION_RETRY_FOR_MS); 0: one attempt. */
  retryForMs?: number;
  /** Told of each attempt that timed out and is to be made again. */
  onWait?: (wait: MigrationWait) => void;
}

/** The migrator's attempts all waited too long for a lock: nothing was applied. */
export class MigrationLockError extends Error {
  override name = "MigrationLockError";
}

/** Says what a list of sessions is, for a message: `pid 12 (assay-api, idle in transaction, 42 s)`. */
export function describeHolders(holders: OpenTransaction[]): string {
  return holders
    .map((h) => `pid ${h.pid} (${h.applicationName || "no application_name"}, ${h.state}, ${h.seconds} s)`)
    .join("; ");
}

export async function runMigrations(url: string, options: MigrateOptions = {}): Promise<MigrationCounts> {
  const lockTimeoutMs = options.lockTimeoutMs ?? MIGRATION_LOCK_TIMEOUT_MS;
  const retryForMs = options.retryForMs ?? MIGRATION_RETRY_FOR_MS;
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
  // The connection kept for good (postgres.js ends each after 30–60 minutes by default): the advisory
  // lock and lock_timeout are the session's, and the retries may last longer than that.
  const { sql, close } = createDatabase(url, {
    max: 1,
    connectTimeoutMs: COMMAND_CONNECT_MS,
    applicationName: "assay-migrate",
    keepConnections: true,
  });
  try {
    // Bounded: a database that never answers failed no deploy script, it hung it (the lock's own wait,
    // for another migrator, is not).
    await firstAnswer(sql, COMMAND_ANSWER_MS);
    // One connection (max: 1), so the advisory lock, the setting and drizzle's transaction share it.
    await takeMigrationLock(sql, lockTimeoutMs);
    const before = await appliedMigrationCount(sql);
    const deadline = performance.now() + retryForMs;
    let pauseMs = MIGRATION_PAUSE_MS;
    for (let attempt = 1; ; attempt++) {
      // Again before every attempt after the first: a connection made again since (a network blip, a
      // restart: the pause between attempts is long enough for one) holds neither the advisory lock nor
      // the setting, and another migrator could apply the same migrations beside this one (drizzle
      // reads what is applied outside its transaction). The session that holds the lock takes it once
      // more (it is held until the session ends). A drop between this and drizzle's transaction is
      // not covered: nothing outside drizzle's transaction can be.
      if (attempt > 1) await takeMigrationLock(sql, lockTimeoutMs);
      try {
        // drizzle applies every pending migration in one transaction: a timed-out attempt leaves nothing.
        await migrate(drizzle(sql), { migrationsFolder: MIGRATIONS_DIR });
        break;
      } catch (err) {
        if (!lockTimedOut(err)) throw err;
        const migration = migrationOf(err);
        const holders = await openTransactions(sql, lockTimeoutMs);
        const retryInMs = Math.round(pauseMs * (1 + Math.random() / 4));
        if (performance.now() + retryInMs > deadline) {
          throw new MigrationLockError(
            `could not apply ${migration === undefined ? "the pending migrations" : `migration ${migration}`}: ` +
              `a lock it needs stayed held by other transactions through ${attempt} attempt${attempt === 1 ? "" : "s"} ` +
              `over ${Math.round(retryForMs / 1000)} s (each waited ${lockTimeoutMs / 1000} s, its lock_timeout, ` +
              "and was rolled back: nothing was applied). " +
              (holders.length > 0
                ? `Transactions open longer than that: ${describeHolders(holders)}. `
                : "No transaction is open that long now. ") +
              "End them (pg_stat_activity, pg_terminate_backend) or run `assay migrate` again when the database is quieter.",
            { cause: err },
          );
        }
        options.onWait?.({ attempt, migration, holders, retryInMs });
        await sleep(retryInMs);
        pauseMs = Math.min(MIGRATION_PAUSE_MAX_MS, pauseMs * 2);
      }
    }
    return { before, after: await appliedMigrationCount(sql) };
  } finally {
    await close();
  }
}

/**
 * Takes the migrators' advisory lock for this session, waiting for another migrator as long as it
 * takes (that one holds no table of the queue's), then sets the session's lock_timeout for the
 * migration's statements. Set with SET, not as a startup parameter, which a pooler such as PgBouncer
 * refuses (`unsupported startup parameter`).
 */
async function takeMigrationLock(sql: postgres.Sql, lockTimeoutMs: number): Promise<void> {
  await sql`select set_config('lock_timeout', '0', false)`;
  // A session lock: it outlives the statement, and is held until the session ends.
  await sql`select pg_advisory_lock(${MIGRATION_LOCK_KEY})`;
  await sql`select set_config('lock_timeout', ${`${Math.max(1, Math.round(lockTimeoutMs))}ms`}, false)`;
}

/** Whether `err` (or a cause of it: drizzle wraps PostgreSQL's error) is a lock_timeout's (55P03). */
function lockTimedOut(err: unknown): boolean {
  for (let e = err, depth = 0; e !== null && typeof e === "object" && depth < 10; depth++) {
    if ((e as { code?: unknown }).code === "55P03") return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/** The tag of the migration holding the statement drizzle's error names (`err.query`), if any. */
function migrationOf(err: unknown): string | undefined {
  const query = (err as { query?: unknown } | null)?.query;
  if (typeof query !== "string" || query.trim() === "") return undefined;
  for (const { tag } of journal()) {
    let text: string;
    try {
      text = fs.readFileSync(path.join(MIGRATIONS_DIR, `${tag}.sql`), "utf8");
    } catch {
      continue;
    }
    if (text.split("--> statement-breakpoint").some((statement) => statement === query)) return tag;
  }
  return undefined;
}

/** Sessions of this database, other than `sql`'s, whose transaction is older than `olderThanMs`. */
async function openTransactions(sql: postgres.Sql, olderThanMs: number): Promise<OpenTransaction[]> {
  // Text and int casts: drizzle's driver has rewritten this client's parsers.
  const rows = await sql<{ pid: number; app: string; state: string; seconds: number }[]>`
    select pid::int as pid, coalesce(application_name, '') as app, coalesce(state, '') as state,
           floor(extract(epoch from now() - xact_start))::int as seconds
    from pg_stat_activity
    where datname = current_database() and pid <> pg_backend_pid() and xact_start is not null
      and xact_start < now() - make_interval(secs => ${olderThanMs / 1000})
    order by xact_start
    limit 5`;
  return rows.map((r) => ({ pid: r.pid, applicationName: r.app, state: r.state, seconds: r.seconds }));
}

/**
 * Where the database's schema stands against this code's migrations:
 * - `unmigrated`: no migration applied (an empty database);
 * - `older`: `pending` are this code's migrations newer than the database's last, which `assay migrate`
 *   applies; the code must not run on it;
 * - `newer`: the database has migrations this code does not know (a newer release migrated it: a
 *   rolling upgrade under way, or this release rolled back to); fine while they only add, as a
 *   release's migrations must (docs/operations.md, "Upgrading");
 * - `current`.
 * Told by drizzle's own record (`created_at` is each migration's journal `when`), as its migrator does.
 */
export type SchemaState =
  | { kind: "unmigrated" | "current" | "newer"; applied: number; expected: number }
  | { kind: "older"; applied: number; expected: number; pending: string[] };

export async function schemaState(sql: postgres.Sql): Promise<SchemaState> {
  const entries = journal();
  const expected = entries.length;
  const [exists] = await sql`select to_regclass('drizzle.__drizzle_migrations') is not null as ok`;
  if (!exists?.ok) return { kind: "unmigrated", applied: 0, expected };
  // Text: a bigint, which postgres.js would return as a string anyway.
  const [row] = await sql<{ n: number; last: string | null }[]>`
    select count(*)::int as n, max(created_at)::text as last from drizzle.__drizzle_migrations`;
  const applied = row?.n ?? 0;
  if (applied === 0 || row?.last == null) return { kind: "unmigrated", applied, expected };
  const last = Number(row.last);
  const pending = entries.filter((e) => e.when > last).map((e) => e.tag);
  if (pending.length > 0) return { kind: "older", applied, expected, pending };
  return { kind: last > (entries.at(-1)?.when ?? 0) ? "newer" : "current", applied, expected };
}

/**
 * A process whose code is newer than the database's schema (`assay migrate` not run yet for this
 * release): start-up refuses it, saying so, rather than fail later on a missing column.
 */
export class SchemaTooOldError extends Error {
  override name = "SchemaTooOldError";
}

export function schemaTooOld(state: Extract<SchemaState, { kind: "older" }>): SchemaTooOldError {
  const n = state.pending.length;
  return new SchemaTooOldError(
    `the database is not migrated to this version: it lacks ${n} of this release's migrations ` +
      `(${state.pending.join(", ")}): run \`assay migrate\` with this release first`,
  );
}

/** How many migrations the database has applied (0 when it has never been migrated). */
export async function appliedMigrationCount(sql: postgres.Sql): Promise<number> {
  // Two statements: a query naming a missing table fails to parse, whatever its CASE says.
  const [exists] = await sql`select to_regclass('drizzle.__drizzle_migrations') is not null as ok`;
  if (!exists?.ok) return 0;
  const [row] = await sql<{ n: number }[]>`select count(*)::int as n from drizzle.__drizzle_migrations`;
  return row?.n ?? 0;
}
