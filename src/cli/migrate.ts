import type { Config } from "../config.ts";
import {
  describeHolders,
  expectedMigrationCount,
  MIGRATION_LOCK_TIMEOUT_MS,
  MIGRATION_RETRY_FOR_MS,
  type MigrationCounts,
} from "../db/migrate.ts";
import { openDatabase } from "../db/open.ts";
import { createLogger } from "../log.ts";
import { need, parse, UsageError } from "./usage.ts";

const HELP = `Usage: assay migrate [--lock-timeout SECONDS] [--retry-for SECONDS]

Applies the migrations in migrations/ to DATABASE_URL (or to the embedded database under
$ASSAY_DATA_DIR/pg when DATABASE_URL is unset) and says how many it applied. A database a newer
release has migrated further is left as it is (exit 0). Exits non-zero, printing the cause, on any
error, and exits 1 when the database gives no answer within 30 s (a database slow to wake is waited
for that long; another migrator holding the migration lock, for as long as it takes).

All pending migrations are applied in one transaction. A statement that waits longer than
--lock-timeout for a table's lock (held by a long transaction; meanwhile every query on that table
queues behind it) rolls the attempt back, says on stderr which sessions held it up, and the attempt
is made again after a pause (1 s, doubling up to 15 s) for --retry-for, then exits 1 naming them.
  --lock-timeout SECONDS   each statement's wait for a lock (default ${MIGRATION_LOCK_TIMEOUT_MS / 1000})
  --retry-for SECONDS      how long attempts go on (default ${MIGRATION_RETRY_FOR_MS / 1000}); 0: one attempt

Example: DATABASE_URL=postgres://assay@db/assay npx assay migrate --retry-for 1800`;

/** A number of seconds from an option, as milliseconds. */
function seconds(name: string, value: string | undefined, fallbackMs: number, min: number): number {
  if (value === undefined) return fallbackMs;
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || n < min || n > 86_400)
    throw new UsageError(`--${name} must be a number of seconds from ${min} to 86400`);
  return Math.round(n * 1000);
}

export async function migrateCommand(argv: string[], config: Config | undefined): Promise<number> {
  const { values } = parse({
    args: argv,
    options: {
      help: { type: "boolean", short: "h" },
      "lock-timeout": { type: "string" },
      "retry-for": { type: "string" },
    },
  });
  if (values.help) {
    console.log(HELP);
    return 0;
  }
  const lockTimeoutMs = seconds("lock-timeout", values["lock-timeout"], MIGRATION_LOCK_TIMEOUT_MS, 0.001);
  const retryForMs = seconds("retry-for", values["retry-for"], MIGRATION_RETRY_FOR_MS, 0);
  const logger = createLogger({ level: "warn", destination: process.stderr });
  const database = await openDatabase(need(config), logger, {
    max: 1,
    migrate: true,
    migration: {
      lockTimeoutMs,
      retryForMs,
      // A line a person reads, as the report on stdout is.
      onWait: ({ attempt, migration, holders, retryInMs }) =>
        console.error(
          `assay migrate: attempt ${attempt}${migration === undefined ? "" : ` (${migration})`} waited ` +
            `${lockTimeoutMs / 1000} s for a lock and was rolled back` +
            (holders.length > 0 ? `; transactions open longer: ${describeHolders(holders)}` : "") +
            `; trying again in ${(retryInMs / 1000).toFixed(1)} s`,
        ),
    },
  });
  await database.close();
  // Always there: `migrate: true` runs the migrator.
  if (!database.migrations) throw new Error("the migrator did not run");
  console.log(migrationReport(database.migrations, expectedMigrationCount()));
  return 0;
}

/**
 * What a run of the migrator did, in one line. A database ahead of this release (a newer release
 * migrated it: a rolling deploy, or this one rolled back) is no error — migrations only add — but
 * saying "applied" then hid that nothing was.
 */
export function migrationReport({ before, after }: MigrationCounts, expected: number): string {
  if (after > expected)
    return `nothing applied: the database has ${after} migrations, more than this release's ${expected} (a newer release migrated it)`;
  // Drizzle applies only migrations newer than the last applied: an older one missing stays missing.
  if (after < expected)
    return `the database has ${after} of this release's ${expected} migrations: ${expected - after} older than its last were not applied`;
  if (after === before) return `nothing to apply: the database has all ${after} migrations`;
  const n = after - before;
  return `applied ${n} migration${n === 1 ? "" : "s"}: the database has all ${after}`;
}
