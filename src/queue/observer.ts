// What the worker and the reaper report as they go, for metrics. The queue knows nothing of
// Prometheus: src/metrics/worker.ts implements this interface. Every method must be cheap and must
// not throw (they are called on the claim and completion paths).
import type { ReapPass } from "./reaper.ts";

/** How an attempt ended, as recorded in the queue. */
export type AttemptOutcome =
  | "succeeded"
  | "failed"
  | "timed_out"
  | "cancelled"
  /** A transient failure went back to the queue with backoff. */
  | "retried"
  /** Shutdown handed the run back with its attempt refunded. */
  | "requeued"
  /** The object store could not be used: the run went back with its attempt refunded, to wait for it. */
  | "storage"
  /** The lease was gone (reaped or fenced off): nothing was recorded. */
  | "lost";

export interface QueueObserver {
  /** One claim statement: how long it took and how long each claimed run had waited since it was due. */
  claimed(analysisType: string, seconds: number, waitedSeconds: readonly number[]): void;
  /** An attempt's handler started (+1) or ended (-1) in this process. */
  attemptLive(analysisType: string, delta: 1 | -1): void;
  /** An attempt's ending was recorded (or, for "lost", abandoned); `seconds` from start to ending. */
  attemptEnded(analysisType: string, outcome: AttemptOutcome, seconds: number): void;
  /** A lease was found gone: by a heartbeat (or progress write), or when the completion was fenced off. */
  leaseLost(analysisType: string, how: "heartbeat" | "fenced"): void;
  /** One reaper pass. */
  reaped(pass: ReapPass): void;
}

export const NO_OBSERVER: QueueObserver = {
  claimed() {},
  attemptLive() {},
  attemptEnded() {},
  leaseLost() {},
  reaped() {},
};
