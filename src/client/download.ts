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
  needsRunSuffix,
  RESULTS_FILE,
  runFolder,
  safeSegment,
  tally,
  withRunSuffix,
  withSuffix,
} from "../files/folder-names.ts";
import type { Run } from "../http/api-types.ts";
import { outputPath, resultsCsvPath, runOutputs } from "./api.ts";
import { PathConflict } from "./exit.ts";
import {
  type ApiClient,
  ApiRequestError,
  brokenBody,
  ConnectionError,
  errorOf,
  idleSignal,
  NotRetried,
  retriable,
  retryPause,
} from "./http.ts";
import { mapLimit, sleep } from "./pool.ts";

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
 * of them gets " (run <id>)", and so does a label that already ends like a folder made unique
 * ("x.csv (run 5)"), as in the zip (needsRunSuffix): until 2026-12-07 such a label kept its name and a
 * third run's folder became "x.csv (run 5) (2)" where the zip has "x.csv (run 5) (run 7)".
 */
export function foldersFromLabels(runs: { runId: string; label: string }[]): Map<string, string> {
  const wanted = runs.map((r) => ({
    runId: r.runId,
    folder: folderFromLabel(r.label, r.runId),
    // An input named like the results table has its run's id already (folderFromLabel).
    unique: !r.label.includes("/") && folderKey(safeSegment(r.label)) === RESULTS_FILE,
  }));
  const counts = tally(wanted.map((w) => folderKey(w.folder)));
  return distinct(
    wanted.map(({ runId, folder, unique }) => ({
      runId,
      folder:
        !unique && needsRunSuffix(folderKey(folder), (counts.get(folderKey(folder)) ?? 0) > 1)
          ? withRunSuffix(folder, runId)
          : folder,
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

/** What is at `p` itself (a link not followed); undefined when nothing is, also under a file (ENOTDIR). */
function lstatOf(p: string): fs.Stats | undefined {
  try {
    return fs.lstatSync(p, { throwIfNoEntry: false });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOTDIR") return undefined;
    throw err;
  }
}

/** What is at `p`, for a message: "a file", "a folder"… */
function kindOf(p: string): string {
  const st = fs.lstatSync(p, { throwIfNoEntry: false });
  if (!st) return "gone";
  if (st.isSymbolicLink()) return fs.statSync(p, { throwIfNoEntry: false }) ? "a link" : "a link to nothing";
  return st.isDirectory() ? "a folder" : st.isFile() ? "a file" : "not a folder";
}

const AGAIN = "move it, or download into another --out DIR";

/** The nearest of `p` and its parents that exists (a link to nothing exists). */
function nearestThere(p: string): string {
  while (!lstatOf(p) && path.dirname(p) !== p) p = path.dirname(p);
  return p;
}

/**
 * `mkdir -p`: each folder of `dir` that is not there made in turn, without Node's recursive mkdir —
 * which, where mkdir answers ENOENT under a folder that exists (procfs, some FUSE mounts), tries again
 * for ever, synchronously: `--out /proc/nope` spun a core and Ctrl-C could not stop it (Node 24; a
 * trial, 2026-12-07). Fails as that would have: ENOENT, ENOTDIR or EEXIST (a link to nothing, a file in
 * the way), EACCES…
 */
export function makeFolders(dir: string): void {
  const missing: string[] = [];
  let p = path.resolve(dir);
  // Down from the nearest that is there (a link to nothing is not: its mkdir says EEXIST).
  while (!fs.statSync(p, { throwIfNoEntry: false }) && path.dirname(p) !== p) {
    missing.push(p);
    p = path.dirname(p);
  }
  if (missing.length === 0 && !fs.statSync(p, { throwIfNoEntry: false })?.isDirectory())
    throw Object.assign(new Error(`EEXIST: file already exists, mkdir '${p}'`), { code: "EEXIST" });
  for (const folder of missing.reverse()) {
    try {
      fs.mkdirSync(folder);
    } catch (err) {
      // Made meanwhile (another download into the same folder): fine, as with recursive.
      if (
        (err as NodeJS.ErrnoException).code === "EEXIST" &&
        fs.statSync(folder, { throwIfNoEntry: false })?.isDirectory()
      )
        continue;
      throw err;
    }
  }
}

/**
 * `dir` and its parents made, for `what`. Something other than a folder in the way (a file of the
 * same name, from the inputs themselves say, or a link to nothing) is a PathConflict naming it; the
 * system's EEXIST, ENOTDIR or ENOENT would name neither what nor why.
 */
function makeFolder(dir: string, what: string): void {
  try {
    makeFolders(dir);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    // ENOENT: a link to nothing in the way.
    if (code !== "EEXIST" && code !== "ENOTDIR" && code !== "ENOENT") throw err;
    // The nearest that exists is what stopped it, unless it is a folder (the error is another).
    const p = nearestThere(dir);
    if (fs.statSync(p, { throwIfNoEntry: false })?.isDirectory()) throw err;
    throw new PathConflict(
      `cannot make the folder for ${what}: ${p} is ${kindOf(p)}, not a folder; ${AGAIN}`,
    );
  }
}

/**
 * What can be known of a download into `root` before its task exists (`submit --out`, whose run
 * folders follow from the inputs' labels): `root` can be made, each folder of `folders` (relative,
 * "/"-separated) is a folder or not there yet at every step, and results.csv is not a folder. Makes
 * and changes nothing; what is in the way is the PathConflict the download itself would meet.
 */
export function checkDownloadPaths(root: string, folders: { folder: string; what: string }[]): void {
  // The nearest of root and its parents that exists (a link to nothing exists) must be a folder.
  const p = nearestThere(root);
  if (!fs.statSync(p, { throwIfNoEntry: false })?.isDirectory())
    throw new PathConflict(
      `cannot make the folder for the download: ${p} is ${kindOf(p)}, not a folder; ${AGAIN}`,
    );
  if (p !== root) return;
  for (const { folder, what } of folders) {
    let dir = root;
    for (const segment of folder.split("/")) {
      dir = path.join(dir, segment);
      if (!lstatOf(dir)) break;
      if (!fs.statSync(dir, { throwIfNoEntry: false })?.isDirectory())
        throw new PathConflict(
          `cannot make the folder for ${what}: ${dir} is ${kindOf(dir)}, not a folder; ${AGAIN}`,
        );
    }
  }
  const csv = path.join(root, RESULTS_FILE);
  if (fs.lstatSync(csv, { throwIfNoEntry: false })?.isDirectory())
    throw new PathConflict(`cannot write ${RESULTS_FILE}: ${csv} is ${kindOf(csv)}, not a file; ${AGAIN}`);
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

/** A temporary file of `download`: the target's name, the writing process's id, 6 random bytes. */
const PARTIAL_NAME = /^(.+)\.partial-([0-9]+)-[0-9a-f]{12}$/;

/**
 * Removes the temporary files of `target` that a download killed outright (kill -9, a power loss)
 * left beside it: those of a process that is gone. Each download that writes the file again would
 * otherwise leave them there for good, and a folder archived or counted afterwards had them (an
 * automation trial: 20 after four killed runs and a good one). Best effort.
 */
function removeStalePartials(target: string): void {
  const dir = path.dirname(target);
  const base = path.basename(target);
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return;
  }
  for (const name of names) {
    const m = PARTIAL_NAME.exec(name);
    if (!m || m[1] !== base) continue;
    const pid = Number(m[2]);
    if (pid === process.pid || processAlive(pid)) continue;
    try {
      fs.rmSync(path.join(dir, name), { force: true });
    } catch {
      // Another process's to remove, or gone already.
    }
  }
}

/** Whether a process of that id runs (one of another user's counts: EPERM). */
function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** How long a download may wait for its next bytes (or its headers) before it is given up. */
export const DOWNLOAD_IDLE_MS = 60_000;

/** How many times in all one file's download is tried before the command gives up. */
export const DOWNLOAD_ATTEMPTS = 5;

// What another attempt may mend is the GETs' rule (`retriable`): the connection failed or broke off,
// or a 502, 503 or 504 — not a 500, a redirect, an answer that is not the API's, a stall or a body
// longer than the file (NotRetried).

/** What one file's attempts know: the bytes in the temporary file, and the first answer's size and ETag. */
interface Progress {
  /** The temporary file exists (created by this call). */
  created: boolean;
  have: number;
  /** The whole body's length, from the answer that began the bytes held. */
  size?: number | undefined;
  /** Its strong ETag, when the server can send a range of it (Accept-Ranges: bytes). */
  etag?: string | undefined;
}

const contentLength = (res: Response) => {
  const v = res.headers.get("content-length");
  return v !== null && /^[0-9]+$/.test(v) ? Number(v) : undefined;
};

/** The strong ETag of an answer that can be resumed; undefined when it cannot. */
function resumeTag(res: Response): string | undefined {
  const tag = res.headers.get("etag");
  const ranges = res.headers.get("accept-ranges") ?? "";
  return tag?.startsWith('"') && /\bbytes\b/i.test(ranges) ? tag : undefined;
}

/** Where the held bytes stop: one whose first answer gave no size or no ETag starts over. */
const resumeAt = (p: Progress) =>
  p.etag !== undefined && p.size !== undefined && p.have > 0 && p.have < p.size ? p.have : 0;

/**
 * GET `route` into `target`: written under a temporary name of its own and renamed only when whole
 * (and `expectedBytes` long, when known), so a file under its final name is always complete. A body
 * whose connection breaks off, a connection that fails and a 5xx are tried again, DOWNLOAD_ATTEMPTS
 * times in all with growing pauses: a file the server can resume (a strong ETag, Accept-Ranges) from
 * the byte held (`Range`, `If-Range`), anything else (results.csv) from its start. An attempt is
 * given up when no bytes arrive for `idleMs` — a server that stalls mid-body would otherwise hold the
 * command forever — and that is not tried again.
 */
async function download(
  c: ApiClient,
  route: string,
  target: string,
  o: {
    signal: AbortSignal;
    idleMs: number;
    expectedBytes?: number;
    what: string;
    onRetry?: ((note: string) => void) | undefined;
  },
): Promise<number> {
  // Unique per call, not per process: two downloads to one target (which distinct folders should
  // prevent, but a case-folding file system can still arrange) must never share a temporary file.
  const tmp = `${target}.partial-${process.pid}-${randomBytes(6).toString("hex")}`;
  trackPartial(tmp);
  const progress: Progress = { created: false, have: 0 };
  try {
    for (let attempt = 1; ; attempt++) {
      try {
        await attemptDownload(c, route, tmp, progress, o);
      } catch (err) {
        if (o.signal.aborted || !retriable(err)) throw err;
        const message = (err as Error).message;
        // Which file, also when the connection failed before any body ("cannot reach …").
        const why = message.startsWith(`${o.what}: `) ? message : `${o.what}: ${message}`;
        if (attempt >= DOWNLOAD_ATTEMPTS) {
          const more = `; gave up after ${attempt} attempts`;
          if (err instanceof ApiRequestError)
            throw new ApiRequestError(err.status, err.code, `${why}${more}`);
          throw new ConnectionError(`${why}${more}`);
        }
        // What reached the disk (the write stream is closed by now), not what was received.
        progress.have = progress.created ? fs.statSync(tmp).size : 0;
        const from = resumeAt(progress);
        o.onRetry?.(
          `${err instanceof ApiRequestError ? `${why} (${err.code})` : why}; ` +
            (from > 0 ? `resuming from byte ${from}` : "downloading it again") +
            ` (attempt ${attempt + 1} of ${DOWNLOAD_ATTEMPTS})`,
        );
        await sleep(retryPause(attempt), o.signal);
        if (o.signal.aborted) throw o.signal.reason;
        continue;
      }
      if (progress.size !== undefined && progress.have !== progress.size)
        throw new ConnectionError(`${o.what}: received ${progress.have} of ${progress.size} bytes`);
      if (o.expectedBytes !== undefined && progress.have !== o.expectedBytes)
        throw new ConnectionError(`${o.what}: received ${progress.have} of ${o.expectedBytes} bytes`);
      try {
        fs.renameSync(tmp, target);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code !== "EISDIR" && code !== "ENOTEMPTY" && code !== "EEXIST" && code !== "ENOTDIR") throw err;
        throw new PathConflict(
          `cannot write ${o.what}: ${target} is ${kindOf(target)}, not a file; ${AGAIN}`,
        );
      }
      removeStalePartials(target);
      return progress.have;
    }
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    throw err;
  } finally {
    partials.delete(tmp);
  }
}

/**
 * One request of `download`, its body written to `tmp`: appended to the bytes held when the server
 * sends the range asked for (206 from exactly that byte, of the same size), else the whole body from
 * its start. Updates `p`.
 */
async function attemptDownload(
  c: ApiClient,
  route: string,
  tmp: string,
  p: Progress,
  o: { signal: AbortSignal; idleMs: number; what: string; expectedBytes?: number },
): Promise<void> {
  const idle = idleSignal(
    o.signal,
    o.idleMs,
    () => new NotRetried(`${o.what}: nothing received from ${c.shownUrl} for ${o.idleMs / 1000} s`),
  );
  const from = resumeAt(p);
  try {
    idle.touch();
    // No content coding: a range counts the bytes of the file itself.
    const headers: Record<string, string> = { "accept-encoding": "identity" };
    if (from > 0) {
      headers.range = `bytes=${from}-`;
      headers["if-range"] = p.etag as string;
    }
    const res = await c.send("GET", route, { timeoutMs: 0, signal: idle.signal, headers });
    if (!res.ok) {
      const err = await errorOf(res, c.shownUrl);
      if (from > 0 && err instanceof ApiRequestError && err.status === 416)
        return restart(p, `${o.what}: the server cannot resume at byte ${from}`);
      throw err;
    }
    let append = false;
    if (res.status === 206) {
      const range = res.headers.get("content-range") ?? "";
      const m = /^bytes ([0-9]+)-([0-9]+)\/([0-9]+)$/.exec(range);
      const size = p.size as number;
      if (from === 0 || !m || Number(m[1]) !== from || Number(m[2]) !== size - 1 || Number(m[3]) !== size) {
        await res.body?.cancel().catch(() => {});
        const asked = from === 0 ? "the whole file" : `bytes ${from}- of ${size}`;
        return restart(p, `${o.what}: asked for ${asked}, the server sent the range "${range}"`);
      }
      append = true;
    } else {
      // The whole body (a 200 to a resume: the file is not the one held), from its first byte.
      p.have = 0;
      p.size = contentLength(res);
      p.etag = resumeTag(res);
    }
    const body = res.body ? Readable.fromWeb(res.body as never) : Readable.from([]);
    // A body past the size listed (or announced) is stopped there: one that never ends would
    // otherwise fill the disk, and keep the command going, for ever.
    const most = Math.min(p.size ?? Number.POSITIVE_INFINITY, o.expectedBytes ?? Number.POSITIVE_INFINITY);
    let held = append ? from : 0;
    body.on("data", (chunk: Buffer) => {
      idle.touch();
      held += chunk.length;
      if (held > most) body.destroy(new NotRetried(`${o.what}: received more than its ${most} bytes`));
    });
    const file = fs.createWriteStream(tmp, { flags: append ? "a" : p.created ? "w" : "wx" });
    p.created = true;
    try {
      await pipeline(body, file);
    } finally {
      if (!file.closed) await new Promise<void>((resolve) => file.once("close", () => resolve()));
    }
    p.have = fs.statSync(tmp).size;
  } catch (err) {
    throw idle.stalled() ?? brokenBody(err, c.shownUrl, o.what);
  } finally {
    idle.done();
  }
}

/** A 206 that is not the range asked for, or a 416 to it: the next attempt starts over. */
function restart(p: Progress, message: string): never {
  p.have = 0;
  p.etag = undefined;
  throw new ConnectionError(message);
}

export interface DownloadOptions {
  concurrency: number;
  signal: AbortSignal;
  onRun?: (d: Downloaded) => void;
  /** Give a download up after this long without bytes (default DOWNLOAD_IDLE_MS). */
  idleMs?: number;
  /** Told, in a sentence, when a download is tried again. */
  onRetry?: (note: string) => void;
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
  makeFolder(root, "the download");
  const idleMs = o.idleMs ?? DOWNLOAD_IDLE_MS;
  const done = await mapLimit(runs, o.concurrency, async ({ run, folder }) => {
    const dir = inside(root, folder);
    makeFolder(dir, `run ${run.runId} (${run.fileName})`);
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
        onRetry: o.onRetry,
      });
      files.push(name);
      total += size;
    }
    const d = { runId: run.runId, fileName: run.fileName, folder, files, bytes: total };
    o.onRun?.(d);
    return d;
  });
  const resultsCsv = inside(root, RESULTS_FILE);
  await download(c, resultsCsvPath(taskId), resultsCsv, {
    signal: o.signal,
    idleMs,
    what: RESULTS_FILE,
    onRetry: o.onRetry,
  });
  return { runs: done, resultsCsv };
}
