// The state machines of runs and tasks (DESIGN §3), as tables of allowed moves. The database
// enforces the same tables with triggers (migrations/0002_state_guards.sql); a test walks every pair
// of states against both, so the two cannot drift apart.

export const RUN_STATUSES = [
  "queued",
  "starting",
  "running",
  "cancelling",
  "succeeded",
  "failed",
  "timed_out",
  "cancelled",
] as const;
export type RunStatus = (typeof RUN_STATUSES)[number];

/** A run in one of these has a live attempt, holds a lease and a global-limit slot. */
export const LIVE_RUN_STATUSES = [
  "starting",
  "running",
  "cancelling",
] as const satisfies readonly RunStatus[];
export const TERMINAL_RUN_STATUSES = [
  "succeeded",
  "failed",
  "timed_out",
  "cancelled",
] as const satisfies readonly RunStatus[];
export type TerminalRunStatus = (typeof TERMINAL_RUN_STATUSES)[number];

/**
 * Allowed run moves.
 * - A run finished before the worker recorded `running` goes straight from `starting` to its outcome.
 * - Retry, lost lease and shutdown put a live attempt back to `queued`; a `cancelling` run never goes
 *   back: it ends `cancelled` (or with the outcome its process reached before the abort landed).
 * - `queued → failed` is the reaper's ANALYSIS_WORKER_UNAVAILABLE.
 */
export const RUN_TRANSITIONS: Record<RunStatus, readonly RunStatus[]> = {
  queued: ["starting", "cancelled", "failed"],
  starting: ["running", "queued", "cancelling", "succeeded", "failed", "timed_out"],
  running: ["queued", "cancelling", "succeeded", "failed", "timed_out"],
  cancelling: ["cancelled", "succeeded", "failed", "timed_out"],
  succeeded: [],
  failed: [],
  timed_out: [],
  cancelled: [],
};

export const TASK_STATUSES = [
  "queued",
  "running",
  "cancelling",
  "succeeded",
  "partially_succeeded",
  "failed",
  "timed_out",
  "cancelled",
] as const;
export type TaskStatus = (typeof TASK_STATUSES)[number];
export const TERMINAL_TASK_STATUSES = [
  "succeeded",
  "partially_succeeded",
  "failed",
  "timed_out",
  "cancelled",
] as const satisfies readonly TaskStatus[];

const TASK_OUTCOMES = ["succeeded", "partially_succeeded", "failed", "timed_out"] as const;

/**
 * Allowed task moves. A task may turn terminal straight from `queued` (every run cancelled or failed
 * before any was claimed); a `cancelling` task ends `cancelled`.
 */
export const TASK_TRANSITIONS: Record<TaskStatus, readonly TaskStatus[]> = {
  queued: ["running", "cancelling", ...TASK_OUTCOMES, "cancelled"],
  running: ["cancelling", ...TASK_OUTCOMES, "cancelled"],
  cancelling: ["cancelled"],
  succeeded: [],
  partially_succeeded: [],
  failed: [],
  timed_out: [],
  cancelled: [],
};

export const canMoveRun = (from: RunStatus, to: RunStatus) => RUN_TRANSITIONS[from].includes(to);
export const canMoveTask = (from: TaskStatus, to: TaskStatus) => TASK_TRANSITIONS[from].includes(to);

export interface TaskCounts {
  total: number;
  succeeded: number;
  failed: number;
  timedOut: number;
  cancelled: number;
}

/**
 * The terminal status of a task whose counters reached its total (DESIGN §3): every run shares one
 * terminal status → that status; at least one succeeded → partially_succeeded; otherwise failed.
 * A task being cancelled ends cancelled. The completion SQL computes the same in `taskTerminalSql`.
 */
export function taskTerminalStatus(c: TaskCounts, cancelling: boolean): TaskStatus {
  if (cancelling) return "cancelled";
  if (c.succeeded === c.total) return "succeeded";
  if (c.failed === c.total) return "failed";
  if (c.timedOut === c.total) return "timed_out";
  if (c.cancelled === c.total) return "cancelled";
  if (c.succeeded > 0) return "partially_succeeded";
  return "failed";
}
