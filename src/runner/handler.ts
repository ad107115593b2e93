// The queue handler that runs an analysis program for a claimed run: input path from the run's
// snapshot (under the storage root), a per-attempt output folder, the process, and the mapping of
// how it ended to an outcome (DESIGN §5). A successful attempt keeps its folder and names it in its
// outcome; whether it becomes the run's output is decided by the completion's lease fence.
import { createHash } from "node:crypto";
import fs from "node:fs";
import fsp from "node:fs/promises";
import path from "node:path";
import { pipeline } from "node:stream/promises";
import type { Program } from "../analyses/programs.ts";
import type { ClaimedRun, Handler, HandlerOutcome } from "../queue/worker.ts";
import { publishFolder } from "../storage/local.ts";
import {
  isStoreKey,
  ObjectMissingError,
  type ObjectStore,
  outputObjectKey,
  storeFault,
} from "../storage/store.ts";
import type { GroupRegistry } from "./group-guard.ts";
import { attemptOutputKey, checkOutputs, type OutputFile } from "./outputs.ts";
import { type ChildMemory, type ProcessResult, runProcess } from "./run-process.ts";
import { removeAttemptDir } from "./workdir.ts";

export interface ProcessHandlerDeps {
  /** Where inputs are read from and outputs go. */
  store: ObjectStore;
  /**
   * This worker's scratch folder (`$ASSAY_DATA_DIR/work/<pid>.<random>`, see workdir.ts). Each attempt
   * writes its outputs into a folder of its own here — and, with a remote store, fetches its input into
   * it — and only outputs that are kept reach the store: uploaded, or on a local store (the same
   * filesystem) moved there with one rename. The folder is removed after every attempt, whatever the
   * outcome; a killed worker's is removed by the next worker that starts on the machine.
   */
  workDir: string;
  killGraceMs: number;
  /** Kills this worker's process groups if it dies (see group-guard.ts). */
  guard?: GroupRegistry;
  /** CPU priority of the analysis processes (ASSAY_CHILD_NICE). */
  nice?: number;
  /** What each analysis process may allocate, and the prlimit that sets it (ASSAY_CHILD_MEMORY_MB). */
  memory?: ChildMemory;
}

/** Where one attempt reads its input and writes its outputs, and how its outputs reach the store. */
interface AttemptPlace {
  inputPath: string;
  outputDir: string;
  /**
   * The program's HOME and TMPDIR: a folder of this attempt's own, beside its outputs, so that nothing
   * one user's run leaves there (caches, settings, history) is seen by the next, and it goes with the
   * attempt's folder — removed after the attempt, or with a killed worker's folder by the work-folder
   * sweep. R's session folder (`RtmpXXXX`), Python's `tempfile` and Node's `os.tmpdir()` go there too:
   * a program killed on timeout or cancel cannot clean up after itself, and its leftovers go with the
   * attempt's folder. One folder for both: each folder made and removed is a journalled metadata write
   * (~0.1–0.26 ms of CPU on ext4 here), paid by every run.
   */
  home: string;
  /** Makes the checked outputs the store's, under the attempt's key (a remote store: uploads them). */
  keep(files: readonly OutputFile[]): Promise<void>;
  /**
   * Removes the attempt's scratch folder: its home, and its outputs unless keep made them the store's.
   */
  close(): Promise<void>;
}

/** The attempt's scratch folder in the worker's: named as its output key's last segment. */
const attemptDir = (workDir: string, run: ClaimedRun) =>
  path.join(workDir, `${run.id}.${run.attempt}.${run.leaseToken}`);

/**
 * Makes the attempt's folder `dir` with its `out/` and `home/`. Synchronous: a local metadata call is
 * cheaper than a thread-pool round trip, and it sits on the path from a slot's release to its next
 * spawn. Not `recursive`, which tries `out/` first and fails (one call more per run); the worker's
 * folder is made again when it is gone (removed by hand, or by a cleaner of old files), as `recursive`
 * did, or every attempt would fail — but not the data directory above it: a mount gone is said, not
 * written under. A folder this made goes again if a later mkdir fails (a full disk may make the folder
 * and refuse its `out/`); one that was there already (EEXIST) is not this attempt's to remove.
 */
function makeAttemptFolders(workDir: string, dir: string): void {
  try {
    fs.mkdirSync(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    fs.mkdirSync(workDir, { mode: 0o700 });
    fs.mkdirSync(dir);
  }
  try {
    fs.mkdirSync(path.join(dir, "out"));
    fs.mkdirSync(path.join(dir, "home"));
  } catch (err) {
    // The mkdir's error decides the run's fate (a full disk is retried): a folder that cannot be
    // removed now (EMFILE) must not replace it, and is tried again later.
    try {
      fs.rmSync(dir, { recursive: true, force: true });
    } catch {
      removeAttemptDir(dir).catch(() => {});
    }
    throw err;
  }
}

/**
 * The attempt's place on a local store: programs read the stored input in place, and write into the
 * `out` folder of the attempt's scratch folder, which becomes the stored output folder with one rename
 * when it is kept (the scratch folder is under the data directory: one filesystem).
 */
function localPlace(
  store: ObjectStore & { localPath(key: string): string; root: string },
  workDir: string,
  run: ClaimedRun,
  outputKey: string,
): AttemptPlace {
  const inputPath = store.localPath(run.inputStorageKey);
  const dir = attemptDir(workDir, run);
  const outputDir = path.join(dir, "out");
  const home = path.join(dir, "home");
  makeAttemptFolders(workDir, dir);
  return {
    inputPath,
    outputDir,
    home,
    // Into the task's folder, made when missing with the outputs in it (a delete that empties a folder
    // prunes it: see renameInto); on disk before the completion commits.
    keep: async (files) =>
      publishFolder(
        store.root,
        outputDir,
        store.localPath(`outputs/${outputKey}`),
        files.map((f) => f.name),
      ),
    close: () => closeAttemptDir(dir),
  };
}

/**
 * Removes an attempt's folder: when it holds only its empty `home` (the outputs published, the
 * program left nothing), with two synchronous `rmdir`s — the common case, and a recursive removal
 * costs a dozen thread-pool round trips; otherwise (or when one fails) with removeAttemptDir.
 */
async function closeAttemptDir(dir: string): Promise<void> {
  try {
    fs.rmdirSync(path.join(dir, "home"));
    fs.rmdirSync(dir);
    return;
  } catch {
    // Not empty (the outputs unpublished, something left in home), or already gone.
  }
  await removeAttemptDir(dir);
}

/** The attempt's place with a remote store: a scratch folder with the fetched input and the outputs. */
async function remotePlace(
  store: ObjectStore,
  workDir: string,
  run: ClaimedRun,
  outputKey: string,
  signal: AbortSignal,
): Promise<AttemptPlace> {
  const dir = attemptDir(workDir, run);
  const inputPath = path.join(dir, "input");
  const outputDir = path.join(dir, "out");
  const home = path.join(dir, "home");
  makeAttemptFolders(workDir, dir);
  const place: AttemptPlace = {
    inputPath,
    outputDir,
    home,
    keep: async (files) => {
      try {
        for (const f of files)
          await store.putFile(outputObjectKey(outputKey, f.name), path.join(outputDir, f.name));
      } catch (err) {
        await store.deletePrefix(`outputs/${outputKey}/`).catch(() => {});
        throw err;
      }
    },
    close: () => removeAttemptDir(dir),
  };
  try {
    // The run's signal ends the download too: a cancel or timeout must not wait for a large input.
    // A failed download asks whether the store can be used at all (storeFault): if not, the run waits
    // for it, its attempt refunded. A missing object is the run's (permanent), and the scratch
    // folder's own failures above are the worker's disk's, not the store's.
    await store.download(run.inputStorageKey, inputPath, signal).catch(async (err: unknown) => {
      throw err instanceof ObjectMissingError ? err : await storeFault(store, err, signal);
    });
    await checkFetched(inputPath, run, signal);
  } catch (err) {
    // The download's error decides what happens to the run (a missing input is permanent): a folder
    // that cannot be removed must not replace it (the worker's close and the sweep take it later).
    await place.close().catch(() => {});
    throw err;
  }
  return place;
}

/** A fetched input that is not the file uploaded (ANALYSIS_INPUT_INVALID: another fetch reads the same). */
class InputMismatchError extends Error {}

/**
 * Checks a fetched input against the run's snapshot of its upload (size, then sha256): the object
 * at its key may not be the file uploaded — one of another installation under the same prefix, which
 * `assay storage migrate` skips when its size is the same, or one rewritten by hand — and a program
 * must not analyse other bytes than the user sent under the upload's name. The file was just written,
 * so it is read back from the page cache; a local store's input is the upload itself and is not read.
 */
async function checkFetched(file: string, run: ClaimedRun, signal: AbortSignal): Promise<void> {
  const { size } = await fsp.stat(file);
  if (size !== run.inputSizeBytes)
    throw new InputMismatchError(`the input fetched is ${size} bytes, the upload ${run.inputSizeBytes}`);
  if (!/^[0-9a-f]{64}$/.test(run.inputSha256)) return;
  const hash = createHash("sha256");
  await pipeline(fs.createReadStream(file), hash, { signal });
  if (hash.digest("hex") !== run.inputSha256)
    throw new InputMismatchError("the input fetched has another sha256 than the upload");
}

/**
 * The child's whole environment: an allowlist, never the service's own (no DATABASE_URL, no tokens).
 * `tmp` (an attempt's HOME, see AttemptPlace) becomes TMPDIR; without it programs use the system's tmp.
 *
 * The locale and the time zone are fixed, never the worker's: a run's outputs, metrics and messages
 * must not depend on which host claimed it. With the worker's LANG, r-report on a Turkish host took
 * "Infinity" for text (an "I" is not an "i" there) and so a column for not numeric, and said "could
 * not write report.html" in German on a German one (which the disk-full check below did not read);
 * on a host whose LANG is C, or a locale not installed, R wrote a name "é" as "<U+00E9>". C.UTF-8 is
 * UTF-8 without any language's rules (collation by code point, "." as the decimal mark, English
 * messages). UTC because the worker's zone is not the user's either (they may be anywhere, and the
 * next attempt may run on another host): a date a program writes is in UTC, and saying it in the
 * user's zone is for the client that shows it (the dashboard does so), or for a parameter.
 * No LC_* or LANGUAGE variable is passed, so LANG decides every category.
 */
export function childEnv(home: string, tmp?: string): Record<string, string> {
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin",
    LANG: "C.UTF-8",
    TZ: "UTC",
    HOME: home,
  };
  if (tmp !== undefined) env.TMPDIR = tmp;
  return env;
}

const STDERR_STORED_CHARS = 2048;

/**
 * What R (`cannot allocate vector of size …`, `memory exhausted (limit reached?)`, `Couldn't allocate
 * xsub in do_radixsort`), Python (`MemoryError`),
 * Node (`Fatal process out of memory`, `JavaScript heap out of memory`, `Array buffer allocation
 * failed`, `RangeError: Failed to allocate memory`), C++ (`std::bad_alloc`) and C libraries (`Cannot
 * allocate memory`) print when an allocation fails.
 */
const OUT_OF_MEMORY =
  /cannot allocate (vector|memory)|Couldn't allocate|memory exhausted|MemoryError|out of memory|(Array buffer|Failed to) allocat(ion failed|e memory)|std::bad_alloc/i;

/** Start errors that are the worker's lack of resources at that moment, not the program's: retried. */
const SPAWN_SHORTAGES: ReadonlySet<string> = new Set(["EMFILE", "ENFILE", "EAGAIN", "ENOMEM"]);

/** How a finished process maps to an outcome, given the output check on success. */
export function outcomeOf(r: ProcessResult, outputCheck?: { ok: boolean; message?: string }): HandlerOutcome {
  const stderr = r.stderrTail.slice(-STDERR_STORED_CHARS);
  const fail = (
    errorCode: string,
    errorMessage: string,
    transient = false,
  ): Extract<HandlerOutcome, { status: "failed" }> => ({
    status: "failed",
    errorCode,
    errorMessage,
    transient,
    ...(stderr ? { result: { stderrTail: stderr } } : {}),
  });
  // A failure the program reports (exit 2–5) carries its own words after the code's, when it gave any.
  const said = (message: string) => (r.reportedError ? `${message}: ${r.reportedError}` : message);
  if (r.startError)
    return fail(
      "ANALYSIS_PROCESS_START_FAILED",
      `the program could not be started (${r.startError.code ?? "error"})`,
      // The worker's resources ran short (its open files, the machine's processes or memory): another
      // attempt may find them; a missing or forbidden program would not.
      SPAWN_SHORTAGES.has(r.startError.code ?? ""),
    );
  if (r.isCanceled) return r.abortReason === "timeout" ? { status: "timed_out" } : { status: "cancelled" };
  if (r.timedOut) return { status: "timed_out" };
  if (r.protocolError)
    return fail(
      "ANALYSIS_OUTPUT_INVALID",
      `the program broke the output protocol: ${r.protocolError.message}`,
    );
  // Past its memory limit (ASSAY_CHILD_MEMORY_MB): each runtime says so its own way, and exits 1, 5
  // (a program that caught it) or by a signal (V8's fatal error aborts). Not retried: the same input
  // needs the same memory.
  // Only a death by a signal, or an exit with no meaning of its own (1, or 5: the program's "failed
  // internally", what a caught MemoryError becomes): an exit 2, 3 or 4 is the program's own verdict,
  // and stderr may echo the data (a column named "out of memory").
  if (
    r.memoryLimitBytes !== undefined &&
    (r.signal || r.exitCode === 1 || r.exitCode === 5) &&
    OUT_OF_MEMORY.test(r.stderrTail)
  )
    return fail(
      "ANALYSIS_PROCESS_FAILED",
      `the program ran out of memory: it may use ${Math.round(r.memoryLimitBytes / 2 ** 20)} MiB (ASSAY_CHILD_MEMORY_MB)`,
    );
  if (r.signal)
    return { ...fail("ANALYSIS_PROCESS_FAILED", `the program was killed by ${r.signal}`), signal: r.signal };
  // A process it started outlived it, holding its output: the program is not done when it exits, and
  // what that process may still write into the outputs was never checked. Not kept, whatever the exit.
  if (r.outputHeld)
    return fail("ANALYSIS_PROCESS_FAILED", "a process the program started outlived it, holding its output");
  switch (r.exitCode) {
    case 0:
      if (!r.result) return fail("ANALYSIS_OUTPUT_MISSING", "the program exited 0 without a result event");
      if (!outputCheck?.ok)
        return fail("ANALYSIS_OUTPUT_INVALID", outputCheck?.message ?? "the output is invalid");
      return {
        status: "succeeded",
        result: { outputFileName: r.result.outputFileName, metrics: r.result.metrics },
      };
    case 2:
      return fail("ANALYSIS_INPUT_INVALID", said("the analysis rejected its parameters"));
    case 3:
      return fail("ANALYSIS_DATA_INVALID", said("the input data cannot be analysed"));
    case 4:
      return fail("ANALYSIS_DEPENDENCY_FAILED", said("an external dependency of the analysis failed"), true);
    case 5:
      return fail("ANALYSIS_PROCESS_FAILED", said("the analysis failed internally"));
    default:
      return fail("ANALYSIS_PROCESS_FAILED", `the program exited with code ${r.exitCode}`);
  }
}

/**
 * The disk under `dir` has no room left: no block this process may write (a user that is not root
 * may not write the blocks kept for root, as df's 100% has it; root may), or no inode. A program that
 * tried to write there then was refused, whatever it made of that (a program of someone else's may
 * crash, or exit 0 with its output cut short). A filesystem that counts no blocks (ramfs, a tmpfs
 * without a size, some FUSE and network ones) says nothing: it reads as having room.
 */
function noRoomLeft(dir: string): boolean {
  try {
    return noRoomIn(fs.statfsSync(dir), process.geteuid?.() === 0);
  } catch {
    return false;
  }
}

/** What noRoomLeft() reads from a filesystem's statfs, for a process that is root or not. */
export function noRoomIn(
  s: Pick<fs.StatsFs, "blocks" | "bfree" | "bavail" | "files" | "ffree">,
  root: boolean,
): boolean {
  if (s.blocks === 0) return false;
  return (root ? s.bfree : s.bavail) === 0 || (s.files > 0 && s.ffree === 0);
}

/**
 * The program said an output could not be written for want of room (the three programs' exit 4,
 * `could not write <output>: <the system's reason>`): a quota, which statfs does not show, or a disk
 * full for a moment only, included.
 */
const saidNoRoom = (r: ProcessResult) =>
  r.exitCode === 4 && /no space left on device|disk quota exceeded/i.test(r.reportedError ?? "");

/** The scratch disk was full when the program ended (see noRoomLeft): its outcome says nothing. */
class ScratchFullError extends Error {
  readonly code = "ENOSPC";
}

/**
 * Whether a program's ending may be the disk's doing: an exit of its own that is not a verdict on its
 * input (2 or 3), including a success and exit 4 (the three programs' "could not write <output>") — not
 * a start failure, a signal, a cancel or a timeout.
 */
const mayBeDisk = (r: ProcessResult) =>
  !r.startError &&
  !r.isCanceled &&
  !r.timedOut &&
  !r.signal &&
  r.exitCode !== null &&
  r.exitCode !== 2 &&
  r.exitCode !== 3;

function inputReadable(file: string): boolean {
  try {
    const stat = fs.statSync(file);
    fs.accessSync(file, fs.constants.R_OK);
    // access() always succeeds for root: also require some read bit, as the owner meant it.
    return stat.isFile() && (stat.mode & 0o444) !== 0;
  } catch {
    return false;
  }
}

export function processHandler(program: Program, deps: ProcessHandlerDeps): Handler {
  const { store } = deps;
  return async (run, { signal, reportProgress, releaseSlot, finishing }) => {
    if (!fs.existsSync(program.script)) {
      return {
        status: "failed",
        errorCode: "ANALYSIS_PROCESS_START_FAILED",
        errorMessage: "the analysis script is missing",
      };
    }
    const outputKey = attemptOutputKey(run.taskId, run.id, run.attempt, run.leaseToken);
    let place: AttemptPlace;
    try {
      place = store.localPath
        ? localPlace(
            store as ObjectStore & { localPath(key: string): string; root: string },
            deps.workDir,
            run,
            outputKey,
          )
        : await remotePlace(store, deps.workDir, run, outputKey, signal);
    } catch (err) {
      if (err instanceof InputMismatchError) {
        return {
          status: "failed",
          errorCode: "ANALYSIS_INPUT_INVALID",
          errorMessage: "the input file in storage is not the file uploaded (its size or sha256 differs)",
        };
      }
      if (err instanceof ObjectMissingError || /storage key/.test(String(err))) {
        return {
          status: "failed",
          errorCode: "ANALYSIS_INPUT_INVALID",
          errorMessage: "the input file is not in storage",
        };
      }
      // The store cannot be used (StoreUnavailableError: the run waits for it), or the scratch disk
      // failed: retried with backoff like any thrown error.
      throw err;
    }
    try {
      if (!inputReadable(place.inputPath)) {
        return {
          status: "failed",
          errorCode: "ANALYSIS_INPUT_INVALID",
          // A local store's input is read in place: gone (its file deleted), it is said as a remote
          // store's is, whose fetch finds no object.
          errorMessage: fs.existsSync(place.inputPath)
            ? "the input file cannot be read"
            : "the input file is not in storage",
        };
      }
      const result = await runProcess(
        {
          executable: program.executable,
          args: [
            program.script,
            "--input",
            place.inputPath,
            "--output-dir",
            place.outputDir,
            "--params",
            JSON.stringify(run.parameters),
          ],
          cwd: program.cwd,
          env: childEnv(place.home, place.home),
        },
        signal,
        {
          killGraceMs: deps.killGraceMs,
          // The attempt's HOME is its own: what a process that left the group still has (see RunLimits).
          marker: `HOME=${place.home}`,
          ...(deps.guard ? { guard: deps.guard } : {}),
          ...(deps.nice === undefined ? {} : { nice: deps.nice }),
          ...(deps.memory ? { memory: deps.memory } : {}),
        },
        (p) => reportProgress(p.percent, p.message),
        finishing,
      );
      // Thrown, so the worker logs it and retries the run as ANALYSIS_STORAGE_FULL (decide()) — before
      // the slot is released, or a run claimed ahead would start on the full disk before the worker
      // holds its claims (a statfs: microseconds).
      if (mayBeDisk(result) && (saidNoRoom(result) || noRoomLeft(place.outputDir)))
        throw new ScratchFullError(
          `no room left on the worker's scratch disk (${deps.workDir}) when the program ended (exit ${result.exitCode}): its outputs may be cut short`,
        );
      // The process (and its group) is gone: the next run may start while outputs are checked.
      releaseSlot();
      const check =
        result.exitCode === 0 &&
        result.result &&
        !result.protocolError &&
        !result.isCanceled &&
        !result.timedOut
          ? checkOutputs(place.outputDir, result.result.outputFileName)
          : undefined;
      const outcome = outcomeOf(result, check);
      // A local store's input is read in place: deleted while the program ran (through the API), the
      // program says it cannot read it, or whatever it says on exit 2. Said as the check above says it,
      // with the program's words after them (its stderr is kept). A remote store's input is the
      // attempt's own copy: not this.
      if (
        store.localPath &&
        outcome.status === "failed" &&
        outcome.errorCode === "ANALYSIS_INPUT_INVALID" &&
        !fs.existsSync(place.inputPath)
      ) {
        // The program's own words only: exit 2's "the analysis rejected its parameters" blamed the
        // parameters for an input deleted under it (until 2026-12-07).
        const words = (outcome.errorMessage ?? "").replace(/^the analysis rejected its parameters(: )?/, "");
        return {
          ...outcome,
          errorMessage: `the input file is not in storage${words ? ` (the program said: ${words})` : ""}`,
        };
      }
      if (outcome.status !== "succeeded" || !check?.ok) return outcome;
      // Kept under the attempt's own key: the completion records it only if it wins the fence; if it
      // loses, the worker discards it (onDiscard).
      try {
        await place.keep(check.files);
      } catch (err) {
        throw await storeFault(store, err, signal);
      }
      return { ...outcome, result: { ...outcome.result, files: check.files }, outputKey };
    } finally {
      // Must not replace the outcome (the outputs may be the store's already): a folder that cannot be
      // removed is left to the worker's own close and the next sweep of leftovers.
      await place.close().catch(() => {});
    }
  };
}

/** For Worker.onDiscard: an attempt whose outcome was fenced off or abandoned leaves nothing behind. */
export function discardAttempt(store: ObjectStore) {
  return async (run: ClaimedRun) => {
    await store.deletePrefix(`outputs/${attemptOutputKey(run.taskId, run.id, run.attempt, run.leaseToken)}/`);
  };
}

/**
 * For Worker.onRecorded: once a run's outcome is recorded, no other attempt of it can win, so the
 * outputs that earlier attempts left go. Only an attempt that lost its lease (a worker killed mid-run,
 * put back by the reaper) can have left any — every other ending removes its own — so only runs claimed
 * after such an attempt look (a listing of the task's outputs under the run's prefix).
 */
export function removeLeftovers(store: ObjectStore) {
  return async (run: ClaimedRun, outputKey: string | null) => {
    if (!run.afterLostLease) return;
    const prefix = `outputs/${run.taskId}/${run.id}.`;
    const keep = outputKey === null ? undefined : `outputs/${outputKey}/`;
    for (let after: string | undefined; ; ) {
      const page = await store.list(prefix, after === undefined ? {} : { after });
      // Only keys the store takes: a name the service never gives (a copy made by hand) would fail the
      // delete of the whole page.
      const gone = page
        .map((o) => o.key)
        .filter((k) => (keep === undefined || !k.startsWith(keep)) && isStoreKey(k));
      if (gone.length > 0) await store.delete(gone);
      if (page.length < 1000) return;
      after = page.at(-1)?.key;
    }
  };
}
