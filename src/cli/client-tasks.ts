// The small client commands: tasks, status, cancel, files, types.
import { analysisTypes, fileDelete, filePage, runsOf, taskCancel, taskGet, taskPage } from "../client/api.ts";
import { ClientUsageError, EXIT, TaskStateError } from "../client/exit.ts";
import { ApiRequestError } from "../client/http.ts";
import { bytes, fit, fitName, jsonLine, shown, table } from "../client/output.ts";
import { describeParam, type JsonSchema } from "../client/params.ts";
import { isTerminal } from "../client/sse.ts";
import { summaryLine } from "../client/summary.ts";
import type { FileRecord, PageOf, Task, TaskStatus } from "../http/api-types.ts";
import {
  type ClientContext,
  exitCodesHelp,
  intOption,
  noArguments,
  runClientCommand,
  taskIdArg,
} from "./client-common.ts";

// The task statuses, checked against the server's list: a status added there fails the build here.
const STATUS_LIST: Record<TaskStatus, true> = {
  queued: true,
  running: true,
  cancelling: true,
  succeeded: true,
  partially_succeeded: true,
  failed: true,
  timed_out: true,
  cancelled: true,
};
const TASK_STATUSES = Object.keys(STATUS_LIST) as TaskStatus[];

/** Up to `limit` items of a paged list, asking for pages of at most 100. */
async function upTo<T>(
  limit: number,
  page: (q: { limit: number; cursor?: string }) => Promise<PageOf<T>>,
): Promise<T[]> {
  const items: T[] = [];
  for (let cursor: string | undefined; items.length < limit; ) {
    const p = await page({
      limit: Math.min(100, limit - items.length),
      ...(cursor === undefined ? {} : { cursor }),
    });
    items.push(...p.items);
    if (p.nextCursor === null) break;
    cursor = p.nextCursor;
  }
  return items;
}

const when = (iso: string | null) => (iso ? iso.replace("T", " ").replace(/\.\d+Z$/, "Z") : "-");

// ---- tasks -----------------------------------------------------------------------------------

const TASKS_HELP = `Usage: assay tasks [--status S] [--type T] [--limit N]

Lists your tasks (an admin's: everyone's), newest first: id, type, status, runs done of total,
progress, created. --status is one of ${TASK_STATUSES.join(", ")}.

${exitCodesHelp(["0 listed", "2 bad arguments"])}

Examples:
  assay tasks --status running
  assay tasks --limit 200 --json | jq -r 'select(.status=="failed").taskId'`;

export const tasksCommand = (argv: string[]) =>
  runClientCommand(
    {
      help: TASKS_HELP,
      options: { status: { type: "string" }, type: { type: "string" }, limit: { type: "string" } } as const,
      run: async (
        ctx: ClientContext,
        {
          values,
          positionals,
        }: { values: { status?: string; type?: string; limit?: string }; positionals: string[] },
      ) => {
        noArguments(positionals);
        const limit = intOption(values.limit, "limit", 20, 10_000);
        const status = values.status as TaskStatus | undefined;
        if (status !== undefined && !TASK_STATUSES.includes(status)) {
          throw new ClientUsageError(`--status must be one of ${TASK_STATUSES.join(", ")}`);
        }
        const tasks = await upTo(limit, (q) =>
          taskPage(
            ctx.client,
            {
              ...q,
              ...(status === undefined ? {} : { status }),
              ...(values.type === undefined ? {} : { analysisType: values.type }),
            },
            ctx.signal,
          ),
        );
        for (const t of tasks) ctx.out.line("task", t);
        ctx.out.say(
          tasks.length === 0
            ? "No tasks."
            : table(
                ["ID", "TYPE", "STATUS", "RUNS", "PROGRESS", "CREATED"],
                tasks.map((t) => [
                  t.taskId,
                  t.analysisType,
                  t.status,
                  `${done(t)}/${t.totalCount}`,
                  `${t.progressPercent}%`,
                  when(t.createdAt),
                ]),
              ),
        );
        return EXIT.OK;
      },
    },
    argv,
  );

const done = (t: Task) => t.succeededCount + t.failedCount + t.timedOutCount + t.cancelledCount;

/**
 * Requests made side by side, as Promise.all, but the first to fail for good aborts the others (their
 * retries too): the command ends with that failure at once, not once the others have given up.
 */
async function together<T extends readonly unknown[]>(
  signal: AbortSignal,
  start: (signal: AbortSignal) => { [K in keyof T]: Promise<T[K]> },
): Promise<T> {
  const failed = new AbortController();
  const requests = start(AbortSignal.any([signal, failed.signal]));
  return (await Promise.all(
    requests.map((p) =>
      p.catch((err: unknown) => {
        failed.abort(err);
        throw err;
      }),
    ),
  )) as unknown as T;
}

// ---- status ----------------------------------------------------------------------------------

const STATUS_HELP = `Usage: assay status <taskId>

Shows a task (status, counts, progress, times) and each of its runs (status, attempt, progress,
input file, error). Exits 0 whatever the task's state; assay follow waits for its end.

${exitCodesHelp(["0 shown, whatever the task's state", "2 bad arguments, or no task of yours has that id"])}

Example:
  assay status 100000042`;

export const statusCommand = (argv: string[]) =>
  runClientCommand(
    {
      help: STATUS_HELP,
      options: {},
      run: async (ctx: ClientContext, { positionals }: { positionals: string[] }) => {
        const taskId = taskIdArg(positionals, "assay status <taskId>");
        const [task, runs] = await together(ctx.signal, (signal) => [
          taskGet(ctx.client, taskId, signal),
          runsOf(ctx.client, taskId, undefined, signal),
        ]);
        ctx.out.line("task", task);
        for (const r of runs) ctx.out.line("run", r);
        ctx.out.say(
          [
            isTerminal(task.status)
              ? summaryLine(task)
              : `Task ${task.taskId} ${task.status}: ${done(task)} of ${task.totalCount} runs done, ${task.progressPercent}%`,
            // As JSON with C1 controls escaped too (JSON.stringify leaves them): another user's
            // parameters (an admin's view) must not drive the terminal.
            `  type ${task.analysisType}, owner ${shown(task.owner)}, parameters ${jsonLine(task.parameters)}`,
            `  created ${when(task.createdAt)}, started ${when(task.startedAt)}, finished ${when(task.finishedAt)}`,
            "",
            table(
              ["RUN", "STATUS", "ATTEMPT", "PROGRESS", "FILE", "ERROR"],
              runs.map((r) => [
                r.runId,
                r.status,
                String(r.attempt),
                `${r.progressPercent}%`,
                fitName(shown(r.fileName), 40),
                r.errorCode
                  ? `${r.errorCode}${r.errorMessage ? `: ${fit(shown(r.errorMessage), 60)}` : ""}`
                  : shown(r.message),
              ]),
            ),
          ].join("\n"),
        );
        return EXIT.OK;
      },
    },
    argv,
  );

// ---- cancel ----------------------------------------------------------------------------------

const CANCEL_HELP = `Usage: assay cancel <taskId>

Cancels a task: its queued runs end at once, running programs are stopped. Exits 1 when the task
had already ended.

${exitCodesHelp([
  "0 the cancellation was accepted",
  "1 the task had already ended",
  "2 bad arguments, or no task of yours has that id",
])}

Example:
  assay cancel 100000042`;

export const cancelCommand = (argv: string[]) =>
  runClientCommand(
    {
      help: CANCEL_HELP,
      options: {},
      run: async (ctx: ClientContext, { positionals }: { positionals: string[] }) => {
        const taskId = taskIdArg(positionals, "assay cancel <taskId>");
        try {
          const r = await taskCancel(ctx.client, taskId, ctx.signal);
          ctx.out.line("cancel", r);
          ctx.out.say(`Cancellation accepted: task ${r.taskId} is ${r.status}`);
          return EXIT.OK;
        } catch (err) {
          if (err instanceof ApiRequestError && err.code === "ANALYSIS_TASK_ALREADY_FINISHED") {
            const task = await taskGet(ctx.client, taskId, ctx.signal);
            throw new TaskStateError(`task ${taskId} had already ended (${task.status})`);
          }
          throw err;
        }
      },
    },
    argv,
  );

// ---- files -----------------------------------------------------------------------------------

const FILES_HELP = `Usage: assay files [--limit N]
       assay files rm <fileId>...

Lists your uploaded files (an admin's: everyone's), newest first: id, size, SHA-256, uploaded, name.
\`rm\` deletes files, record and bytes (yours; an admin: anyone's). Tasks made from them keep their
outputs; a run that has not read its file yet fails ANALYSIS_INPUT_INVALID. Every id is tried; the
command exits 2 when one names no file of yours.

${exitCodesHelp(["0 listed, or every file deleted", "2 bad arguments, or an id that names no file of yours"])}

Examples:
  assay files --limit 100
  assay files rm 1000000042 1000000043`;

/** \`assay files rm <fileId>...\`: each deleted in turn; the first failure is thrown after the rest. */
async function filesRemove(ctx: ClientContext, ids: string[]): Promise<number> {
  if (ids.length === 0) throw new ClientUsageError("usage: assay files rm <fileId>...");
  for (const id of ids)
    if (!/^[1-9][0-9]{0,17}$/.test(id)) throw new ClientUsageError(`not a file id: ${shown(id)}`);
  const missing: string[] = [];
  let failed: ApiRequestError | undefined;
  for (const id of new Set(ids)) {
    try {
      const r = await fileDelete(ctx.client, id, ctx.signal);
      ctx.out.line("deleted", r);
      ctx.out.say(`Deleted file ${r.fileId}`);
    } catch (err) {
      // Another file's answer says nothing about this one's: only a 404 goes on to the next id. The
      // ids found missing before it are said first, or its error would be all that is told.
      if (!(err instanceof ApiRequestError && err.code === "FILE_NOT_FOUND")) {
        if (missing.length > 0)
          ctx.out.note(
            `no ${missing.length === 1 ? "file" : "files"} ${missing.join(", ")} of yours (FILE_NOT_FOUND)`,
          );
        throw err;
      }
      missing.push(id);
      failed ??= err;
    }
  }
  // One error naming every id that failed (a script reading JSON lines is told them too), not a note
  // per id and the API's own message after them.
  if (failed)
    throw new ApiRequestError(
      failed.status,
      failed.code,
      `no ${missing.length === 1 ? "file" : "files"} ${missing.join(", ")} of yours`,
    );
  return EXIT.OK;
}

export const filesCommand = (argv: string[]) =>
  runClientCommand(
    {
      help: FILES_HELP,
      options: { limit: { type: "string" } } as const,
      run: async (
        ctx: ClientContext,
        { values, positionals }: { values: { limit?: string }; positionals: string[] },
      ) => {
        if (positionals[0] === "rm") {
          if (values.limit !== undefined) throw new ClientUsageError("--limit is for the listing, not rm");
          return filesRemove(ctx, positionals.slice(1));
        }
        noArguments(positionals);
        const limit = intOption(values.limit, "limit", 20, 100_000);
        const files: FileRecord[] = await upTo(limit, (q) => filePage(ctx.client, q, ctx.signal));
        for (const f of files) ctx.out.line("file", f);
        ctx.out.say(
          files.length === 0
            ? "No files."
            : table(
                ["ID", "SIZE", "SHA256", "UPLOADED", "NAME"],
                files.map((f) => [
                  f.fileId,
                  bytes(f.sizeBytes),
                  f.sha256.slice(0, 12),
                  when(f.createdAt),
                  shown(f.name),
                ]),
              ),
        );
        return EXIT.OK;
      },
    },
    argv,
  );

// ---- types -----------------------------------------------------------------------------------

const TYPES_HELP = `Usage: assay types

Lists the analysis types: whether a live worker runs them, what they do, and their parameters.

${exitCodesHelp(["0 listed", "2 bad arguments"])}

Example:
  assay types`;

export const typesCommand = (argv: string[]) =>
  runClientCommand(
    {
      help: TYPES_HELP,
      options: {},
      run: async (ctx: ClientContext, { positionals }: { positionals: string[] }) => {
        noArguments(positionals);
        const types = await analysisTypes(ctx.client, ctx.signal);
        for (const t of types) ctx.out.line("type", t);
        for (const t of types) {
          const schema = t.parameters as JsonSchema;
          const required = new Set(schema.required ?? []);
          ctx.out.say(
            `${t.name} — ${t.available ? `${t.workers} worker(s)` : `unavailable: ${shown(t.reason)}`}`,
          );
          ctx.out.say(`  ${t.description}`);
          for (const [name, prop] of Object.entries(schema.properties ?? {})) {
            ctx.out.say(`  --param ${describeParam(name, prop, required.has(name))}`);
          }
        }
        return EXIT.OK;
      },
    },
    argv,
  );
