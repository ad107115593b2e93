import type { Config } from "../config.ts";
import { expectedMigrationCount, type MigrationCounts } from "../db/migrate.ts";
import { openDatabase } from "../db/open.ts";
import { createLogger } from "../log.ts";
import { need, parse } from "./usage.ts";

const HELP = `Usage: assay migrate

Applies the migrations in migrations/ to DATABASE_URL (or to the embedded database under
$ASSAY_DATA_DIR/pg when DATABASE_URL is unset) and says how many it applied. A database a newer
release has migrated further is left as it is (exit 0). Exits non-zero, printing the cause, on any
error, and exits 1 when the database gives no answer within 30 s (a database slow to wake is waited
for that long; another migrator holding the migration lock, for as long as it takes).`;

export async function migrateCommand(argv: string[], config: Config | undefined): Promise<number> {
  const { values } = parse({ args: argv, options: { help: { type: "boolean", short: "h" } } });
  if (values.help) {
    console.log(HELP);
    return 0;
  }
  const logger = createLogger({ level: "warn", destination: process.stderr });
  const database = await openDatabase(need(config), logger, { max: 1, migrate: true });
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
