// What every client command shares: the common options (--url, --token, --json, --help), the client
// built from them and the environment, Ctrl-C as an abort signal, and turning any failure into its
// exit code. Nothing here (or in anything a client command imports) loads the server or its
// configuration: a client command starts in a fraction of a second.
import { type ParseArgsConfig, parseArgs } from "node:util";
import { ClientUsageError, Interrupted, ServerProblem } from "../client/exit.ts";
import { ApiClient } from "../client/http.ts";
import { Output } from "../client/output.ts";

export const DEFAULT_URL = "http://127.0.0.1:3000";

export const COMMON_OPTIONS = {
  url: { type: "string" },
  token: { type: "string" },
  json: { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const;

export const COMMON_HELP = `Common options:
  --url URL      the server (default $ASSAY_URL, else ${DEFAULT_URL})
  --token T      the API token (default $ASSAY_TOKEN; prefer the variable: arguments show in ps)
  --json         one JSON line per result, nothing drawn (the default when stdout is not a terminal)
  -h, --help     this help

Exit codes: 0 done (the task succeeded), 1 the task failed, partially succeeded, timed out or was
cancelled, 2 usage or validation error, 3 cannot reach or authenticate with the server, 130 Ctrl-C.`;

export interface ClientContext {
  client: ApiClient;
  out: Output;
  /** Aborted by Ctrl-C (reason: Interrupted). A second Ctrl-C exits at once. */
  signal: AbortSignal;
}

type Options = NonNullable<ParseArgsConfig["options"]>;

/** Parses `argv` with the common options added; usage errors become ClientUsageError. */
export function parseClientArgs<O extends Options>(argv: string[], options: O) {
  try {
    return parseArgs({
      args: argv,
      options: { ...COMMON_OPTIONS, ...options },
      allowPositionals: true,
      strict: true,
    });
  } catch (err) {
    throw new ClientUsageError((err as Error).message);
  }
}

function clientFrom(values: { url?: string | undefined; token?: string | undefined }): ApiClient {
  const url = values.url ?? (process.env.ASSAY_URL || DEFAULT_URL);
  try {
    const parsed = new URL(url);
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") throw new Error("not http");
  } catch {
    throw new ClientUsageError(`not an http(s) URL: ${url}`);
  }
  const token = values.token ?? process.env.ASSAY_TOKEN;
  if (!token) throw new ServerProblem("no API token: set ASSAY_TOKEN (or pass --token)");
  return new ApiClient(url, token);
}

/** Ctrl-C aborts the returned signal once; a second Ctrl-C exits at once with 130. */
function interrupts(): { signal: AbortSignal; dispose: () => void } {
  const controller = new AbortController();
  const onSigint = () => {
    if (controller.signal.aborted) process.exit(130);
    controller.abort(new Interrupted("interrupted"));
  };
  process.on("SIGINT", onSigint);
  return { signal: controller.signal, dispose: () => process.off("SIGINT", onSigint) };
}

export interface CommandSpec<O extends Options> {
  help: string;
  options: O;
  run: (ctx: ClientContext, args: ReturnType<typeof parseClientArgs<O>>) => Promise<number>;
}

/** Runs a client command: --help, the context, and every failure as one message and its exit code. */
export async function runClientCommand<O extends Options>(
  spec: CommandSpec<O>,
  argv: string[],
): Promise<number> {
  const wantsJson = argv.includes("--json");
  const out = new Output({ json: wantsJson });
  const stop = interrupts();
  try {
    const args = parseClientArgs(argv, spec.options);
    if ((args.values as { help?: boolean }).help) {
      process.stdout.write(`${spec.help}\n\n${COMMON_HELP}\n`);
      return 0;
    }
    const ctx: ClientContext = {
      client: clientFrom(args.values as { url?: string; token?: string }),
      out,
      signal: stop.signal,
    };
    return await spec.run(ctx, args);
  } catch (err) {
    if (err instanceof ClientUsageError) {
      const code = out.fail(err);
      if (!out.json)
        process.stderr.write(`Run \`assay ${commandName(spec.help)} --help\` for its options.\n`);
      return code;
    }
    return out.fail(err);
  } finally {
    stop.dispose();
  }
}

const commandName = (help: string) => /Usage: assay (\S+)/.exec(help)?.[1] ?? "<command>";

/** A positional task id: digits only (the server answers anything else with 404 anyway). */
export function taskIdArg(positionals: string[], usage: string): string {
  const [id, ...extra] = positionals;
  if (!id || extra.length > 0) throw new ClientUsageError(`usage: ${usage}`);
  if (!/^[1-9][0-9]{0,17}$/.test(id)) throw new ClientUsageError(`not a task id: ${id}`);
  return id;
}

/** A positive integer option. */
export function intOption(value: string | undefined, name: string, fallback: number, max: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > max)
    throw new ClientUsageError(`--${name} must be an integer from 1 to ${max}`);
  return n;
}
