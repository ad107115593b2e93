// A task's state as its events tell it, for the live view: one entry per run (status, progress,
// latest message) and the counters. Built from the task's whole log, in order, so it never counts a
// run twice and needs no snapshot to reconcile with.
import type { Run, TaskEvent } from "../http/api-types.ts";

export interface RunState {
  runId: string;
  name: string;
  status: string;
  percent: number;
  message: string | null;
  attempt: number;
  errorCode: string | null;
}

export type Outcome = "succeeded" | "failed" | "timed_out" | "cancelled";
const OUTCOMES: readonly string[] = ["succeeded", "failed", "timed_out", "cancelled"];
const isOutcome = (s: string): s is Outcome => OUTCOMES.includes(s);

/** What an event changed, for the view to redraw or report. */
export type Change =
  /** `cancelledQueued`: how many queued runs the task's cancel ended at once (no event of their own). */
  | { kind: "task"; status: string; cancelledQueued: number }
  | { kind: "run"; run: RunState; ended: boolean; retried: boolean }
  | { kind: "none" };

const LIVE: readonly string[] = ["starting", "running", "cancelling"];

/** Whether a run in `status` has a live attempt. */
export const isLive = (status: string) => LIVE.includes(status);

export class TaskTracker {
  readonly taskId: string;
  status = "queued";
  total: number;
  readonly counts: Record<Outcome, number> = { succeeded: 0, failed: 0, timed_out: 0, cancelled: 0 };
  readonly runs = new Map<string, RunState>();
  /**
   * The runs with a live attempt, kept apart: the view asks for them on every event, and a task may
   * have 100,000 runs (a scan of them all per event fell hours behind such a task).
   */
  readonly #live = new Set<RunState>();
  /** Each run's place in `runs`, for "oldest first". */
  readonly #order = new Map<RunState, number>();
  #running: RunState[] | undefined = [];

  constructor(taskId: string, total: number, runs: Pick<Run, "runId" | "fileName">[] = []) {
    this.taskId = taskId;
    this.total = total;
    for (const r of runs) this.#add(fresh(r.runId, r.fileName));
  }

  /**
   * Back to the start, every run queued and nothing counted: the server is about to send the task's
   * whole log again (its event ids were reset by a restore), and applied on top of what was counted,
   * a run retried since would be counted twice.
   */
  reset(): void {
    this.status = "queued";
    for (const k of Object.keys(this.counts) as Outcome[]) this.counts[k] = 0;
    for (const run of this.runs.values()) Object.assign(run, fresh(run.runId, run.name));
    this.#live.clear();
    this.#running = undefined;
  }

  #add(run: RunState): RunState {
    this.runs.set(run.runId, run);
    this.#order.set(run, this.#order.size);
    return run;
  }

  /** Files `run` as live or not, after its status may have changed. */
  #track(run: RunState): void {
    const live = isLive(run.status);
    if (live === this.#live.has(run)) return;
    if (live) this.#live.add(run);
    else this.#live.delete(run);
    this.#running = undefined;
  }

  get done(): number {
    return this.counts.succeeded + this.counts.failed + this.counts.timed_out + this.counts.cancelled;
  }

  /** Runs with a live attempt, oldest first. */
  get running(): RunState[] {
    this.#running ??= [...this.#live].sort((a, b) => (this.#order.get(a) ?? 0) - (this.#order.get(b) ?? 0));
    return this.#running;
  }

  apply(e: TaskEvent): Change {
    if (e.runId === null) return this.#task(e);
    const run = this.runs.get(e.runId) ?? this.#add(fresh(e.runId, `run ${e.runId}`));
    const change = this.#run(run, e);
    this.#track(run);
    return change;
  }

  #run(run: RunState, e: TaskEvent): Change {
    const kind = e.type.slice("run.".length);
    const wasEnded = isOutcome(run.status);
    if (typeof e.data.attempt === "number") run.attempt = e.data.attempt;
    if (kind === "progress") {
      if (typeof e.data.percent === "number") run.percent = e.data.percent;
      if (typeof e.data.message === "string") run.message = e.data.message;
      if (!wasEnded && run.status !== "cancelling") run.status = "running";
    } else if (kind === "retry") {
      Object.assign(run, { status: "queued", percent: 0, errorCode: str(e.data.errorCode) });
      return { kind: "run", run, ended: false, retried: true };
    } else if (isOutcome(kind)) {
      Object.assign(run, { status: kind, errorCode: str(e.data.errorCode) });
      if (kind === "succeeded") run.percent = 100;
      if (!wasEnded) this.counts[kind]++;
      return { kind: "run", run, ended: !wasEnded, retried: false };
    } else if (!wasEnded) {
      run.status = kind; // running, cancelling
    }
    return { kind: "run", run, ended: false, retried: false };
  }

  #task(e: TaskEvent): Change {
    if (e.type === "task.queued" && typeof e.data.totalCount === "number") this.total = e.data.totalCount;
    const status = typeof e.data.status === "string" ? e.data.status : e.type.slice("task.".length);
    this.status = status;
    // A cancel ends the task's queued runs in one event: the runs still queued here are those runs.
    const cancelledQueued =
      e.type === "task.cancelling" && typeof e.data.cancelledQueued === "number" ? e.data.cancelledQueued : 0;
    if (cancelledQueued > 0) {
      this.counts.cancelled += cancelledQueued;
      for (const run of this.runs.values())
        if (run.status === "queued") Object.assign(run, { status: "cancelled", errorCode: CANCELLED_QUEUED });
    }
    return { kind: "task", status, cancelledQueued };
  }
}

/** The error code of a run cancelled before it started. */
const CANCELLED_QUEUED = "ANALYSIS_PROCESS_CANCELLED";

const fresh = (runId: string, name: string): RunState => ({
  runId,
  name,
  status: "queued",
  percent: 0,
  message: null,
  attempt: 0,
  errorCode: null,
});

const str = (v: unknown) => (typeof v === "string" ? v : null);
