// Runs one external process safely (DESIGN §5): argument array, no shell, its own process group,
// stdin ignored, stdout parsed as bounded JSON Lines, the tail of stderr kept. Settles exactly once,
// on `close` (or at once when the process never started). Timeout and abort both terminate the whole
// group — SIGTERM, then SIGKILL after a grace period — and still wait for `close`. Knows nothing of
// HTTP or SQL; the caller maps the result to an outcome.

import { type ChildProcess, spawn } from "node:child_process";
import os from "node:os";
import type { GroupRegistry } from "./group-guard.ts";
import {
  DEFAULT_JSONL_LIMITS,
  type JsonLinesLimits,
  JsonLinesReader,
  type ProgressEvent,
  ProtocolError,
  type ResultEvent,
} from "./jsonl.ts";
import { killGroup } from "./kill-group.ts";
import { RingBuffer } from "./ring-buffer.ts";

export interface ProcessCommand {
  /** Absolute path, resolved at start-up from trusted configuration. */
  executable: string;
  args: string[];
  cwd: string;
  /** The complete environment of the child (an allowlist, never the service's own). */
  env: Record<string, string>;
}

export interface RunLimits {
  /** Own wall-clock limit (the queue worker also aborts on its per-type timeout). */
  timeoutMs?: number;
  /** Between SIGTERM and SIGKILL to the group. */
  killGraceMs: number;
  jsonl?: JsonLinesLimits;
  /** Bytes of stderr kept (the last ones). */
  stderrBytes?: number;
  /** Told about the process group, so it dies with the worker (see group-guard.ts). */
  guard?: GroupRegistry;
  /**
   * Niceness of the process, inherited by what it starts; only ever raised above this process's own
   * (absent or lower: the process keeps ours).
   */
  nice?: number;
}

export interface ProcessResult {
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  /** spawn failed (ENOENT for a missing executable or cwd, EACCES, …): there was no process. */
  startError: NodeJS.ErrnoException | undefined;
  timedOut: boolean;
  isCanceled: boolean;
  /** The abort signal's reason, when canceled. */
  abortReason: unknown;
  protocolError: ProtocolError | undefined;
  result: ResultEvent | undefined;
  stderrTail: string;
  durationMs: number;
  pid: number | undefined;
}

const STDERR_TAIL_CHARS = 4096;

export function runProcess(
  command: ProcessCommand,
  signal: AbortSignal,
  limits: RunLimits,
  onProgress?: (event: ProgressEvent) => void,
  /** The program reported its result (it is about to exit). */
  onResult?: () => void,
): Promise<ProcessResult> {
  const started = Date.now();
  const reader = new JsonLinesReader(limits.jsonl ?? DEFAULT_JSONL_LIMITS);
  const stderr = new RingBuffer(limits.stderrBytes ?? 64 * 1024);
  const state = {
    timedOut: false,
    isCanceled: false,
    abortReason: undefined as unknown,
    protocolError: undefined as ProtocolError | undefined,
    result: undefined as ResultEvent | undefined,
    startError: undefined as NodeJS.ErrnoException | undefined,
  };

  return new Promise<ProcessResult>((resolve) => {
    let settled = false;
    let terminating = false;
    let graceTimer: NodeJS.Timeout | undefined;
    let timeoutTimer: NodeJS.Timeout | undefined;
    let child: ChildProcess;

    const settle = (exitCode: number | null, sig: NodeJS.Signals | null) => {
      if (settled) return;
      settled = true;
      clearTimeout(graceTimer);
      clearTimeout(timeoutTimer);
      signal.removeEventListener("abort", onAbort);
      resolve({
        exitCode,
        signal: sig,
        ...state,
        stderrTail: stderr.tail(STDERR_TAIL_CHARS),
        durationMs: Date.now() - started,
        pid: child?.pid,
      });
    };

    // Each way of ending early is one small function; all of them converge on terminate().
    const terminate = () => {
      if (terminating || child?.pid === undefined) return;
      terminating = true;
      killGroup(child.pid, "SIGTERM");
      graceTimer = setTimeout(() => {
        if (child.pid !== undefined) killGroup(child.pid, "SIGKILL");
      }, limits.killGraceMs);
    };
    // The program has exited: what it did stands, and an abort or timeout arriving before `close`
    // (the pipes still draining) changes nothing.
    let exited = false;
    const onAbort = () => {
      if (exited) return;
      state.isCanceled = true;
      state.abortReason = signal.reason;
      terminate();
    };
    const onTimeout = () => {
      if (exited) return;
      state.timedOut = true;
      terminate();
    };
    const onProtocolError = (err: unknown) => {
      if (state.protocolError) return;
      state.protocolError =
        err instanceof ProtocolError ? err : new ProtocolError("invalid-event", String(err));
      terminate();
    };
    const onEvents = (events: ReturnType<JsonLinesReader["push"]>) => {
      for (const event of events) {
        if (event.type === "progress") onProgress?.(event);
        else if (state.result)
          onProtocolError(new ProtocolError("invalid-event", "more than one result event"));
        else {
          state.result = event;
          onResult?.();
        }
      }
    };

    try {
      child = spawn(command.executable, command.args, {
        cwd: command.cwd,
        env: command.env,
        detached: true,
        shell: false,
        stdio: ["ignore", "pipe", "pipe"],
        windowsHide: true,
      });
    } catch (err) {
      state.startError = err as NodeJS.ErrnoException;
      settle(null, null);
      return;
    }

    child.on("error", (err: NodeJS.ErrnoException) => {
      // No pid: the process never existed, and `close` is not guaranteed — settle now.
      if (child.pid === undefined) {
        state.startError = err;
        settle(null, null);
      }
    });
    const pgid = child.pid;
    if (pgid !== undefined) {
      limits.guard?.add(pgid);
      if (limits.nice !== undefined) yieldCpu(pgid, limits.nice);
    }
    child.stdout?.on("data", (chunk: Buffer) => {
      if (state.protocolError) return; // stop parsing; keep draining so the child never blocks
      try {
        onEvents(reader.push(chunk));
      } catch (err) {
        onProtocolError(err);
      }
    });
    child.stderr?.on("data", (chunk: Buffer) => stderr.write(chunk));
    // The leader is gone: whatever it left in its group dies too, so the pipes close.
    child.on("exit", () => {
      exited = true;
      if (child.pid !== undefined) killGroup(child.pid, "SIGKILL");
    });
    child.on("close", (code, sig) => {
      if (!state.protocolError) {
        try {
          onEvents(reader.end());
        } catch (err) {
          state.protocolError = err as ProtocolError;
        }
      }
      // The group was killed when its leader exited: the guard may forget it.
      if (pgid !== undefined) limits.guard?.remove(pgid);
      settle(code, sig);
    });

    if (signal.aborted) onAbort();
    else signal.addEventListener("abort", onAbort, { once: true });
    if (limits.timeoutMs !== undefined) timeoutTimer = setTimeout(onTimeout, limits.timeoutMs);
  });
}

/**
 * Lowers a just-spawned process's CPU priority to `nice` (never raises it: that needs privileges).
 * spawn returns while the child is still starting the program, so in practice the program runs — and
 * starts its own children — at the new priority from its beginning. The pid is still this child's: it
 * cannot be reaped (and reused) before this synchronous code returns to the event loop.
 */
function yieldCpu(pid: number, nice: number): void {
  try {
    if (nice > os.getPriority()) os.setPriority(pid, nice);
  } catch {
    // ESRCH: it has already exited. Priority is an optimisation; the run goes on either way.
  }
}
