// A finished task's outputs on disk: a folder per input file holding that run's output files, and
// the task's results.csv at the top. Each file is written under a temporary name and renamed when
// complete, so a file under its own name is whole; names from the server are used only as single
// path segments inside the chosen directory.
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import {
  distinctFileNames,
  folderKey,
  inputFolderKey,
  RESULTS_FILE,
  runFolder,
  safeSegment,
  withRunSuffix,
  withSuffix,
} from "../files/folder-names.ts";
import type { Run } from "../http/api-types.ts";
import { fetchBody, outputPath, resultsCsvPath, runOutputs } from "./api.ts";
import { type ApiClient, brokenBody, ConnectionError, idleSignal } from "./http.ts";
import { mapLimit } from "./pool.ts";

// The naming rules are the zip's own (files/folder-names.ts), so a run's folder here is its folder there.
export { RESULTS_FILE, safeSegment };

export interface Downloaded {
  runId: string;
  fileName: string;
  /** The run's folder, relative to the output directory. */
  folder: string;
  files: string[];
  bytes: number;
}

/** How many of `keys` are each key. */
function tally(keys: string[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const k of keys) counts.set(k, (counts.get(k) ?? 0) + 1);
  return counts;
}

/**
 * The folders, by run, checked distinct once more on the file systems people download to (folderKey)
 * and apart from the results table: a folder that would still share one gets " (2)", " (3)"… The
 * rules that made them already keep them apart (files/folder-names.ts); this only guards the disk.
 */
function distinct(folders: { runId: string; folder: string }[]): Map<string, string> {
  const used = new Set<string>([RESULTS_FILE]);
  const names = new Map<string, string>();
  for (const { runId, folder } of folders) {
    let name = folder;
    for (let n = 2; used.has(folderKey(name)); n++) name = withSuffix(folder, ` (${n})`);
    used.add(folderKey(name));
    names.set(runId, name);
  }
  return names;
}

/**
 * A folder per run named after its input file, exactly as in the task's zip (runFolder): every run of
 * a name that would be one folder on some file system (once made a safe segment, case folded or
 * normalized) gets " (run <id>)" — all of them, not only the second, so a name never depends on the
 * order runs came in — and so do the name of the results table and a name that already ends so.
 */
export function folderNames(runs: Pick<Run, "runId" | "fileName">[]): Map<string, string> {
  const keys = runs.map((r) => inputFolderKey(r.fileName));
  const counts = tally(keys);
  return distinct(
    runs.map((r, i) => ({
      runId: r.runId,
      folder: runFolder(r.fileName, r.runId, (counts.get(keys[i] as string) ?? 0) > 1),
    })),
  );
}

/**
 * A folder from a local input's label ("sub/a.csv"): the input tree mirrored, every segment made
 * safe; a top folder named like the results table gets " (run <id>)".
 */
export function folderFromLabel(label: string, runId: string): string {
  const segments = label.split("/").map(safeSegment);
  if (folderKey(segments[0] ?? "") === RESULTS_FILE) {
    segments[0] =
      segments.length === 1
        ? withRunSuffix(segments[0] as string, runId)
        : withSuffix(segments[0] as string, " (folder)");
  }
  return segments.join("/");
}

/**
 * Folders for runs from their inputs' labels (folderFromLabel), made distinct: labels that differ
 * only in characters safeSegment replaces ("a:b.csv", "a_b.csv"), in case, or in Unicode
 * normalization would otherwise share a folder, and their downloads would overwrite each other; each
 * of them gets " (run <id>)".
 */
export function foldersFromLabels(runs: { runId: string; label: string }[]): Map<string, string> {
  const wanted = runs.map((r) => ({ runId: r.runId, folder: folderFromLabel(r.label, r.runId) }));
  const counts = tally(wanted.map((w) => folderKey(w.folder)));
  return distinct(
    wanted.map(({ runId, folder }) => ({
      runId,
      folder: (counts.get(folderKey(folder)) ?? 0) > 1 ? withRunSuffix(folder, runId) : folder,
    })),
  );
}

/** `rel` under `root`, refusing anything that would land outside it. */
function inside(root: string, rel: string): string {
  const full = path.resolve(root, rel);
  if (full !== root && !full.startsWith(root + path.sep))
    throw new Error(`refusing to write outside ${root}: ${rel}`);
  return full;
}

/** Temporary files being written, removed if the process exits before they are renamed. */
const partials = new Set<string>();
let exitHook = false;

/**
 * A second Ctrl-C (or an EPIPE's last resort) ends the process with process.exit: no catch or
 * finally runs, so the half-written files are removed here, synchronously, as it exits.
 */
function trackPartial(tmp: string): void {
  partials.add(tmp);
  if (exitHook) return;
  exitHook = true;
  process.on("exit", () => {
    for (const p of partials) fs.rmSync(p, { force: true });
  });
}

/** How long a download may wait for its next bytes (or its headers) before it is given up. */
export const DOWNLOAD_IDLE_MS = 60_000;

/**
 * GET `route` into `target`: written under a temporary name of its own and renamed only when whole
 * (and `expectedBytes` long, when known), so a file under its final name is always complete. The
 * request is given up when no bytes arrive for `idleMs`: a server that stalls mid-body would
 * otherwise hold the command forever.
 */
async function download(
  c: ApiClient,
  route: string,
  target: string,
  o: { signal: AbortSignal; idleMs: number; expectedBytes?: number; what: string },
): Promise<number> {
  const idle = idleSignal(
    o.signal,
    o.idleMs,
    () => new ConnectionError(`${o.what}: nothing received from ${c.shownUrl} for ${o.idleMs / 1000} s`),
  );
  // Unique per call, not per process: two downloads to one target (which distinct folders should
  // prevent, but a case-folding file system can still arrange) must never share a temporary file.
  const tmp = `${target}.partial-${process.pid}-${randomBytes(6).toString("hex")}`;
  let written = 0;
  try {
    idle.touch();
    const res = await fetchBody(c, route, idle.signal);
    trackPartial(tmp);
    const body = Readable.fromWeb(res.body as never);
    body.on("data", (chunk: Buffer) => {
      written += chunk.length;
      idle.touch();
    });
    await pipeline(body, fs.createWriteStream(tmp, { flags: "wx" }));
    if (o.expectedBytes !== undefined && written !== o.expectedBytes)
      throw new ConnectionError(`${o.what}: received ${written} of ${o.expectedBytes} bytes`);
    fs.renameSync(tmp, target);
    return written;
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    throw idle.stalled() ?? brokenBody(err, c.shownUrl, o.what);
  } finally {
    idle.done();
    partials.delete(tmp);
  }
}

export interface DownloadOptions {
  concurrency: number;
  signal: AbortSignal;
  onRun?: (d: Downloaded) => void;
  /** Give a download up after this long without bytes (default DOWNLOAD_IDLE_MS). */
  idleMs?: number;
}

/** Downloads the outputs of `runs` (the succeeded ones) into `outDir/<folder of run>/`, and results.csv. */
export async function downloadOutputs(
  c: ApiClient,
  taskId: string,
  runs: { run: Run; folder: string }[],
  outDir: string,
  o: DownloadOptions,
): Promise<{ runs: Downloaded[]; resultsCsv: string }> {
  const root = path.resolve(outDir);
  fs.mkdirSync(root, { recursive: true });
  const idleMs = o.idleMs ?? DOWNLOAD_IDLE_MS;
  const done = await mapLimit(runs, o.concurrency, async ({ run, folder }) => {
    const dir = inside(root, folder);
    fs.mkdirSync(dir, { recursive: true });
    const outputs = await runOutputs(c, taskId, run.runId, o.signal);
    const files: string[] = [];
    let total = 0;
    // One file per name once saved (distinctFileNames): as the zip names them.
    const names = distinctFileNames(outputs.map((output) => safeSegment(output.name)));
    for (const [i, output] of outputs.entries()) {
      const name = names[i] as string;
      const size = await download(c, outputPath(taskId, run.runId, output.name), inside(dir, name), {
        signal: o.signal,
        idleMs,
        expectedBytes: output.sizeBytes,
        what: `${output.name} of run ${run.runId}`,
      });
      files.push(name);
      total += size;
    }
    const d = { runId: run.runId, fileName: run.fileName, folder, files, bytes: total };
    o.onRun?.(d);
    return d;
  });
  const resultsCsv = inside(root, RESULTS_FILE);
  await download(c, resultsCsvPath(taskId), resultsCsv, { signal: o.signal, idleMs, what: RESULTS_FILE });
  return { runs: done, resultsCsv };
}
