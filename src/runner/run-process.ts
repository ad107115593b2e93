// Runs one external process safely (DESIGN §5): argument array, no shell, its own process group,
// stdin ignored, stdout parsed as bounded JSON Lines, the tail of stderr kept. Settles exactly once,
// on `close` (or at once when the process never started). Timeout and abort both terminate the whole
// group — SIGTERM, then SIGKILL after a grace period — and still wait for `close`. When the leader
// exits its group is SIGKILLed, and `close` is waited for at most the grace period more: a process
// that left the group (setsid) cannot hold the run open by holding its pipes. Knows nothing of HTTP
// or SQL; the caller maps the result to an outcome.

import { type ChildProcess, spawn } from "node:child_process";
import os from "node:os";
import { setTimeout as delay } from "node:timers/promises";
import type { GroupRegistry } from "./group-guard.ts";
import {
  DEFAULT_JSONL_LIMITS,
  type JsonLinesLimits,
  JsonLinesReader,
  type ProgressEvent,
  ProtocolError,
  type ResultEvent,
} from "./jsonl.ts";
import { killGroup, killMarked } from "./kill-group.ts";
import { RingBuffer } from "./ring-buffer.ts";

export interface ProcessCommand {
  /** Absolute path, resolved at start-up from trusted configuration. */
  executable: string;
  args: string[];
  cwd: string;
  /** The complete environment of the child (an allowlist, never the service's own). */
  env: Record<string, string>;
}

/** What an analysis process may allocate (RLIMIT_DATA, bytes), and the prlimit that sets it. */
export interface ChildMemory {
  bytes: number;
  prlimit: string;
}

export interface RunLimits {
  /** Own wall-clock limit (the queue worker also aborts on its per-type timeout). */
  timeoutMs?: number;
  /**
   * Between SIGTERM and SIGKILL to the group; also how long `close` is waited for once the leader has
   * exited (at least MIN_DRAIN_MS).
   */
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
  /**
   * Bytes the process (and each it starts) may allocate, RLIMIT_DATA, set by `prlimit` (its absolute
   * path): the program runs as `prlimit --data=N -- <executable> <args>`, which sets the limit and execs
   * it (same pid, same group). What it cannot start says so on stderr and exits 126/127: a start error.
   */
  memory?: ChildMemory;
  /**
   * A `NAME=value` entry of `command.env` that no process but this run's has (the handler gives each
   * attempt its own HOME): a process that left the group and still holds the output when the wait
   * for `close` ends is looked for by it and killed (killMarked).
   */
  marker?: string;
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
  /** The message of the last `error` event: why the program says it failed (see outcomeOf). */
  reportedError: string | undefined;
  /**
   * stdout or stderr was still open when the wait for `close` after the leader's exit ended: a process
   * that left the group held it. What it wrote after that is not read; the exit code is reported as it
   * was, and outcomeOf fails the run for it.
   */
  outputHeld: boolean;
  stderrTail: string;
  durationMs: number;
  pid: number | undefined;
  /** RLIMIT_DATA the process ran under (RunLimits.memory), if any. */
  memoryLimitBytes: number | undefined;
}

const STDERR_TAIL_CHARS = 4096;
/**
 * The shortest wait for `close` after the leader's exit, whatever the kill grace (which may be 0): what
 * the program wrote just before it exited may still be unread when its exit is seen.
 */
export const MIN_DRAIN_MS = 1000;

export function runProcess(
  command: ProcessCommand,
  signal: AbortSignal,
  limits: RunLimits,
  onProgress?: (event: ProgressEvent) => void,
  /** The program reported its result (it is about to exit). */
  onResult?: () => void,
): Promise<ProcessResult> {
  const started = performance.now();
  const reader = new JsonLinesReader(limits.jsonl ?? DEFAULT_JSONL_LIMITS);
  const stderr = new RingBuffer(limits.stderrBytes ?? 64 * 1024);
  const state = {
    timedOut: false,
    isCanceled: false,
    abortReason: undefined as unknown,
    protocolError: undefined as ProtocolError | undefined,
    result: undefined as ResultEvent | undefined,
    reportedError: undefined as string | undefined,
    startError: undefined as NodeJS.ErrnoException | undefined,
    outputHeld: false,
  };

  return new Promise<ProcessResult>((resolve) => {
    let settled = false;
    let terminating = false;
    let graceTimer: NodeJS.Timeout | undefined;
    let timeoutTimer: NodeJS.Timeout | undefined;
    let drainTimer: NodeJS.Timeout | undefined;
    let child: ChildProcess;
    /** The leader's exit status, once it has exited. */
    let exit: { code: number | null; sig: NodeJS.Signals | null } | undefined;

    const settle = (exitCode: number | null, sig: NodeJS.Signals | null) => {
      if (settled) return;
      settled = true;
      clearTimeout(graceTimer);
      clearTimeout(timeoutTimer);
      clearTimeout(drainTimer);
      signal.removeEventListener("abort", onAbort);
      const stderrTail = stderr.tail(STDERR_TAIL_CHARS);
      // prlimit could not exec the program (errexec: 127 when it is missing, 126 otherwise): what
      // spawn itself reports without the wrapper.
      if (
        limits.memory &&
        (exitCode === 126 || exitCode === 127) &&
        stderrTail.startsWith("prlimit: failed to execute")
      )
        state.startError = Object.assign(new Error(stderrTail.trim()), {
          code: exitCode === 127 ? "ENOENT" : "EACCES",
        });
      resolve({
        exitCode,
        signal: sig,
        ...state,
        stderrTail,
        durationMs: Math.round(performance.now() - started),
        pid: child?.pid,
        memoryLimitBytes: limits.memory?.bytes,
      });
    };

    // The process's output has ended (`close`), or stopped being waited for (stopDraining): the last
    // unterminated line counts, the group is forgotten by the guard, and the result settles.
    const finish = (code: number | null, sig: NodeJS.Signals | null) => {
      if (settled) return;
      if (!state.protocolError) {
        try {
          onEvents(reader.end());
        } catch (err) {
          // Only after a clean exit is a broken last line the program's breach of the protocol. After a
          // signal (the OOM killer, a crash) or a failing exit, it is the line the program was writing
          // when it died, and how it ended is what the run must report: it was reported as an invalid
          // output instead, and an exit 4 was not retried.
          if (code === 0) state.protocolError = err as ProtocolError;
        }
      }
      // The group was killed when its leader exited (or is out of reach, see terminate): the guard
      // may forget it.
      if (child.pid !== undefined) limits.guard?.remove(child.pid);
      settle(code, sig);
    };

    /**
     * Stops waiting for `close`, the kill grace (at least MIN_DRAIN_MS) after the leader exited. The
     * rest of its group was SIGKILLed at that exit, so what still holds the pipes now is a process
     * that left the group (setsid, a daemon's double fork): it is killed if it can be found
     * (`limits.marker`), its pipes are destroyed, and the result settles with the leader's exit as it
     * was. One more turn of the event loop first, so that nothing the program wrote is left unread.
     */
    const stopDraining = () =>
      setImmediate(async () => {
        if (settled || !exit) return;
        const { code, sig } = exit;
        const held = [child.stdout, child.stderr].filter((s) => s && !s.readableEnded && !s.destroyed);
        for (const s of held) s?.destroy();
        if (held.length > 0) {
          state.outputHeld = true;
          // Killed before the result settles, as far as it can be found: the caller checks and keeps
          // the attempt's outputs next, and a holder still alive could write into them (the run fails
          // all the same: outcomeOf). Bounded: /proc is read once.
          if (limits.marker)
            await Promise.race([
              killMarked(limits.marker).catch(() => []),
              delay(MIN_DRAIN_MS, undefined, { ref: false }),
            ]);
        }
        finish(code, sig);
      });

    // Each way of ending early is one small function; all of them converge on terminate(). Once the
    // leader has exited, what it did stands: an abort or a timeout arriving while its pipes drain
    // changes nothing (there is nothing left to signal: its group was killed at the exit), and the
    // wait for `close` is bounded all the same (stopDraining).
    const terminate = () => {
      if (exit || terminating || child?.pid === undefined) return;
      terminating = true;
      killGroup(child.pid, "SIGTERM");
      graceTimer = setTimeout(() => {
        if (exit || child.pid === undefined) return;
        // The group cannot be signalled (EPERM: its processes changed their user, see killGroup). The
        // exit waited for may never come: the result settles now rather than hold the slot for ever.
        if (killGroup(child.pid, "SIGKILL") === "failed") {
          for (const s of [child.stdout, child.stderr]) s?.destroy();
          finish(null, null);
        }
      }, limits.killGraceMs);
    };
    const onAbort = () => {
      if (exit) return;
      state.isCanceled = true;
      state.abortReason = signal.reason;
      terminate();
    };
    const onTimeout = () => {
      if (exit) return;
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
        else if (event.type === "error") state.reportedError = event.message;
        else if (state.result)
          onProtocolError(new ProtocolError("invalid-event", "more than one result event"));
        else {
          state.result = event;
          onResult?.();
        }
      }
    };

    const memory = limits.memory;
    try {
      child = spawn(
        memory ? memory.prlimit : command.executable,
        memory ? [`--data=${memory.bytes}`, "--", command.executable, ...command.args] : command.args,
        {
          cwd: command.cwd,
          env: command.env,
          detached: true,
          shell: false,
          stdio: ["ignore", "pipe", "pipe"],
          windowsHide: true,
        },
      );
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
    // The leader is gone: whatever it left in its group dies too, so the pipes close — unless a process
    // that left the group holds them: `close` is waited for only so long (stopDraining).
    child.on("exit", (code, sig) => {
      exit = { code, sig };
      clearTimeout(graceTimer);
      if (child.pid !== undefined) killGroup(child.pid, "SIGKILL");
      if (!settled) drainTimer = setTimeout(stopDraining, Math.max(limits.killGraceMs, MIN_DRAIN_MS));
    });
    child.on("close", (code, sig) => finish(code, sig));

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
