import type { Config } from "../config.ts";
import { openDatabase } from "../db/open.ts";
import { createLogger } from "../log.ts";
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
  const logger = createLogger({ level: "warn", destination: process.stderr });
  const database = await openDatabase(need(config), logger, { max: 1, migrate: true });
  await database.close();
  console.log("migrations applied");
  return 0;
}
