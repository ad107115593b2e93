// `assay submit`: from a folder of files to a task (and, with --out, to a folder of results).
// Order matters for "nothing half-created": the type and its parameters are checked and --out is
// made before anything is uploaded; Ctrl-C during hashing or uploads cancels the requests in
// flight (the server keeps nothing of an unfinished upload) and creates no task; the create itself
// is one request that Ctrl-C does not cut off, so a task either exists whole or not at all.
import { randomUUID } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { analysisTypes, runsOf, taskCreate } from "../client/api.ts";
import { checkDownloadPaths, folderNames, foldersFromLabels, makeFolders } from "../client/download.ts";
import { ClientUsageError, EXIT, Interrupted, messageOf, PathConflict } from "../client/exit.ts";
import { type ApiClient, ApiRequestError, ConnectionError, retryPause } from "../client/http.ts";
import type { ListedInput, LocalInput } from "../client/inputs.ts";
import { fromCommandLine, listInputs } from "../client/inputs.ts";
import { bytes, fit, seconds, shown } from "../client/output.ts";
import { type JsonSchema, knownParams, paramProblems, parseParams } from "../client/params.ts";
import { mapLimit, sleep } from "../client/pool.ts";
import { findCopies, hashInputs, uploadFile } from "../client/upload.ts";
import type { AnalysisTypeInfo, FileRecord, TaskCreated } from "../http/api-types.ts";
import { type ClientContext, intOption, runClientCommand, shellWord } from "./client-common.ts";
import { downloadReported } from "./client-download.ts";
import { followTask, leftRunning, report } from "./client-follow.ts";

const HELP = `Usage: assay submit --type <type> [--param key=value]… <file|dir>… [--follow] [--out DIR]
                    [--idempotency-key K] [--concurrency N]

Uploads the files (directories are walked, hidden files and an --out inside them skipped),
skipping every file you already uploaded with the same content (same SHA-256), and creates one task
with a run per file. Prints the task id. The parameters are checked against the type's schema
before anything is uploaded.

  -t, --type T             the analysis type (assay types lists them)
  -p, --param key=value    a parameter; repeat a list parameter's key for each item
                           (--param columns=a --param columns=b), or give a JSON array
  -f, --follow             show the task live until it ends (as assay follow)
  -o, --out DIR            when the task ends, download its outputs: DIR/<input path>/<output
                           files>, and DIR/results.csv
      --idempotency-key K  the same key again returns the same task instead of a new one
                           (1 to 200 visible ASCII characters, no spaces)
      --concurrency N      uploads (and downloads) at once (default 8, at most 64)

Exit codes: 0 created (with --follow or --out: the task succeeded); 1 the task failed, partially
succeeded, timed out or was cancelled; 2 bad arguments or parameters (nothing uploaded), or
something in the way of --out's download (nothing uploaded when the inputs' paths show it; else
found as the outputs are downloaded, after the task ran); 3 the server cannot be reached or
refuses the token; 130 Ctrl-C (during uploads: no task was created; while following: the task goes
on); 141 stdout was closed by its reader.

Examples:
  assay submit --type summary data/ --follow --out results/
  assay submit --type python-stats --param method=median --param columns=price data/*.csv
  assay submit --type r-report --param title="Q3 report" q3.csv --json | jq -r 'select(.kind=="task").taskId'`;

const OPTIONS = {
  type: { type: "string", short: "t" },
  param: { type: "string", short: "p", multiple: true },
  follow: { type: "boolean", short: "f" },
  out: { type: "string", short: "o" },
  "idempotency-key": { type: "string" },
  concurrency: { type: "string" },
} as const;

interface SubmitValues {
  type?: string;
  param?: string[];
  follow?: boolean;
  out?: string;
  "idempotency-key"?: string;
  concurrency?: string;
}

/** The analysis type by name, with a list of the known ones when it is not one. */
async function chooseType(
  c: ApiClient,
  name: string | undefined,
  signal: AbortSignal,
): Promise<AnalysisTypeInfo> {
  const types = await analysisTypes(c, signal);
  const known = types.map((t) => t.name).join(", ");
  if (!name) throw new ClientUsageError(`--type is required (one of ${known})`);
  const type = types.find((t) => t.name === name);
  if (!type) throw new ClientUsageError(`unknown analysis type ${name} (one of ${known})`);
  return type;
}

async function checkedParams(type: AnalysisTypeInfo, pairs: string[]): Promise<Record<string, unknown>> {
  const schema = type.parameters as JsonSchema;
  const params = parseParams(pairs, schema, type.name);
  const problems = await paramProblems(params, schema);
  if (problems.length > 0) {
    throw new ClientUsageError(
      `invalid parameters for ${type.name}: ${problems.join("; ")} (${knownParams(schema)})`,
    );
  }
  return params;
}

/**
 * The inputs without what a directory's walk found inside --out when --out is a folder below that
 * directory (`submit data --out data/results`): the outputs of the last submit are no inputs of the
 * next. A file named by itself stays, and so does everything when --out is the directory itself (its
 * files are where their runs' folders would go: a PathConflict).
 */
export function outsideOut<T extends { path: string; file?: Buffer }>(
  listed: T[],
  out: string | undefined,
  args: string[],
): T[] {
  if (out === undefined) return listed;
  // Compared as real paths: an --out reached through a link (`--out reslink`, a link to data/res) is
  // the folder it leads to (until 2026-12-07 its files were walked as inputs).
  const root = realPath(path.resolve(out));
  const below = (p: string, dir: string) => p.startsWith(dir.endsWith(path.sep) ? dir : dir + path.sep);
  // An argument's own bytes (a name that is not UTF-8 reaches Node with U+FFFD in it: fromCommandLine
  // finds the name meant, as listInputs did).
  const argBytes = (a: string) => fromCommandLine(a)?.file ?? path.resolve(a);
  if (!args.some((a) => below(root, realPath(argBytes(a))))) return listed;
  // As listInputs names them (a name that is not UTF-8 by its `%XX` form).
  const named = new Set(args.map((a) => fromCommandLine(a)?.path ?? path.resolve(a)));
  const kept = listed.filter((f) => named.has(f.path) || !below(realPath(f.file ?? f.path), root));
  if (kept.length === 0)
    throw new ClientUsageError(`no files found in ${args.join(", ")} outside --out ${out}`);
  return kept;
}

/**
 * `p` with every link resolved, as far as it exists (the rest as given: an --out not made yet), as
 * its bytes, one character each (latin1): names that are not UTF-8 differ only there — decoded as
 * UTF-8, `r\xE9s` and `r\xE8s` both read `r\uFFFDs`, and a sibling folder of --out's was taken for it.
 */
function realPath(p: string | Buffer): string {
  const bytes = typeof p === "string" ? Buffer.from(p) : p;
  try {
    return fs.realpathSync.native(bytes, { encoding: "buffer" }).toString("latin1");
  } catch {
    const text = bytes.toString("latin1");
    const parent = path.dirname(text);
    return parent === text ? text : path.join(realPath(Buffer.from(parent, "latin1")), path.basename(text));
  }
}

/**
 * The run folders --out will get, as far as they are known before the runs exist (foldersFromLabels):
 * a folder made unique by its run's id (" (run <id>)") only as far as its parent.
 */
function plannedFolders(listed: { label: string }[]): { folder: string; what: string }[] {
  const folders = foldersFromLabels(listed.map((f, i) => ({ runId: String(i), label: f.label })));
  return listed.flatMap((f, i) => {
    let folder = folders.get(String(i)) as string;
    if (folder.endsWith(` (run ${i})`)) folder = path.posix.dirname(folder);
    return folder === "." ? [] : [{ folder, what: `the outputs of ${f.label}` }];
  });
}

/**
 * --out checked against what is there (a file where it or a run's folder goes: PathConflict), made
 * and shown writable — before anything is uploaded or a task created.
 */
function prepareOut(dir: string | undefined, listed: { label: string }[]): string | undefined {
  if (dir === undefined) return undefined;
  const full = path.resolve(dir);
  try {
    checkDownloadPaths(full, plannedFolders(listed));
    makeFolders(full);
    fs.accessSync(full, fs.constants.W_OK);
  } catch (err) {
    // What the system says of a path it cannot look at (a loop of links, a name too long, no access)
    // is said of --out, as before the check.
    if (err instanceof PathConflict) throw err;
    throw new ClientUsageError(`cannot write to --out ${dir}: ${(err as Error).message}`);
  }
  return full;
}

interface Sent {
  inputs: LocalInput[];
  records: FileRecord[];
  uploaded: number;
}

type Bars = import("../client/tty.ts").UploadBars | undefined;

async function hashAll(ctx: ClientContext, listed: ListedInput[], bars: Bars, concurrency: number) {
  const total = listed.reduce((a, f) => a + fs.statSync(f.file ?? f.path).size, 0);
  const hashed = bars?.hashing(total, listed.length);
  let doneBytes = 0;
  let doneFiles = 0;
  return hashInputs(listed, concurrency, ctx.signal, (n) => {
    doneBytes += n;
    doneFiles++;
    hashed?.(doneBytes, doneFiles);
  });
}

/**
 * Uploads `inputs[i]` for every i of `missing`; their records by index. Inputs of the same bytes go
 * one after another: an upload whose answer was lost looks for the file it made among those of its
 * hash (uploadFile), and must not take one another upload in flight has just made. `claimed` holds
 * the file ids already taken (the copies found); every upload's is added.
 */
async function uploadAll(
  ctx: ClientContext,
  inputs: LocalInput[],
  missing: number[],
  claimed: Set<string>,
  bars: Bars,
  concurrency: number,
): Promise<Map<number, FileRecord>> {
  if (missing.length === 0) return new Map();
  bars?.uploading(
    missing.reduce((a, i) => a + (inputs[i]?.sizeBytes ?? 0), 0),
    missing.length,
  );
  const byHash = new Map<string, number[]>();
  for (const i of missing) {
    const sha256 = (inputs[i] as LocalInput).sha256;
    byHash.set(sha256, [...(byHash.get(sha256) ?? []), i]);
  }
  const uploader = await ctx.client.uploader(concurrency);
  try {
    const uploads = await mapLimit([...byHash.values()], concurrency, async (same) => {
      const records: (readonly [number, FileRecord])[] = [];
      for (const i of same) {
        const input = inputs[i] as LocalInput;
        const record = await uploadFile(
          uploader,
          input,
          ctx.signal,
          (n) => bars?.sent(n, false, missing.length),
          claimed,
        );
        bars?.sent(0, true, missing.length);
        fileLine(ctx, input, record, true);
        records.push([i, record]);
      }
      return records;
    });
    return new Map(uploads.flat());
  } finally {
    uploader.close();
  }
}

/** Hashes, finds copies, uploads the rest: one record per input, in order. */
async function sendFiles(ctx: ClientContext, listed: ListedInput[], concurrency: number): Promise<Sent> {
  const t0 = performance.now();
  const bars: Bars = ctx.out.tty
    ? new (await import("../client/tty.ts")).UploadBars(ctx.out.stream)
    : undefined;
  // An upload's retry notes go above the bars, not under them.
  if (bars) ctx.out.drawing((line) => bars.log(line));
  try {
    const inputs = await hashAll(ctx, listed, bars, concurrency);
    const t1 = performance.now();
    const copies = await findCopies(ctx.client, inputs, concurrency, ctx.signal);
    const t2 = performance.now();
    const missing = inputs.map((_, i) => i).filter((i) => !copies.has(i));
    const claimed = new Set([...copies.values()].map((f) => f.fileId));
    const fresh = await uploadAll(ctx, inputs, missing, claimed, bars, concurrency);
    const t3 = performance.now();
    const records = inputs.map((input, i) => {
      const copy = copies.get(i);
      if (copy) fileLine(ctx, input, copy, false);
      return copy ?? (fresh.get(i) as FileRecord);
    });
    ctx.out.drawing(undefined);
    bars?.stop();
    const sentBytes = missing.reduce((a, i) => a + (inputs[i]?.sizeBytes ?? 0), 0);
    const sec = (a: number, b: number) => Math.round(b - a) / 1000;
    ctx.out.line("upload", {
      files: inputs.length,
      uploaded: missing.length,
      reused: copies.size,
      bytes: sentBytes,
      seconds: sec(t0, t3),
      hashSeconds: sec(t0, t1),
      lookupSeconds: sec(t1, t2),
      uploadSeconds: sec(t2, t3),
    });
    ctx.out.say(
      `${inputs.length} files: ${missing.length} uploaded (${bytes(sentBytes)}), ${copies.size} already on the server (${seconds(t3 - t0)})`,
    );
    return { inputs, records, uploaded: missing.length };
  } finally {
    ctx.out.drawing(undefined);
    bars?.stop();
  }
}

function fileLine(ctx: ClientContext, input: LocalInput, record: FileRecord, uploaded: boolean): void {
  ctx.out.line("file", { path: input.label, uploaded, ...record });
}

/** How long creating the task is retried (an API restarting, a proxy's 502) before the command gives up. */
const CREATE_RETRY_MS = 60_000;

/**
 * POST the task, retried with the same Idempotency-Key while the connection fails or the server
 * answers 5xx (the retry returns the task if an earlier attempt got through), for up to
 * CREATE_RETRY_MS. Not cut off by Ctrl-C, which only stops the retries. A failure that may have
 * left a task names the key that gets it back rather than make a second one.
 */
async function createTask(
  ctx: ClientContext,
  type: string,
  sent: Sent,
  parameters: Record<string, unknown>,
  key: string,
): Promise<TaskCreated> {
  const body = { analysisType: type, inputFileIds: sent.records.map((r) => r.fileId), parameters };
  const t0 = performance.now();
  for (let attempt = 1; ; attempt++) {
    try {
      return await taskCreate(ctx.client, body, key);
    } catch (err) {
      const unsure = err instanceof ConnectionError || (err instanceof ApiRequestError && err.status >= 500);
      if (!unsure) throw err;
      const more = `the task may exist: the same command with --idempotency-key ${key} returns it instead of creating another`;
      if (ctx.signal.aborted) throw new Interrupted(`interrupted while creating the task; ${more}`);
      if (performance.now() - t0 >= CREATE_RETRY_MS) {
        if (err instanceof ApiRequestError)
          throw new ApiRequestError(err.status, err.code, `${err.message}; ${more}`);
        throw new ConnectionError(`${(err as Error).message}; ${more}`);
      }
      ctx.out.note(`the task's creation was not confirmed (${messageOf(err)}); retrying`);
      await sleep(retryPause(attempt), ctx.signal);
    }
  }
}

/** A run as both layouts see it: its input's label (submit's) and its input file's name (download's). */
type LaidOut = { runId: string; fileName: string; label: string };

/**
 * Whether `assay download` lays `runs` out as submit --out does: submit names a run's folder after
 * its input's label (foldersFromLabels: `sub/a.csv/`), the download after its input file's name
 * (folderNames: `a.csv/`), as the zip does. They differ for inputs inside a folder, and for a label
 * whose name the server stores otherwise.
 */
function sameLayout(runs: LaidOut[]): boolean {
  const byLabel = foldersFromLabels(runs);
  const byName = folderNames(runs);
  return runs.every((r) => byLabel.get(r.runId) === byName.get(r.runId));
}

/**
 * What fetches the outputs again after submit's download into `out` failed or was interrupted:
 * `assay download` into `out`, when it lays them out as submit does; else (it would write a second
 * tree, by file name, beside the first) what it does, into another folder. `again`: "" for a download
 * that has not begun (Ctrl-C while the task runs). `runs`: those that
 * succeeded, or, when their list never came, every input, numbered.
 */
function fetchAgain(taskId: string, out: string, runs: LaidOut[], what: string, again = " again"): string {
  if (sameLayout(runs)) return `assay download ${taskId} --out ${shellWord(out)} fetches ${what}${again}`;
  return `assay download ${taskId} --out DIR fetches the outputs laid out by input file name, not by folder as in ${shellWord(out)}: give it a DIR other than that`;
}

/**
 * Downloads into `out`, the runs' folders named after their inputs' labels; `plan.runs` is set to
 * the runs that succeeded once their list has come.
 */
async function downloadTo(
  ctx: ClientContext,
  taskId: string,
  out: string,
  sent: Sent,
  concurrency: number,
  plan: { runs?: LaidOut[] },
) {
  const labelOf = new Map(sent.records.map((r, i) => [r.fileId, sent.inputs[i]?.label ?? r.name]));
  const runs = await runsOf(ctx.client, taskId, "succeeded", ctx.signal);
  plan.runs = runs.map((run) => ({
    runId: run.runId,
    fileName: run.fileName,
    label: labelOf.get(run.inputFileId) ?? run.fileName,
  }));
  const folders = foldersFromLabels(plan.runs);
  const { got, files } = await downloadReported(
    ctx,
    taskId,
    runs.map((run) => ({ run, folder: folders.get(run.runId) as string })),
    out,
    concurrency,
  );
  ctx.out.say(
    `Downloaded ${files} files of ${got.runs.length} runs to ${shown(out)} (and ${path.basename(got.resultsCsv)})`,
  );
}

/**
 * The server's rule for an Idempotency-Key (1–200 visible ASCII characters), checked before
 * anything is uploaded: the server would refuse it only after every upload, and a character outside
 * Latin-1 cannot even go into a header, which fetch reports like a network failure.
 */
const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,200}$/;

function idempotencyKey(given: string | undefined): string {
  if (given === undefined) return `assay-cli-${randomUUID()}`;
  if (!IDEMPOTENCY_KEY.test(given))
    throw new ClientUsageError(
      `--idempotency-key must be 1 to 200 visible ASCII characters (no spaces), not ${JSON.stringify(fit(shown(given), 40))}`,
    );
  return given;
}

async function submit(ctx: ClientContext, values: SubmitValues, positionals: string[]): Promise<number> {
  const key = idempotencyKey(values["idempotency-key"]);
  const concurrency = intOption(values.concurrency, "concurrency", 8, 64);
  // `--out "$DIR"` with DIR unset: not the current folder.
  if (values.out === "") throw new ClientUsageError("--out is empty: name the folder to download into");
  const listed = outsideOut(
    listInputs(positionals, (text) => ctx.out.note(text)),
    values.out,
    positionals,
  );
  const out = prepareOut(values.out, listed);
  const type = await chooseType(ctx.client, values.type, ctx.signal);
  const parameters = await checkedParams(type, values.param ?? []);
  if (!type.available)
    ctx.out.note(`no worker runs ${type.name} right now (${type.reason}); its runs will wait for one`);
  let sent: Sent;
  try {
    sent = await sendFiles(ctx, listed, concurrency);
  } catch (err) {
    if (!(err instanceof Interrupted) && !ctx.signal.aborted) throw err;
    const message = "interrupted: no task was created (files uploaded in full are reused next time)";
    return ctx.out.interrupted(message);
  }
  const created = await createTask(ctx, type.name, sent, parameters, key);
  ctx.out.line("task", {
    taskId: created.taskId,
    status: created.status,
    analysisType: type.name,
    runs: listed.length,
  });
  ctx.out.say(`Task ${created.taskId} created: ${type.name} over ${listed.length} files`);
  // With --out: how to fetch the outputs later, as a download that fails says it (fetchAgain), the
  // runs numbered as their inputs are (their ids are not known here).
  const fetchLater = out
    ? fetchAgain(
        created.taskId,
        out,
        sent.records.map((r, i) => ({
          runId: String(i),
          fileName: r.name,
          label: sent.inputs[i]?.label ?? r.name,
        })),
        "its outputs",
        "",
      )
    : undefined;
  if (ctx.signal.aborted) return leftRunning(ctx, created.taskId, undefined, fetchLater);
  if (!values.follow && !out) {
    ctx.out.say(`Follow it with: assay follow ${created.taskId}`);
    return EXIT.OK;
  }
  if (!values.follow)
    ctx.out.say(`Waiting for task ${created.taskId} to end, then downloading into ${shown(out ?? "")}…`);
  let result: Awaited<ReturnType<typeof followTask>>;
  try {
    result = await followTask(ctx, created.taskId, { show: values.follow === true });
  } catch (err) {
    if (err instanceof Interrupted || ctx.signal.aborted)
      return leftRunning(ctx, created.taskId, err, fetchLater);
    throw err;
  }
  // Also when no run succeeded: results.csv still says what became of every run.
  if (out) {
    const plan: { runs?: LaidOut[] } = {};
    try {
      await downloadTo(ctx, created.taskId, out, sent, concurrency, plan);
    } catch (err) {
      const runs =
        plan.runs ??
        (result.task.succeededCount === 0
          ? []
          : sent.records.map((r, i) => ({
              runId: String(i),
              fileName: r.name,
              label: sent.inputs[i]?.label ?? r.name,
            })));
      const again = (what: string) => fetchAgain(created.taskId, out, runs, what);
      if (!(err instanceof Interrupted) && !ctx.signal.aborted) {
        if (result.task.succeededCount > 0) throw withMore(err, again("the outputs"));
        // Only the table was to come: its failure must not hide the task's own outcome below.
        ctx.out.note(`results.csv could not be downloaded (${messageOf(err)}); ${again("it")}`);
        return report(ctx, result);
      }
      const message = `download interrupted; ${again("it")}`;
      return ctx.out.interrupted(message, { taskId: created.taskId });
    }
  }
  return report(ctx, result);
}

/** `err` with `more` after its message, of its own class still (its exit code and error code). */
function withMore(err: unknown, more: string): unknown {
  if (err instanceof Error) err.message = `${err.message}; ${more}`;
  return err;
}

export const submitSpec = {
  help: HELP,
  options: OPTIONS,
  run: (ctx: ClientContext, { values, positionals }: { values: SubmitValues; positionals: string[] }) =>
    submit(ctx, values, positionals),
};

export const submitCommand = (argv: string[]) => runClientCommand(submitSpec, argv);
