import path from "node:path";
import type { Config } from "../config.ts";
import { startEmbeddedPostgres } from "../db/embedded.ts";
import { runMigrations } from "../db/migrate.ts";
import { need, parse } from "./usage.ts";

const HELP = `Usage: assay migrate

Applies the migrations in migrations/ to DATABASE_URL (or to the embedded database under
$ASSAY_DATA_DIR/pg when DATABASE_URL is unset). Exits non-zero, printing the cause, on any error.`;

export async function migrateCommand(argv: string[], config: Config | undefined): Promise<number> {
  const { values } = parse({ args: argv, options: { help: { type: "boolean", short: "h" } } });
  if (values.help) {
    console.log(HELP);
    return 0;
  }
  const cfg = need(config);
  const embedded = cfg.databaseUrl
    ? undefined
    : await startEmbeddedPostgres({ dataDir: path.join(cfg.dataDir, "pg"), persistent: true });
  try {
    await runMigrations(cfg.databaseUrl ?? (embedded?.url as string));
    console.log("migrations applied");
    return 0;
  } finally {
    await embedded?.stop();
  }
}
