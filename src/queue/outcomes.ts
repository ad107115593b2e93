// How an attempt's ending becomes what the queue records: an outcome to complete, a retry, or
// nothing (a lost lease). Pure; the worker applies the decision.
import { isNoSpace, StoreUnavailableError } from "../storage/store.ts";
import { backoffMs } from "./backoff.ts";
import type { ClaimedRun, Outcome, Retry } from "./sql.ts";

export interface HandlerContext {
  /** Aborted on timeout, cancel, lost lease and shutdown; `signal.reason` is an AbortReason. */
  signal: AbortSignal;
  /** Coalesced: only the latest value is written, a few times a second. */
  reportProgress(percent: number, message?: string): void;
  /**
   * The attempt's process has ended; only bookkeeping (checking and publishing outputs) is left.
   * Frees its slot, so the worker claims the next run while this one finishes: a slot is a process.
   */
  releaseSlot(): void;
  /**
   * The process reported its result and is about to exit: the worker may claim the next run now and
   * start it when the slot is released, so the claim's round trip overlaps the process's exit.
   */
  finishing(): void;
}

export type HandlerOutcome =
  | {
      status: "succeeded";
      result?: Record<string, unknown>;
      /**
       * Where this attempt's outputs are (relative to the outputs root). Recorded as the run's output
       * only when the completion wins the lease fence; otherwise the worker discards the attempt.
       */
      outputKey?: string;
    }
  | {
      status: "failed";
      errorCode: string;
      errorMessage?: string;
      transient?: boolean;
      /** Diagnostics kept with the failed run (e.g. the tail of stderr); never shown to users. */
      result?: Record<string, unknown>;
      /** The signal that killed the program, when one did (the worker's own aborts aside). */
      signal?: NodeJS.Signals;
    }
  | { status: "timed_out"; errorMessage?: string }
  | { status: "cancelled" };

export type Handler = (run: ClaimedRun, ctx: HandlerContext) => Promise<HandlerOutcome>;

export type AbortReason = "timeout" | "cancel" | "lost" | "shutdown";

/**
 * The signals a supervisor stops a service with. A program killed by one of them while its worker is
 * stopping was stopped with the worker — systemd's default KillMode=control-group, or PM2's treekill,
 * signals every process of the service at once — not failed on its own: its run goes back to the
 * queue like one the worker's shutdown aborted (decide()'s "shutdown"), instead of failing for good.
 */
const STOP_SIGNALS: ReadonlySet<string> = new Set(["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"]);

/** The abort reason to decide an ending by: the worker's own, or a shutdown a supervisor's signal began. */
export function effectiveReason(
  reason: AbortReason | undefined,
  ending: Ending,
  stopping: boolean,
): AbortReason | undefined {
  if (reason !== undefined || !stopping || ending.status !== "failed") return reason;
  return ending.signal !== undefined && STOP_SIGNALS.has(ending.signal) ? "shutdown" : undefined;
}

/** What a handler's promise settled with: its outcome, or what it threw. */
export type Ending = HandlerOutcome | { status: "error"; error: unknown };

export type Decision =
  | { kind: "discard" }
  | { kind: "complete"; outcome: Outcome }
  | { kind: "retry"; retry: Retry };

/**
 * A lost lease records nothing, whatever the handler returned. A success stands against every other
 * abort: a cancel, timeout or shutdown that arrived after the program had finished its work (while its
 * outputs were checked) changes nothing about that work. Otherwise the worker's abort reason wins over
 * what the handler returned: a shutdown goes back to the queue with the attempt refunded, a cancel ends
 * cancelled, a timeout ends timed out. Then: a store that could not be used (StoreUnavailableError)
 * puts the run back with its attempt refunded, as ANALYSIS_STORAGE_UNAVAILABLE; transient failures (and
 * other thrown errors) retry with backoff while attempts are left — a thrown ENOSPC or EDQUOT as ANALYSIS_STORAGE_FULL, any other thrown
 * error as ANALYSIS_PROCESS_FAILED; anything else fails (a "cancelled" nobody asked for included: only a run
 * marked cancelling may end cancelled).
 */
export function decide(
  run: ClaimedRun,
  reason: AbortReason | undefined,
  ending: Ending,
  retryBaseMs: number,
  /** The attempt's time limit, named in a timeout's message. */
  timeoutMs?: number,
): Decision {
  const lease = { id: run.id, token: run.leaseToken };
  const complete = (outcome: Omit<Outcome, "id" | "token">): Decision => ({
    kind: "complete",
    outcome: { ...lease, ...outcome },
  });
  if (reason === "lost") return { kind: "discard" };
  if (ending.status === "succeeded") {
    return complete({
      status: "succeeded",
      result: ending.result ?? null,
      outputKey: ending.outputKey ?? null,
    });
  }
  if (reason === "shutdown") {
    return {
      kind: "retry",
      retry: { ...lease, delayMs: 0, refund: true, errorCode: null, errorMessage: null },
    };
  }
  if (reason === "cancel") return complete({ status: "cancelled", errorCode: "ANALYSIS_PROCESS_CANCELLED" });
  if (reason === "timeout" || ending.status === "timed_out") {
    const message = ending.status === "timed_out" ? ending.errorMessage : undefined;
    return complete({
      status: "timed_out",
      errorCode: "ANALYSIS_PROCESS_TIMEOUT",
      // With the limit (until 2026-12-07 not: a user could not tell how long the program had).
      errorMessage:
        message ??
        (timeoutMs === undefined
          ? "the attempt exceeded its time limit"
          : `the attempt exceeded its time limit of ${durationText(timeoutMs)}`),
    });
  }
  if (ending.status === "cancelled") {
    // Only a run being cancelled may end cancelled; a handler that gave up unasked has failed.
    return complete({
      status: "failed",
      errorCode: "ANALYSIS_PROCESS_CANCELLED",
      errorMessage: "the analysis stopped without being cancelled",
    });
  }
  const thrown = ending.status === "error";
  // The store could not be used (storeFault asked it): the run waits for it, its attempt refunded —
  // however many it has used, since none of them was its own fault — and the worker holds its claims.
  if (thrown && ending.error instanceof StoreUnavailableError) {
    return {
      kind: "retry",
      retry: {
        ...lease,
        delayMs: backoffMs(run.attempt, retryBaseMs),
        refund: true,
        errorCode: "ANALYSIS_STORAGE_UNAVAILABLE",
        errorMessage: "the object store could not be reached: the run waits for it",
      },
    };
  }
  // A full disk (the worker's scratch space, or a local store's) is no fault of the run's: it is said
  // so, and retried like any thrown error — another worker, or this one once space is freed, may run it.
  const noSpace = thrown && isNoSpace(ending.error);
  const errorCode = noSpace ? "ANALYSIS_STORAGE_FULL" : thrown ? "ANALYSIS_PROCESS_FAILED" : ending.errorCode;
  const errorMessage = noSpace
    ? "the worker ran out of disk space"
    : thrown
      ? "the analysis failed unexpectedly"
      : (ending.errorMessage ?? null);
  if ((thrown || ending.transient === true) && run.attempt < run.maxAttempts) {
    const delayMs = backoffMs(run.attempt, retryBaseMs);
    return { kind: "retry", retry: { ...lease, delayMs, refund: false, errorCode, errorMessage } };
  }
  return complete({
    status: "failed",
    errorCode,
    errorMessage,
    result: thrown ? null : (ending.result ?? null),
  });
}

/** The error message of an attempt whose own outcome the database refused (unrecordable()). */
export const UNRECORDABLE_MESSAGE = "the attempt's outcome could not be recorded";

/**
 * What the worker records instead of an outcome that the database refused on its own (a completion
 * statement of that one outcome failed, for a reason not the connection's; see Worker.writeBatch):
 * the run failed, with ANALYSIS_PROCESS_FAILED and a fixed message, and nothing of what the attempt
 * reported (its result, its outputs). Only constants: PostgreSQL takes this whatever it refused.
 */
export function unrecordable(outcome: Outcome): Outcome {
  return {
    id: outcome.id,
    token: outcome.token,
    status: "failed",
    errorCode: "ANALYSIS_PROCESS_FAILED",
    errorMessage: UNRECORDABLE_MESSAGE,
    result: null,
    outputKey: null,
  };
}

/** The same for a retry: still put back (after its backoff), with the fixed code and message. */
export function unrecordableRetry(retry: Retry): Retry {
  return { ...retry, errorCode: "ANALYSIS_PROCESS_FAILED", errorMessage: UNRECORDABLE_MESSAGE };
}

/** A duration limit as people read it: "10 min", "1 h 30 min", "45 s", "1.5 s" (rounded first: never "60 s"). */
export function durationText(ms: number): string {
  const tenths = Math.round(ms / 100);
  if (tenths < 600) return `${tenths % 10 === 0 ? tenths / 10 : (tenths / 10).toFixed(1)} s`;
  const total = Math.round(ms / 1000);
  const h = Math.floor(total / 3600);
  const min = Math.floor((total % 3600) / 60);
  const s = total % 60;
  return [h > 0 ? `${h} h` : "", min > 0 ? `${min} min` : "", s > 0 ? `${s} s` : ""]
    .filter(Boolean)
    .join(" ");
}
