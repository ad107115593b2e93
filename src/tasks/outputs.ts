// What a finished task offers for download: the succeeded runs' recorded outputs in the object store.
import { createHash } from "node:crypto";
import type { Principal } from "../auth/tokens.ts";
import type { Sql } from "../db/client.ts";
import { distinctFileNames, inputFolderKey, runFolder } from "../files/folder-names.ts";
import { type OutputFile, SAFE_NAME } from "../runner/outputs.ts";
import { type ObjectInfo, type ObjectStore, outputObjectKey, taskOutputsPrefix } from "../storage/store.ts";
import { taskVisible, visible } from "./read.ts";
import { TERMINAL_TASK_STATUSES } from "./states.ts";

export interface RunOutput {
  runId: string;
  inputName: string;
  outputFileName: string;
  /** The recorded output key (runs.output_key), relative to `outputs/`. */
  outputKey: string;
  /** The output files as the run's result recorded them; null for runs from before that was kept. */
  files: OutputFile[] | null;
  /**
   * False when the row names no safe result file or no valid output key: the run's outputs cannot be
   * served, and a download says so (a logged 500) instead of leaving the run out.
   */
  usable: boolean;
}

export type DownloadPlan =
  | { kind: "not-found" }
  | { kind: "not-ready" }
  | { kind: "single"; taskId: string; output: RunOutput }
  /**
   * Read page by page when it is sent: see zipPages. `finishedAt`, the task's end, is every entry's
   * time: the same task's zip is the same bytes whenever it is downloaded.
   */
  | { kind: "zip"; taskId: string; finishedAt: Date };

/** What an output key may look like (see runner/outputs.ts): never anything that leaves `outputs/`. */
const OUTPUT_KEY = /^[0-9]+\/[0-9]+(\.[0-9]+\.[0-9a-f-]+)?$/;

export const outputKeyOf = (output: RunOutput, name: string) => outputObjectKey(output.outputKey, name);

interface OutputRow {
  runId: string;
  inputName: string;
  outputFileName: string | null;
  outputKey: string;
  files: OutputFile[] | null;
}

function runOutput(r: OutputRow): RunOutput {
  const usable = SAFE_NAME.test(r.outputFileName ?? "") && OUTPUT_KEY.test(r.outputKey);
  return {
    runId: r.runId,
    inputName: r.inputName,
    outputFileName: usable ? (r.outputFileName as string) : "",
    outputKey: r.outputKey,
    files: Array.isArray(r.files) ? r.files : null,
    usable,
  };
}

/**
 * The columns of an OutputRow, from `runs r`. A run that succeeded before runs.output_key existed
 * published to `<taskId>/<runId>`.
 */
const outputColumns = (sql: Sql) => sql`
  r.id::text as "runId", r.input_name as "inputName", r.result ->> 'outputFileName' as "outputFileName",
  coalesce(r.output_key, r.task_id::text || '/' || r.id::text) as "outputKey", r.result -> 'files' as files`;

/** The first succeeded run's output (of the task, or the run `runId`). */
async function succeededOutputs(sql: Sql, taskId: string, runId?: string): Promise<RunOutput[]> {
  const rows = await sql<OutputRow[]>`
    select ${outputColumns(sql)} from runs r
    where r.task_id = ${taskId} and r.status = 'succeeded' ${runId ? sql`and r.id = ${runId}` : sql``}
    order by r.id limit 1`;
  return rows.map(runOutput);
}

/** Owner or admin; terminal with at least one success (DESIGN §7). */
export async function taskDownloadPlan(sql: Sql, p: Principal, taskId: string): Promise<DownloadPlan> {
  const [task] = await sql<{ status: string; total: number; finishedAt: Date | null }[]>`
    select t.status, t.total_count as total, t.finished_at as "finishedAt"
    from tasks t where t.id = ${taskId} and ${visible(sql, p)}`;
  if (!task) return { kind: "not-found" };
  if (!(TERMINAL_TASK_STATUSES as readonly string[]).includes(task.status)) return { kind: "not-ready" };
  const [first] = await succeededOutputs(sql, taskId);
  if (!first) return { kind: "not-ready" };
  return task.total === 1
    ? { kind: "single", taskId, output: first }
    : { kind: "zip", taskId, finishedAt: task.finishedAt ?? new Date() };
}

/** Whether the task still exists (retention may delete it while its outputs are read). */
export async function taskExists(sql: Sql, taskId: string): Promise<boolean> {
  const [row] = await sql`select 1 from tasks t where t.id = ${taskId}`;
  return row !== undefined;
}

/** One run's output: the run must have succeeded (its task need not be finished). */
export async function runDownloadPlan(
  sql: Sql,
  p: Principal,
  taskId: string,
  runId: string,
): Promise<DownloadPlan> {
  if (!(await taskVisible(sql, p, taskId))) return { kind: "not-found" };
  const [run] = await sql`select 1 from runs where id = ${runId} and task_id = ${taskId}`;
  if (!run) return { kind: "not-found" };
  const [output] = await succeededOutputs(sql, taskId, runId);
  return output ? { kind: "single", taskId, output } : { kind: "not-ready" };
}

export type RunOutputsPlan =
  | { kind: "not-found" }
  /** The run exists but did not succeed (yet): it has no outputs. */
  | { kind: "none" }
  | { kind: "outputs"; output: RunOutput };

/** One run's outputs, for listing and serving one by one: any run of a visible task, finished or not. */
export async function runOutputsPlan(
  sql: Sql,
  p: Principal,
  taskId: string,
  runId: string,
): Promise<RunOutputsPlan> {
  if (!(await taskVisible(sql, p, taskId))) return { kind: "not-found" };
  const [run] = await sql`select 1 from runs where id = ${runId} and task_id = ${taskId}`;
  if (!run) return { kind: "not-found" };
  const [output] = await succeededOutputs(sql, taskId, runId);
  return output ? { kind: "outputs", output } : { kind: "none" };
}

/**
 * The files of a succeeded run: as its completion recorded them (`runs.result.files`), or — for runs
 * from before that was kept — as the store lists them under the run's output key (safe names only).
 */
export async function runOutputFiles(store: ObjectStore, output: RunOutput): Promise<OutputFile[]> {
  if (output.files) return output.files.filter((f) => SAFE_NAME.test(f.name));
  const prefix = outputObjectKey(output.outputKey, "");
  return (await listAll(store, prefix))
    .map((o) => ({ name: o.key.slice(prefix.length), size: o.size }))
    .filter((f) => SAFE_NAME.test(f.name));
}

/** A run of a zip, with its output files as the store lists them; `names` null: its output is missing. */
export interface ZipRun {
  output: RunOutput;
  /**
   * The run's folder in the zip: its input file's name as one safe path segment, or with ` (run <id>)`
   * when that name could share a folder with another run's, or with the results table, once extracted
   * (runFolder in files/folder-names.ts, the rules the CLI's downloads follow too).
   */
  folder: string;
  /**
   * The run's output files in key order (safe names only); null when one it recorded (or, from before
   * they were recorded, its result file) is not there.
   */
  names: string[] | null;
  /** With `names` null: the first recorded file the store does not hold. */
  missing?: string;
  /**
   * Their names in the zip, by index of `names`: one each once extracted where case is folded
   * (`Report.json` and `report.json`: distinctFileNames, which `assay download` follows too).
   */
  entries: string[];
}

/** Runs per page of a zip (and store objects per listing). */
export const ZIP_PAGE = 1000;

/**
 * A folder key in 48 bits: the task's keys are held as these numbers, 8 bytes a run whatever the
 * names' lengths. Two keys that happen to hash alike only make both folders unique when they need
 * not be: a collision never merges folders.
 */
const keyHash = (key: string) => createHash("sha256").update(key).digest().readUIntBE(0, 6);

/**
 * Which of a task's folders, in the order given (their key hashes, in chunks), share their key with
 * another's: one byte per run, from the hashes sorted once.
 */
function sharedFolders(chunks: readonly Float64Array[]): Uint8Array {
  const sorted = new Float64Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    sorted.set(c, at);
    at += c.length;
  }
  sorted.sort();
  const shared = new Uint8Array(sorted.length);
  let i = 0;
  for (const c of chunks)
    for (const h of c) {
      let lo = 0;
      let hi = sorted.length;
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        if ((sorted[mid] as number) < h) lo = mid + 1;
        else hi = mid;
      }
      shared[i++] = sorted[lo] === h && sorted[lo + 1] === h ? 1 : 0;
    }
  return shared;
}

/**
 * The succeeded runs of a task with their output files, in pages of ZIP_PAGE runs, for a zip that is
 * written page by page: what is in memory at once is one page of runs and one page of the store's
 * listing, plus 9 bytes per run (their ids, in order, and whether their folder is shared; 25 while
 * the folder keys' hashes are compared, before the first page).
 *
 * The order is that of the runs' output keys, so one listing of the task's outputs, read forward in
 * step with the runs, gives every run's files in as many store requests as the task has objects /
 * 1,000 (as one listing before the first byte did, before pages). For `<taskId>/<runId>[.…]` keys,
 * the order of the runs' `<key>/` prefixes is the order of the run ids' decimal text: `.` and `/` sort
 * before every digit. A key of another shape (none is written so) is listed on its own.
 *
 * The run ids and input names are read first, in that order, by one statement read in pages (so the
 * names and the ids are of one snapshot), and kept as packed ids and a byte per run saying whether its
 * folder is shared (from the folder keys' hashes, compared once); each page's
 * rows then by primary key. A run that is gone by then (retention deleted the task) is an error: the
 * zip must not end as if whole without it.
 */
export async function* zipPages(sql: Sql, store: ObjectStore, taskId: string): AsyncGenerator<ZipRun[]> {
  const idChunks: Buffer[] = [];
  const hashChunks: Float64Array[] = [];
  await sql<{ id: string; name: string }[]>`
    select r.id::text as id, r.input_name as name from runs r
    where r.task_id = ${taskId} and r.status = 'succeeded'
    order by r.id::text collate "C"`.cursor(ZIP_PAGE, (rows) => {
    const ids = Buffer.alloc(rows.length * 8);
    const hashes = new Float64Array(rows.length);
    for (const [i, r] of rows.entries()) {
      ids.writeBigInt64BE(BigInt(r.id), i * 8);
      hashes[i] = keyHash(inputFolderKey(r.name));
    }
    idChunks.push(ids);
    hashChunks.push(hashes);
  });
  const packed = Buffer.concat(idChunks);
  const shared = sharedFolders(hashChunks);
  // This frame lives as long as the zip is read: the chunks are copies of what is kept, let them go.
  idChunks.length = 0;
  hashChunks.length = 0;
  const listing = new Listing(store, taskOutputsPrefix(taskId));
  for (let at = 0; at < packed.length; at += ZIP_PAGE * 8) {
    const pageIds: string[] = [];
    for (let i = at; i < Math.min(packed.length, at + ZIP_PAGE * 8); i += 8) {
      pageIds.push(packed.readBigInt64BE(i).toString());
    }
    const rows = await sql<OutputRow[]>`
      select ${outputColumns(sql)} from runs r
      where r.id = any(${sql.array(pageIds, 20)}::bigint[]) and r.task_id = ${taskId} and r.status = 'succeeded'`;
    if (rows.length !== pageIds.length) {
      throw new Error(
        `task ${taskId}: ${pageIds.length - rows.length} succeeded runs went away while zipped`,
      );
    }
    const byId = new Map(rows.map((r) => [r.runId, r]));
    const page: ZipRun[] = [];
    for (const [k, id] of pageIds.entries()) {
      const output = runOutput(byId.get(id) as OutputRow);
      const names = output.usable ? await outputNames(store, listing, taskId, output) : [];
      const missing = missingOutput(output, names);
      page.push({
        output,
        folder: runFolder(output.inputName, output.runId, shared[at / 8 + k] === 1),
        names: missing === undefined ? names : null,
        ...(missing === undefined ? {} : { missing }),
        entries: distinctFileNames(names),
      });
    }
    yield page;
  }
}

/**
 * The first output the run recorded (runOutputFiles' names; a run from before they were recorded: its
 * result file) that the store does not hold, or undefined when it holds them all. A zip without one
 * of them (a `stats.csv` lost beside its `stats.json`) would look whole: it is refused, as fetching
 * that file alone is.
 */
function missingOutput(output: RunOutput, names: readonly string[]): string | undefined {
  const found = new Set(names);
  if (!found.has(output.outputFileName)) return output.outputFileName;
  return (output.files ?? []).find((f) => SAFE_NAME.test(f.name) && !found.has(f.name))?.name;
}

/** The safe names of the objects directly under a run's output key. */
async function outputNames(
  store: ObjectStore,
  listing: Listing,
  taskId: string,
  output: RunOutput,
): Promise<string[]> {
  const prefix = outputObjectKey(output.outputKey, "");
  const [task, rest] = output.outputKey.split("/") as [string, string];
  // Not under the task's prefix: it cannot be read as the task's (as before pages).
  if (task !== taskId) return [];
  const inOrder = rest === output.runId || rest.startsWith(`${output.runId}.`);
  const objects = inOrder ? await listing.take(prefix) : await listAll(store, prefix);
  const names: string[] = [];
  for (const o of objects) {
    const name = o.key.slice(prefix.length);
    if (!name.includes("/") && SAFE_NAME.test(name)) names.push(name);
  }
  return names;
}

async function listAll(store: ObjectStore, prefix: string): Promise<ObjectInfo[]> {
  const all: ObjectInfo[] = [];
  for (let after: string | undefined; ; ) {
    const page = await store.list(prefix, after === undefined ? {} : { after });
    all.push(...page);
    if (page.length < 1000) return all;
    after = page.at(-1)?.key;
  }
}

/** A listing of the store under a prefix, read forward in pages of 1,000 as it is consumed. */
class Listing {
  private page: ObjectInfo[] = [];
  private at = 0;
  private after: string | undefined;
  private done = false;

  private readonly store: ObjectStore;
  private readonly prefix: string;

  constructor(store: ObjectStore, prefix: string) {
    this.store = store;
    this.prefix = prefix;
  }

  /** The next object, without consuming it; undefined at the end. */
  private async peek(): Promise<ObjectInfo | undefined> {
    while (this.at >= this.page.length) {
      if (this.done) return undefined;
      this.page = await this.store.list(this.prefix, this.after === undefined ? {} : { after: this.after });
      this.at = 0;
      this.done = this.page.length < 1000;
      this.after = this.page.at(-1)?.key;
    }
    return this.page[this.at];
  }

  /**
   * The objects under `prefix` (a key prefix under this listing's): those before it are skipped, those
   * after it are left for later calls, which must come in increasing order.
   */
  async take(prefix: string): Promise<ObjectInfo[]> {
    const found: ObjectInfo[] = [];
    for (let o = await this.peek(); o !== undefined; o = await this.peek()) {
      if (o.key.startsWith(prefix)) found.push(o);
      else if (o.key > prefix) break;
      this.at++;
    }
    return found;
  }
}
