// `assay <command>`: the single entry point of the service, its tools and its command-line client.

// Commands are imported when chosen: a client command or --help loads neither the server nor its
// configuration (a client command talks to a server over HTTP only; see src/cli/client-*.ts).
import { UsageError } from "./cli/usage.ts";

/** Set by bin/build.js in the bundle: the version and when the bundle was built. */
declare const __ASSAY_BUILD__: string | undefined;

/** The version, and whether the bundle or the sources are running (bin/bundle.js). */
async function describeBuild(): Promise<string> {
  if (typeof __ASSAY_BUILD__ === "string") return __ASSAY_BUILD__;
  const { readFile } = await import("node:fs/promises");
  const pkg = JSON.parse(await readFile(new URL("../package.json", import.meta.url), "utf8")) as {
    version: string;
  };
  return `${pkg.version} (sources)`;
}

const HELP = `Usage: assay <command> [options]

Server commands (configured by the environment; see \`assay config\`):
  api                 serve the HTTP API
  worker              run a worker (claims and executes analysis runs)
  all                 API and worker in one process (development)
  migrate             apply the database migrations in migrations/
  token create|revoke|list
                      manage API tokens
  storage migrate     copy a local installation's files into the S3 bucket
  config              print the configuration settings (environment variables)

Client commands (talk to a server over HTTP: ASSAY_URL, ASSAY_TOKEN):
  submit              upload files or folders and create a task (--follow, --out DIR)
  tasks               list tasks
  status <taskId>     a task and its runs
  follow <taskId>     show a task live until it ends
  logs <taskId>       a task's events (--follow to keep printing)
  cancel <taskId>     cancel a task
  download <taskId>   a finished task's outputs into a folder
  files [rm <id>...]  list uploaded files, or delete some
  types               the analysis types and their parameters

  --version           the version, and whether the bundle or the sources run

Run \`assay <command> --help\` for a command's options and an example.`;

const CONFIG_HELP = `Usage: assay config [--values [--json]]

Prints every setting Assay reads from the environment, with its default and meaning.

  --values   validate this environment as \`assay api\` would (exit 2 naming each bad setting) and
             print each setting's value in effect and where it came from: environment, default,
             derived (from other settings) or not set. Secrets are not shown; a URL's password is ***.
             ASSAY_* variables nothing reads are named on stderr.
  --json     with --values: one JSON object, {"VARIABLE": {"value", "masked", "from"}, ...}

Example: DATABASE_URL=postgres://assay@db/assay npx assay config --values`;

type ClientCommand = (argv: string[]) => Promise<number>;

const CLIENT_COMMANDS: Record<string, () => Promise<ClientCommand>> = {
  submit: async () => (await import("./cli/client-submit.ts")).submitCommand,
  follow: async () => (await import("./cli/client-follow.ts")).followCommand,
  logs: async () => (await import("./cli/client-follow.ts")).logsCommand,
  tasks: async () => (await import("./cli/client-tasks.ts")).tasksCommand,
  status: async () => (await import("./cli/client-tasks.ts")).statusCommand,
  cancel: async () => (await import("./cli/client-tasks.ts")).cancelCommand,
  download: async () => (await import("./cli/client-download.ts")).downloadCommand,
  files: async () => (await import("./cli/client-tasks.ts")).filesCommand,
  types: async () => (await import("./cli/client-tasks.ts")).typesCommand,
};

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (!command || command === "--help" || command === "-h" || command === "help") {
    console.log(HELP);
    return command ? 0 : 2;
  }
  if (command === "--version") {
    console.log(`assay ${await describeBuild()}`);
    return 0;
  }
  const client = Object.hasOwn(CLIENT_COMMANDS, command) ? CLIENT_COMMANDS[command] : undefined;
  if (client) return (await client())(rest);
  return serverCommand(command, rest);
}

async function serverCommand(command: string, rest: string[]): Promise<number> {
  const { loadConfig } = await import("./config.ts");
  if (command === "config") return configCommand(rest);
  const wantsHelp = rest.includes("--help") || rest.includes("-h");
  // Help needs no configuration; everything else validates it first.
  const config = wantsHelp ? undefined : loadConfig();
  switch (command) {
    case "api":
    case "worker":
    case "all":
      return (await import("./cli/serve.ts")).serveCommand(command, rest, config);
    case "migrate":
      await ignoreDroppedTypeReads();
      return (await import("./cli/migrate.ts")).migrateCommand(rest, config);
    case "token":
      await ignoreDroppedTypeReads();
      return (await import("./cli/token.ts")).tokenCommand(rest, config);
    case "storage":
      return (await import("./cli/storage.ts")).storageCommand(rest, config);
    default:
      throw new UsageError(`unknown command: ${command}\n\n${HELP}`);
  }
}

async function configCommand(args: string[]): Promise<number> {
  const config = await import("./config.ts");
  const unknown = args.find((a) => !["--values", "--json", "--help", "-h"].includes(a));
  if (unknown !== undefined) throw new UsageError(`config: unknown option ${unknown}\n\n${CONFIG_HELP}`);
  if (args.includes("--help") || args.includes("-h")) {
    console.log(CONFIG_HELP);
    return 0;
  }
  if (!args.includes("--values")) {
    if (args.includes("--json")) throw new UsageError(`config: --json goes with --values\n\n${CONFIG_HELP}`);
    console.log(config.configTable());
    return 0;
  }
  const settings = config.configInEffect();
  for (const { name, nearest } of config.unknownVariables()) {
    console.error(
      `assay: ${name} is set but nothing reads it${nearest ? ` (did you mean ${nearest}?)` : ""}`,
    );
  }
  if (args.includes("--json")) {
    const out = Object.fromEntries(settings.map(({ variable, ...rest }) => [variable, rest]));
    console.log(JSON.stringify(out, null, 2));
  } else console.log(config.configInEffectText(settings));
  return 0;
}

/**
 * For `migrate` and `token`: the rejection of the array-type read postgres.js makes before a new
 * connection's first query, and drops (droppedTypeRead), is no failure of the command, whose own query
 * fails with the cause (or is made again on a new connection). Unhandled, it crashed the command with
 * postgres.js's CONNECTION_DESTROYED and a stack when firstAnswer ended a client whose database had
 * authenticated it but gave no answer, in place of that message. Any other unhandled rejection still
 * ends the process as Node's default does.
 */
async function ignoreDroppedTypeReads(): Promise<void> {
  const { droppedTypeRead } = await import("./db/client.ts");
  process.on("unhandledRejection", (reason) => {
    if (!droppedTypeRead(reason)) throw reason;
  });
}

/**
 * An error for stderr: its message and its causes' — drizzle's "Failed query: <SQL>" carries
 * PostgreSQL's own error (relation "users" already exists) only as its cause — each with its code
 * (SQLSTATE for PostgreSQL's) and PostgreSQL's detail and hint.
 */
function describeError(err: unknown): string {
  const lines: string[] = [];
  let e: unknown = err;
  for (let depth = 0; e !== undefined && e !== null && depth < 10; depth++) {
    if (!(e instanceof Error)) {
      lines.push(String(e));
      break;
    }
    const { code, detail, hint } = e as { code?: unknown; detail?: unknown; hint?: unknown };
    let line = e.message;
    // An AggregateError (a connection refused on every address) may have no message of its own.
    if (e instanceof AggregateError && e.errors.length > 0) {
      const inner = e.errors.map((x) => (x instanceof Error ? x.message : String(x)));
      line = [line, ...inner].filter(Boolean).join("; ");
    }
    if (typeof code === "string" && !line.includes(code)) {
      line += e.name === "PostgresError" ? ` (SQLSTATE ${code})` : ` (${code})`;
    }
    if (typeof detail === "string" && detail) line += `\n  detail: ${detail}`;
    if (typeof hint === "string" && hint) line += `\n  hint: ${hint}`;
    lines.push(line);
    e = e.cause;
  }
  return lines.join("\n  caused by: ");
}

/**
 * How long a failed command may take to end by itself once it has reported why. It closes what it
 * opened and exits; should a handle stay open anyway, the process still exits (a supervisor's restart
 * must not wait on it forever).
 */
const FAILED_EXIT_MS = 30_000;

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    // ConfigError by name: importing config.ts here would load it for every command.
    if (err instanceof Error && err.name === "ConfigError") {
      console.error(err.message);
      process.exitCode = 2;
    } else if (err instanceof UsageError) {
      console.error(`assay: ${err.message}`);
      process.exitCode = 2;
    } else {
      console.error(`assay: ${describeError(err)}`);
      process.exitCode = 1;
    }
    // A database that gave no answer (firstAnswer): its client is ended, and what is left is
    // postgres.js's connection attempt in flight, which nothing can close before its connect timeout
    // (31 s for migrate and token): nothing of ours to wait for.
    const lingering = err instanceof Error && err.name === "NoAnswerError" ? 0 : FAILED_EXIT_MS;
    setTimeout(() => process.exit(), lingering).unref();
  },
);
