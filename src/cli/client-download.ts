// `assay download <taskId>`: a finished task's outputs into a folder.
import path from "node:path";
import { runsOf, taskGet } from "../client/api.ts";
import { downloadOutputs, folderNames } from "../client/download.ts";
import { ClientUsageError, EXIT, Interrupted, TaskStateError } from "../client/exit.ts";
import { shown } from "../client/output.ts";
import { isTerminal } from "../client/sse.ts";
import { summaryLine } from "../client/summary.ts";
import type { Run } from "../http/api-types.ts";
import {
  type ClientContext,
  exitCodesHelp,
  intOption,
  runClientCommand,
  shellWord,
  taskIdArg,
} from "./client-common.ts";
import { failedRuns, problemsOf, sayProblems } from "./client-follow.ts";

// ---- download --------------------------------------------------------------------------------

const DOWNLOAD_HELP = `Usage: assay download <taskId> [--out DIR] [--concurrency N]

Downloads a finished task's outputs: DIR/<input file name>/<output files> for every run that
succeeded (a repeated input name gets " (run <id>)"), and DIR/results.csv with a row per run.
DIR (-o) defaults to task-<taskId>; --concurrency N downloads at once (default 8, at most 64).
A download whose connection breaks off is tried again (5 times in all), an output file from the
byte it had reached; a file is under its own name only once it is whole.

${exitCodesHelp([
  "0 the task succeeded",
  "1 it ended otherwise (the outputs of the runs that succeeded are still downloaded) or has not ended yet",
  "2 bad arguments, no task of yours has that id, or something in the way of DIR's files, or a file that cannot be written (a full disk)",
])}

Example:
  assay download 100000042 --out results/`;

export const downloadCommand = (argv: string[]) =>
  runClientCommand(
    {
      help: DOWNLOAD_HELP,
      options: { out: { type: "string", short: "o" }, concurrency: { type: "string" } } as const,
      run: async (
        ctx: ClientContext,
        { values, positionals }: { values: { out?: string; concurrency?: string }; positionals: string[] },
      ) => {
        const taskId = taskIdArg(positionals, "assay download <taskId> [--out DIR]");
        const concurrency = intOption(values.concurrency, "concurrency", 8, 64);
        // `--out "$DIR"` with DIR unset: not the current folder.
        if (values.out === "") throw new ClientUsageError("--out is empty: name the folder to download into");
        const task = await taskGet(ctx.client, taskId, ctx.signal);
        if (!isTerminal(task.status)) {
          throw new TaskStateError(
            `task ${taskId} has not ended (${task.status}): wait with assay follow ${taskId}`,
          );
        }
        // With no run succeeded there are no outputs, but results.csv still says what became of
        // every run: it is written all the same.
        const out = path.resolve(values.out ?? `task-${taskId}`);
        const runs = await runsOf(ctx.client, taskId, "succeeded", ctx.signal);
        const folders = folderNames(runs);
        let downloaded: Awaited<ReturnType<typeof downloadReported>>;
        try {
          downloaded = await downloadReported(
            ctx,
            taskId,
            runs.map((run) => ({ run, folder: folders.get(run.runId) as string })),
            out,
            concurrency,
          );
        } catch (err) {
          if (!(err instanceof Interrupted) && !ctx.signal.aborted) throw err;
          // What a second run does: every file downloaded again, those already there written anew.
          const message = `download interrupted; the same command again (assay download ${taskId} --out ${shellWord(out)}) downloads the outputs again`;
          return ctx.out.interrupted(message, { taskId });
        }
        const { got, files } = downloaded;
        ctx.out.say(
          `Downloaded ${files} files of ${got.runs.length} runs to ${shown(out)}; ${summaryLine(task)}`,
        );
        // As follow's summary: the task, and each run that did not succeed (it has no outputs) — a
        // `summary` line for scripts (a download of a cancelled task said only "runs": 0, and exit 1),
        // a line each for people. The download is done whatever becomes of these reads: without the
        // list, the line has no `failedRuns`, and a note says why.
        let problems: Run[] | undefined = [];
        if (task.status !== "succeeded") {
          try {
            problems = await problemsOf(ctx, task);
          } catch (err) {
            if (ctx.signal.aborted) throw err;
            problems = undefined;
            ctx.out.note(`could not list the runs that did not succeed: ${(err as Error).message}`);
          }
        }
        ctx.out.line("summary", { ...task, ...(problems ? { failedRuns: failedRuns(problems) } : {}) });
        if (problems) sayProblems(ctx, problems);
        return task.status === "succeeded" ? EXIT.OK : EXIT.TASK_NOT_SUCCEEDED;
      },
    },
    argv,
  );

/**
 * Downloads `items` into `out` and reports each run's folder and the total as JSON lines (`download`,
 * `downloaded`); shared by `assay download` and `assay submit --out`.
 */
export async function downloadReported(
  ctx: ClientContext,
  taskId: string,
  items: Parameters<typeof downloadOutputs>[2],
  out: string,
  concurrency: number,
) {
  // On a terminal, a bar of the runs done (a task of hundreds of runs takes a while).
  const bars =
    ctx.out.tty && items.length > 0
      ? new (await import("../client/tty.ts")).DownloadBars(ctx.out.stream, items.length)
      : undefined;
  if (bars) ctx.out.drawing((line) => bars.log(line));
  let got: Awaited<ReturnType<typeof downloadOutputs>>;
  try {
    got = await downloadOutputs(ctx.client, taskId, items, out, {
      concurrency,
      signal: ctx.signal,
      onRun: (d) => {
        ctx.out.line("download", { dir: path.join(out, d.folder), ...d });
        bars?.run(d.files.length, d.bytes);
      },
      onRetry: (note) => ctx.out.note(note),
    });
  } finally {
    ctx.out.drawing(undefined);
    bars?.stop();
  }
  const files = got.runs.reduce((a, r) => a + r.files.length, 0);
  ctx.out.line("downloaded", { dir: out, runs: got.runs.length, files, resultsCsv: got.resultsCsv });
  return { got, files };
}
