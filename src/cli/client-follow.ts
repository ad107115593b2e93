// `assay follow <taskId>` and `assay logs <taskId> [--follow]`, and the live view `submit --follow`
// shares: on a terminal the task's bars, otherwise one JSON line per event of the task's log — every
// event once, in order, across dropped connections and API restarts.
import { logsPage, runsOf, taskGet } from "../client/api.ts";
import { EXIT, Interrupted } from "../client/exit.ts";
import { displayWidth, fitName, shown } from "../client/output.ts";
import { type RunState, TaskTracker } from "../client/progress.ts";
import { isClosingEvent, isTerminal, type StreamState, taskEvents } from "../client/sse.ts";
import { summaryLine } from "../client/summary.ts";
import type { Run, Task, TaskEvent } from "../http/api-types.ts";
import { type ClientContext, exitCodesHelp, runClientCommand, taskIdArg } from "./client-common.ts";

const queuedRuns = (n: number) => `${n} queued ${n === 1 ? "run" : "runs"}`;

export interface FollowResult {
  task: Task;
  /** Runs that ended other than succeeded, with their errors. */
  problems: Run[];
}

interface View {
  event(e: TaskEvent): void;
  state(state: StreamState, detail: string): void;
  stop(): void;
}

/**
 * The line printed above the bars when a run failed or is retried, within `columns`: cli-progress
 * turns line wrapping off while it draws, so a longer line is cut at the terminal's edge, and the run
 * id and error code after the name would go with it. The name gets what the rest of the line leaves
 * (in terminal columns, one spare), cut in its middle so its end (the extension) stays in view. When
 * the rest alone does not fit (a very narrow terminal), the name shrinks to "…" and the line is cut at
 * the edge after all.
 */
export function problemLine(
  run: Pick<RunState, "name" | "status" | "runId" | "attempt" | "errorCode">,
  retried: boolean,
  columns: number,
): string {
  const what = (retried ? `retrying (attempt ${run.attempt + 1})` : run.status).padEnd(10);
  const after = ` (run ${run.runId}): ${retried && run.errorCode === null ? REQUEUED : shown(run.errorCode)}`;
  const room = columns - displayWidth(`${what} ${after}`) - 1;
  return `${what} ${fitName(shown(run.name), Math.max(1, room))}${after}`;
}

/**
 * Why a run was retried without an error code (run.retry's data: `errorCode` null, `attempt` one
 * fewer): its worker gave it back, its attempt not counted — a shutdown, a full scratch disk, or runs
 * claimed ahead that waited too long for a slot there.
 */
const REQUEUED = "put back by its worker (attempt not counted)";

/** Draws the task on a terminal. */
async function barsView(ctx: ClientContext, task: Task): Promise<View> {
  const { FollowBars } = await import("../client/tty.ts");
  const tracker = new TaskTracker(
    task.taskId,
    task.totalCount,
    await runsOf(ctx.client, task.taskId, undefined, ctx.signal),
  );
  const bars = new FollowBars(ctx.out.stream, tracker);
  // A request's retry notes go above the bars, not under them.
  ctx.out.drawing((line) => bars.log(line));
  return {
    event(e) {
      const change = tracker.apply(e);
      if (change.kind === "task" && change.cancelledQueued > 0)
        bars.log(`${"cancelled".padEnd(10)} ${queuedRuns(change.cancelledQueued)} before they started`);
      if (change.kind === "run" && (change.ended || change.retried) && change.run.status !== "succeeded") {
        bars.log(problemLine(change.run, change.retried, ctx.out.stream.columns || 100));
      }
      bars.update(change.kind === "run" ? change.run : undefined);
    },
    state(state, detail) {
      if (state === "reset") {
        // The whole log follows: counted again from nothing.
        tracker.reset();
        bars.log(shown(detail));
        bars.reset();
        return;
      }
      bars.setNote(state === "reconnecting" ? "reconnecting…" : "");
      bars.log(
        state === "reconnecting" ? `connection lost (${shown(detail)}); reconnecting…` : "reconnected",
      );
    },
    stop: () => {
      ctx.out.drawing(undefined);
      bars.stop();
    },
  };
}

/**
 * A dropped stream and its return, as notes on stderr; a reset also as a `reset` JSON line, so a
 * script reading the events knows those after it start the log over.
 */
const streamNote = (ctx: ClientContext) => (state: StreamState, detail: string) => {
  if (state === "reset") ctx.out.line("reset", { message: detail });
  ctx.out.note(
    state === "reconnecting"
      ? `connection lost (${detail}); reconnecting`
      : state === "reset"
        ? detail
        : "reconnected",
  );
};

/** One JSON line per event (scripts). */
function jsonView(ctx: ClientContext): View {
  return { event: (e) => ctx.out.line("event", e), state: streamNote(ctx), stop: () => {} };
}

const quietView: View = { event: () => {}, state: () => {}, stop: () => {} };

/** The task as it ended and its runs that did not succeed. */
export async function outcomeOf(ctx: ClientContext, taskId: string): Promise<FollowResult> {
  const task = await taskGet(ctx.client, taskId, ctx.signal);
  return { task, problems: await problemsOf(ctx, task) };
}

/** The runs of an ended task that did not succeed, in run id order. */
export async function problemsOf(ctx: ClientContext, task: Task): Promise<Run[]> {
  const taskId = task.taskId;
  const problems: Run[] = [];
  for (const [count, status] of [
    [task.failedCount, "failed"],
    [task.timedOutCount, "timed_out"],
    [task.cancelledCount, "cancelled"],
  ] as const) {
    if (count > 0) problems.push(...(await runsOf(ctx.client, taskId, status, ctx.signal)));
  }
  problems.sort((a, b) => (BigInt(a.runId) < BigInt(b.runId) ? -1 : 1));
  return problems;
}

/**
 * Follows a task to its end: `show` draws it (terminal) or prints its events (JSON); without, it
 * only waits. Throws Interrupted on Ctrl-C, leaving the task running.
 */
export async function followTask(
  ctx: ClientContext,
  taskId: string,
  o: { show: boolean },
): Promise<FollowResult> {
  const first = await taskGet(ctx.client, taskId, ctx.signal);
  // The task's end as far as known: its status when it had ended, or its closing event.
  let ended: string | undefined = isTerminal(first.status) ? first.status : undefined;
  const view = !o.show ? quietView : ctx.out.tty ? await barsView(ctx, first) : jsonView(ctx);
  try {
    for await (const e of taskEvents(ctx.client, taskId, { signal: ctx.signal, onState: view.state })) {
      if (isClosingEvent(e)) ended = e.type.slice("task.".length);
      view.event(e);
    }
  } finally {
    view.stop();
  }
  if (ctx.signal.aborted) throw new StoppedFollowing(`stopped following task ${taskId}`, ended);
  return outcomeOf(ctx, taskId);
}

/** Following stopped (Ctrl-C, stdout closed): `ended`, the task's status when it is known to have ended. */
export class StoppedFollowing extends Interrupted {
  readonly ended: string | undefined;
  constructor(message: string, ended: string | undefined) {
    super(message);
    this.ended = ended;
  }
}

/** The closing report: a summary line and a line per run that did not succeed. Returns the exit code. */
export function report(ctx: ClientContext, { task, problems }: FollowResult): number {
  ctx.out.line("summary", { ...task, failedRuns: failedRuns(problems) });
  ctx.out.say(summaryLine(task));
  sayProblems(ctx, problems);
  return task.status === "succeeded" ? EXIT.OK : EXIT.TASK_NOT_SUCCEEDED;
}

/** The `failedRuns` of a `summary` line: each run that did not succeed, in a few fields. */
export const failedRuns = (problems: Run[]) =>
  problems.map((r) => ({
    runId: r.runId,
    fileName: r.fileName,
    status: r.status,
    errorCode: r.errorCode,
    errorMessage: r.errorMessage,
  }));

/** A line for people per run that did not succeed (follow's summary, download's). */
export function sayProblems(ctx: ClientContext, problems: Run[]): void {
  for (const r of problems) {
    ctx.out.say(
      `  ${r.status.padEnd(10)} ${shown(r.fileName)} (run ${r.runId}): ${r.errorCode ?? ""}${r.errorMessage ? ` — ${shown(r.errorMessage)}` : ""}`,
    );
  }
}

/**
 * What Ctrl-C while following (or waiting) says: the task goes on, unless `err` knows it has ended;
 * `fetch`, the command that downloads its outputs once it has ended (submit --out).
 */
export function leftRunning(ctx: ClientContext, taskId: string, err?: unknown, fetch?: string): number {
  const ended = err instanceof StoppedFollowing ? err.ended : undefined;
  const message =
    ended !== undefined
      ? `stopped following; task ${taskId} has ended (${ended})${fetch ? `: ${fetch}` : ""}`
      : `stopped following; task ${taskId} is still running (assay follow ${taskId} to watch it again, assay cancel ${taskId} to stop it)${fetch ? `; once it has ended, ${fetch}` : ""}`;
  return ctx.out.interrupted(message, { taskId });
}

const FOLLOW_HELP = `Usage: assay follow <taskId>

Shows a task live until it ends: an overall bar with counts, a line per running run with its
progress and latest message, errors as they happen, then a summary naming every run that did not
succeed. Without a terminal (or with --json): one JSON line per event of the task's log, then a
"summary" line. Survives API restarts and dropped connections (resumes with Last-Event-ID; nothing
is shown twice). Ctrl-C stops following and leaves the task running.

${exitCodesHelp(
  [
    "0 the task succeeded",
    "1 it failed, partially succeeded, timed out or was cancelled",
    "2 bad arguments, or no task of yours has that id",
  ],
  "Ctrl-C (the task goes on)",
)}

Example:
  assay follow 100000042`;

export const followSpec = {
  help: FOLLOW_HELP,
  options: {},
  run: async (ctx: ClientContext, { positionals }: { positionals: string[] }) => {
    const taskId = taskIdArg(positionals, "assay follow <taskId>");
    try {
      return report(ctx, await followTask(ctx, taskId, { show: true }));
    } catch (err) {
      if (err instanceof Interrupted) return leftRunning(ctx, taskId, err);
      throw err;
    }
  },
};

export const followCommand = (argv: string[]) => runClientCommand(followSpec, argv);

const LOGS_HELP = `Usage: assay logs <taskId> [--follow]

Prints the task's events (its lifecycle and every progress report), oldest first. With --follow
(-f), keeps printing new events until the task ends, then exits with the task's outcome. Without a
terminal (or with --json): one JSON line per event.

${exitCodesHelp(
  [
    "0 done (with --follow: the task succeeded)",
    "1 with --follow: the task failed, partially succeeded, timed out or was cancelled",
    "2 bad arguments, or no task of yours has that id",
  ],
  "Ctrl-C (the task goes on)",
)}

Examples:
  assay logs 100000042
  assay logs 100000042 --follow --json | jq -c 'select(.type == "run.failed")'`;

/** An event as one line for people. */
export function eventLine(e: TaskEvent, names: Map<string, string>): string {
  const who = e.runId === null ? "task" : `${shown(names.get(e.runId) ?? "")} (run ${e.runId})`;
  const d = e.data;
  let what = "";
  if (e.type === "run.progress")
    what = `${d.percent ?? "?"}%${typeof d.message === "string" ? ` ${shown(d.message)}` : ""}`;
  else if (typeof d.errorCode === "string")
    what =
      e.type === "run.retry" && d.refunded === true ? `${d.errorCode} (attempt not counted)` : d.errorCode;
  else if (e.type === "run.retry") what = REQUEUED;
  else if (e.type === "task.queued") what = `${d.totalCount ?? "?"} runs`;
  else if (typeof d.cancelledQueued === "number" && d.cancelledQueued > 0)
    what = `${queuedRuns(d.cancelledQueued)} cancelled`;
  return `${e.createdAt}  ${e.type.padEnd(16)} ${who}${what ? `  ${what}` : ""}`;
}

async function printLogs(ctx: ClientContext, taskId: string, follow: boolean): Promise<number> {
  const names = new Map(
    ctx.out.json
      ? []
      : (await runsOf(ctx.client, taskId, undefined, ctx.signal)).map((r) => [r.runId, r.fileName]),
  );
  // The task's end as far as known, from its closing event: in the log's pages for a task that ended
  // before the command began (until 2026-12-07 only the stream's events were looked at, and such a
  // task was said to be "still running" when its reader closed the pipe).
  let ended: string | undefined;
  const print = (e: TaskEvent) => {
    if (isClosingEvent(e)) ended = e.type.slice("task.".length);
    ctx.out.line("event", e);
    ctx.out.say(eventLine(e, names));
  };
  let after: string | null = null;
  for (;;) {
    const page = await logsPage(ctx.client, taskId, after, 1000, ctx.signal);
    for (const e of page.items) print(e);
    after = page.items.at(-1)?.id ?? after;
    if (page.nextCursor === null) break;
  }
  if (!follow) return EXIT.OK;
  const stream = taskEvents(ctx.client, taskId, { signal: ctx.signal, after, onState: streamNote(ctx) });
  for await (const e of stream) print(e);
  if (ctx.signal.aborted)
    return leftRunning(ctx, taskId, new StoppedFollowing(`stopped following task ${taskId}`, ended));
  const task = await taskGet(ctx.client, taskId, ctx.signal);
  ctx.out.say(summaryLine(task));
  return task.status === "succeeded" ? EXIT.OK : EXIT.TASK_NOT_SUCCEEDED;
}

export const logsSpec = {
  help: LOGS_HELP,
  options: { follow: { type: "boolean", short: "f" } },
  run: (
    ctx: ClientContext,
    { values, positionals }: { values: { follow?: boolean }; positionals: string[] },
  ) => printLogs(ctx, taskIdArg(positionals, "assay logs <taskId> [--follow]"), values.follow === true),
} as const;

export const logsCommand = (argv: string[]) => runClientCommand(logsSpec, argv);
