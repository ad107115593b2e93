// What every client command shares: the common options (--url, --token, --json, --help), the client
// built from them and the environment, Ctrl-C as an abort signal, and turning any failure into its
// exit code. Nothing here (or in anything a client command imports) loads the server or its
// configuration: a client command starts in a fraction of a second.
import { type ParseArgsConfig, parseArgs } from "node:util";
import {
  ClientUsageError,
  EXIT,
  exitCodeOf,
  Interrupted,
  OutputClosed,
  ServerProblem,
  Terminated,
} from "../client/exit.ts";
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
  -h, --help     this help`;

/**
 * A command's "Exit codes:" paragraph (docs/cli.md, Exit codes): its own codes (`codes`), then the
 * codes every command has — 3 for the server, 130 for Ctrl-C (`interrupted`, what it means there),
 * 141 for a closed stdout — wrapped to 100 columns. Until 2026-12-07 every command's help listed a
 * task's outcomes, meaningless for tasks, types, status or files.
 */
export function exitCodesHelp(codes: string[], interrupted = "Ctrl-C"): string {
  const all = [
    ...codes,
    "3 the server cannot be reached, refuses the token, or fails (5xx)",
    `130 ${interrupted} (143 SIGTERM, 129 SIGHUP)`,
    "141 stdout was closed by its reader (`| head`)",
  ];
  const lines: string[] = [];
  let line = "Exit codes:";
  for (const word of `${all.join("; ")}.`.split(" ")) {
    if (line.length + 1 + word.length > 100) {
      lines.push(line);
      line = word;
    } else line += ` ${word}`;
  }
  return [...lines, line].join("\n");
}

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
    // Node's own words, in lines ("…is ambiguous.\nDid you forget…"): printed as lines.
    throw new ClientUsageError((err as Error).message, { ownLines: true });
  }
}

function clientFrom(
  values: { url?: string | undefined; token?: string | undefined },
  out: Output,
): ApiClient {
  const url = values.url ?? (process.env.ASSAY_URL || DEFAULT_URL);
  let parsed: URL | undefined;
  try {
    parsed = new URL(url);
  } catch {}
  if (parsed?.protocol !== "http:" && parsed?.protocol !== "https:")
    throw new ClientUsageError(`not an http(s) URL: ${withoutCredentials(url)}`);
  // fetch refuses such a URL, and its message printed the password (a CLIENT_ERROR, exit 3, until
  // 2026-12-07): the API takes a token, never a user name and password.
  if (parsed.username || parsed.password)
    throw new ClientUsageError(
      `the server's URL must not hold a user name or password (${withoutCredentials(url)}): the API takes a token (ASSAY_TOKEN or --token)`,
    );
  // A token read from a file keeps its line end (`ASSAY_TOKEN=$(cat token.txt)` drops LF, not CR;
  // a mounted secret keeps both): white space around it is no part of any token.
  const token = (values.token ?? process.env.ASSAY_TOKEN)?.trim();
  if (!token) throw new ServerProblem("no API token: set ASSAY_TOKEN (or pass --token)");
  // Such a token cannot even go into a header (fetch would throw before connecting); the token
  // itself is never part of the message.
  if (!/^[\x21-\x7e]+$/.test(token))
    throw new ServerProblem(
      "the API token has characters no token has (spaces, non-ASCII): check ASSAY_TOKEN",
    );
  // A request tried again (an API restarting) is said on stderr, as a download's retry is.
  return new ApiClient(url, token, { onRetry: (note) => out.note(note) });
}

/** How long a command may take to wind down once its output is gone, before the process just exits. */
const OUTPUT_CLOSED_GRACE_MS = 5_000;

/** Set once stdout's reader has gone away (EPIPE), or the terminal (EIO): the exit code is then closedCode. */
let outputClosed = false;
/** 141; or, when a signal had already stopped the command (a closed terminal's SIGHUP), that signal's code. */
let closedCode: number = EXIT.OUTPUT_CLOSED;

/**
 * Node ignores SIGPIPE, so a write after stdout's reader exited (`assay follow 42 | head -1`) is an
 * 'error' event, which unhandled crashes the process with a stack trace and exit 1 — the code for a
 * task that failed. Instead the command is stopped as by Ctrl-C (temporary files removed, the
 * cursor restored) and exits 141, as a shell reports a process killed by SIGPIPE. The listeners stay
 * for the process's life: the last lines a command prints fail only after it has returned.
 */
function watchOutput(stop: (reason: Interrupted) => void, stoppedBy: () => Interrupted | undefined): void {
  const onError = (stream: NodeJS.WriteStream) => (err: NodeJS.ErrnoException) => {
    // EIO on a terminal: the terminal is gone (a closed window; its SIGHUP may come before or after
    // the write that fails: Node handles signals on a later turn). It crashed the command with exit 1,
    // the code of a failed task (the review). Not on a file: an I/O error there is a failure.
    const hungUp = err.code === "EIO" && stream.isTTY === true;
    if (err.code !== "EPIPE" && !hungUp) throw err;
    if (outputClosed) return;
    outputClosed = true;
    // What stopped the command first says the code (Ctrl-C 130, SIGTERM 143, SIGHUP 129); else the
    // hang-up's (129) or a closed pipe's (141).
    const by = stoppedBy();
    closedCode = by ? exitCodeOf(by) : hungUp ? new Terminated("SIGHUP").exitCode : EXIT.OUTPUT_CLOSED;
    process.exitCode = closedCode;
    stop(new OutputClosed("the output was closed by its reader"));
    // A step that ignores the signal (creating the task, which Ctrl-C does not cut off either)
    // must not keep a process nobody listens to alive for long.
    setTimeout(() => process.exit(closedCode), OUTPUT_CLOSED_GRACE_MS).unref();
  };
  process.stdout.on("error", onError(process.stdout));
  // With 2>&1 into the same pipe, stderr loses its reader too.
  process.stderr.on("error", onError(process.stderr));
  process.on("exit", () => {
    if (outputClosed) process.exitCode = closedCode;
  });
}

/**
 * Ctrl-C, SIGTERM and SIGHUP abort the returned signal once (the reason, also `out.stoppedBy`, says
 * which); a second one exits at once with its code, 130, 143 or 129 (the 'exit' handlers of
 * download.ts and tty.ts remove temporary files and show the cursor again). SIGTERM is what
 * `timeout`, systemd and a cancelled CI job send: unhandled, it killed the command with no line for
 * the script and a download's `.partial-*` files left behind.
 */
function interrupts(out: Output): { signal: AbortSignal; dispose: () => void } {
  const controller = new AbortController();
  const stop = (reason: Interrupted) => {
    if (controller.signal.aborted) {
      // A second signal, or one after the output closed: its code, not the closed output's (the
      // 'exit' listener of watchOutput would otherwise put that back).
      closedCode = exitCodeOf(reason);
      process.exit(closedCode);
    }
    out.stoppedBy = reason;
    controller.abort(reason);
  };
  const handlers = [
    ["SIGINT", () => stop(new Interrupted("interrupted"))],
    ["SIGTERM", () => stop(new Terminated("SIGTERM"))],
    ["SIGHUP", () => stop(new Terminated("SIGHUP"))],
  ] as const;
  for (const [signal, handler] of handlers) process.on(signal, handler);
  watchOutput(
    (reason) => {
      out.stoppedBy ??= reason;
      controller.abort(reason);
    },
    () => out.stoppedBy,
  );
  return {
    signal: controller.signal,
    dispose: () => {
      for (const [signal, handler] of handlers) process.off(signal, handler);
    },
  };
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
  const stop = interrupts(out);
  try {
    const args = parseClientArgs(argv, spec.options);
    if ((args.values as { help?: boolean }).help) {
      process.stdout.write(`${spec.help}\n\n${COMMON_HELP}\n`);
      return 0;
    }
    const ctx: ClientContext = {
      client: clientFrom(args.values as { url?: string; token?: string }, out),
      out,
      signal: stop.signal,
    };
    const code = await spec.run(ctx, args);
    return outputClosed ? closedCode : code;
  } catch (err) {
    // Nobody reads the error line, and the stop was ours: quietly.
    if (outputClosed) return closedCode;
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

/** For a command that takes no positional arguments: a stray one is a usage error, not ignored. */
export function noArguments(positionals: string[]): void {
  const [first] = positionals;
  if (first !== undefined) throw new ClientUsageError(`unexpected argument ${first}`);
}

/** A positive integer option. */
export function intOption(value: string | undefined, name: string, fallback: number, max: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > max)
    throw new ClientUsageError(`--${name} must be an integer from 1 to ${max}`);
  return n;
}

/** A path as one word of a shell command, quoted when it holds anything a shell would take apart. */
export const shellWord = (p: string) => (/^[\w@%+=:,./-]+$/.test(p) ? p : `'${p.replace(/'/g, "'\\''")}'`);

/** `url` as it may be printed: what stands between `//` and `@` (a user name, a password) hidden. */
function withoutCredentials(url: string): string {
  // Up to the last @: a password may hold an unencoded / ? or # (then the URL does not even parse).
  return url.replace(/\/\/.*@/s, "//***@");
}
