// Resolves the database a process uses: DATABASE_URL when set, else the embedded cluster under
// $ASSAY_DATA_DIR/pg (started or attached to, migrated, and stopped on close when we started it).
import path from "node:path";
import type { Config } from "../config.ts";
import type { Logger } from "../log.ts";
import { createDatabase, type Database, type PoolOptions } from "./client.ts";
import { type EmbeddedPostgres, startEmbeddedPostgres } from "./embedded.ts";
import { describeHolders, type MigrateOptions, type MigrationCounts, runMigrations } from "./migrate.ts";

export interface OpenedDatabase extends Database {
  readonly url: string;
  readonly embedded: boolean;
  /** What this open's run of the migrator found and left (when it ran one). */
  readonly migrations?: MigrationCounts;
}

export async function openDatabase(
  config: Config,
  logger: Logger,
  options: PoolOptions & { migrate?: boolean; migration?: MigrateOptions } = {},
): Promise<OpenedDatabase> {
  let embedded: EmbeddedPostgres | undefined;
  let url = config.databaseUrl;
  if (!url) {
    embedded = await startEmbeddedPostgres({
      dataDir: path.join(config.dataDir, "pg"),
      persistent: true,
      log: (message) => logger.info(message),
    });
    url = embedded.url;
  }
  let migrations: MigrationCounts | undefined;
  try {
    // The embedded database is ours to keep current; an external one is migrated by `assay migrate`.
    if (embedded || options.migrate)
      migrations = await runMigrations(url, {
        // Each attempt that waited lock_timeout for a table and is made again, with who held it up.
        onWait: ({ attempt, migration, holders, retryInMs }) =>
          logger.warn(
            { attempt, migration, holders: describeHolders(holders), retryInMs },
            "a migration waited for a lock held by another transaction; trying again",
          ),
        ...options.migration,
      });
  } catch (err) {
    await embedded?.stop();
    throw err;
  }
  const database = createDatabase(url, options);
  return {
    ...database,
    url,
    embedded: embedded !== undefined,
    ...(migrations === undefined ? {} : { migrations }),
    close: async () => {
      await database.close();
      await embedded?.stop();
    },
  };
}
