// `assay <command>`: the single entry point of the service and its tools.

import { migrateCommand } from "./cli/migrate.ts";
import { serveCommand } from "./cli/serve.ts";
import { storageCommand } from "./cli/storage.ts";
import { tokenCommand } from "./cli/token.ts";
import { UsageError } from "./cli/usage.ts";
import { ConfigError, configTable, loadConfig } from "./config.ts";

const HELP = `Usage: assay <command> [options]

Commands:
  api                 serve the HTTP API
  worker              run a worker (claims and executes analysis runs)
  all                 API and worker in one process (development)
  migrate             apply the database migrations in migrations/
  token create|revoke|list
                      manage API tokens
  storage migrate     copy a local installation's files into the S3 bucket
  config              print the configuration settings (environment variables)

Run \`assay <command> --help\` for a command's options.
Configuration comes from the environment; see \`assay config\`.`;

const CONFIG_HELP = `Usage: assay config

Prints every setting Assay reads from the environment, with its default and meaning.`;

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (!command || command === "--help" || command === "-h" || command === "help") {
    console.log(HELP);
    return command ? 0 : 2;
  }
  if (command === "config") {
    console.log(rest.includes("--help") ? CONFIG_HELP : configTable());
    return 0;
  }
  const wantsHelp = rest.includes("--help") || rest.includes("-h");
  // Help needs no configuration; everything else validates it first.
  const config = wantsHelp ? undefined : loadConfig();
  switch (command) {
    case "api":
    case "worker":
    case "all":
      return serveCommand(command, rest, config);
    case "migrate":
      return migrateCommand(rest, config);
    case "token":
      return tokenCommand(rest, config);
    case "storage":
      return storageCommand(rest, config);
    default:
      throw new UsageError(`unknown command: ${command}\n\n${HELP}`);
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    if (err instanceof ConfigError) {
      console.error(err.message);
      process.exitCode = 2;
    } else if (err instanceof UsageError) {
      console.error(`assay: ${err.message}`);
      process.exitCode = 2;
    } else {
      console.error(`assay: ${err instanceof Error ? err.message : String(err)}`);
      process.exitCode = 1;
    }
  },
);
