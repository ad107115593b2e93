// Exit codes of the client commands, one meaning each, so scripts can branch on them (docs/cli.md).
import { ApiRequestError, ConnectionError } from "./http.ts";

export const EXIT = {
  /** Done; for a command that waits on a task, the task succeeded. */
  OK: 0,
  /** The task failed, partially succeeded, timed out or was cancelled (or had ended already). */
  TASK_NOT_SUCCEEDED: 1,
  /** A usage or validation error: bad arguments, parameters, type, or an id that names nothing of yours. */
  USAGE: 2,
  /** The server cannot be reached, failed (5xx), or does not accept the token. */
  SERVER: 3,
  /** Ctrl-C (SIGINT). SIGTERM and SIGHUP stop a command the same way, and exit 143 and 129 (Terminated). */
  INTERRUPTED: 130,
  /** stdout was closed by its reader (`assay follow 42 | head -1`): 128 + SIGPIPE, as shells report it. */
  OUTPUT_CLOSED: 141,
} as const;

/** A problem with the command line or its inputs, found before (or without) asking the server. */
export class ClientUsageError extends Error {
  override name = "ClientUsageError";
  /**
   * The message is the client's own words (not a name or the server's) in several lines, printed as
   * lines: the argument parser's.
   */
  readonly ownLines: boolean;
  constructor(message: string, o: { ownLines?: boolean } = {}) {
    super(message);
    this.ownLines = o.ownLines ?? false;
  }
}

/** The server cannot be used: no token, unreachable, 401, 5xx. */
export class ServerProblem extends Error {
  override name = "ServerProblem";
}

/** A task that ended other than succeeded where the command needed it to (cancel, download). */
export class TaskStateError extends Error {
  override name = "TaskStateError";
}

/**
 * A path the command must write is taken by something of another kind: a file (or a link to
 * nothing) where a folder goes, a folder where a file goes. Nothing is overwritten or removed.
 */
export class PathConflict extends Error {
  override name = "PathConflict";
}

/** Ctrl-C, as an abort reason. */
export class Interrupted extends Error {
  override name = "Interrupted";
}

/**
 * SIGTERM or SIGHUP (`timeout`, systemd, a CI job cancelled, a closed terminal), as an abort reason:
 * the command stops as on Ctrl-C (temporary files removed, an "interrupted" line) and exits 128 + the
 * signal's number, as a shell reports a process the signal killed. Until 2026-12-07 the signal killed
 * the command outright: no line for a script, `.partial-*` files left in a download's folder.
 */
export class Terminated extends Interrupted {
  override name = "Terminated";
  readonly signal: "SIGTERM" | "SIGHUP";
  constructor(signal: "SIGTERM" | "SIGHUP") {
    super(`stopped by ${signal}`);
    this.signal = signal;
  }
  get exitCode(): number {
    return 128 + (this.signal === "SIGTERM" ? 15 : 1);
  }
}

/** stdout's reader went away, as an abort reason: nobody is left to read what the command prints. */
export class OutputClosed extends Interrupted {
  override name = "OutputClosed";
}

export function exitCodeOf(err: unknown): number {
  if (err instanceof OutputClosed) return EXIT.OUTPUT_CLOSED;
  if (err instanceof Terminated) return err.exitCode;
  if (err instanceof Interrupted) return EXIT.INTERRUPTED;
  if (err instanceof ClientUsageError || err instanceof PathConflict) return EXIT.USAGE;
  if (err instanceof TaskStateError) return EXIT.TASK_NOT_SUCCEEDED;
  if (err instanceof ServerProblem || err instanceof ConnectionError) return EXIT.SERVER;
  if (err instanceof ApiRequestError) {
    if (err.status === 401 || err.status >= 500) return EXIT.SERVER;
    return EXIT.USAGE;
  }
  // A local file that cannot be read or written (ENOENT, EACCES, ENOSPC…) is the command's input.
  if (typeof (err as NodeJS.ErrnoException).code === "string") return EXIT.USAGE;
  return EXIT.SERVER;
}

/** The `code` of a JSON error line. */
export function errorCodeOf(err: unknown): string {
  if (err instanceof ApiRequestError) return err.code;
  if (err instanceof ConnectionError) return "CONNECTION_FAILED";
  if (err instanceof ClientUsageError) return "USAGE";
  if (err instanceof ServerProblem) return "SERVER";
  if (err instanceof TaskStateError) return "TASK_STATE";
  if (err instanceof PathConflict) return "PATH_CONFLICT";
  if (err instanceof OutputClosed) return "OUTPUT_CLOSED";
  if (err instanceof Interrupted) return "INTERRUPTED";
  return "CLIENT_ERROR";
}

/** A one-line message for the user; an API error names its code. */
export function messageOf(err: unknown): string {
  if (err instanceof ApiRequestError) {
    if (err.status === 401) return `the server did not accept the token (${err.code}): check ASSAY_TOKEN`;
    return `${err.message} (${err.code})`;
  }
  return err instanceof Error ? err.message : String(err);
}
