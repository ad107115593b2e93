// The object store on a local directory (`ASSAY_STORAGE=local`, the default): a key is a file under
// the root (`$ASSAY_DATA_DIR`). Writes go to `.partial/` first and are published with one rename, so a
// key never names half a file. Programs read inputs in place (`localPath`).
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import fsp from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import {
  type ByteRange,
  checkKey,
  checkPrefix,
  meter,
  type ObjectInfo,
  ObjectMissingError,
  type ObjectStore,
  type OpenObject,
  type PutResult,
  RangeNotSatisfiableError,
  rangeIn,
  watchPut,
} from "./store.ts";

/** Uploads in progress, under the root so the final rename stays on one filesystem. */
const PARTIAL_DIR = ".partial";

/** Anything JavaScript's string order does not put in UTF-8 byte order (see byteOrder). */
const HIGH = /[\ud800-\uffff]/;

/**
 * Strings compared by their UTF-8 bytes, as S3 orders keys. JavaScript compares UTF-16 code units: the
 * same order except between a surrogate pair and a character from U+E000, so only where such characters
 * occur (never in the service's own keys: see KEY_SHAPE) are strings encoded to compare.
 */
function byteOrder(plain: boolean): (a: string, b: string) => number {
  return plain
    ? (a, b) => (a < b ? -1 : a > b ? 1 : 0)
    : (a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b));
}

/** A folder's entries in key order: a folder's sort name is its name and the slash its keys go on with. */
interface SortedFolder {
  sortNames: string[];
  dirs: boolean[];
  compare: (a: string, b: string) => number;
}

/** Folders and files a listing reads at once. */
const LIST_BATCH = 16;

const missing = (err: unknown) => (err as NodeJS.ErrnoException).code === "ENOENT";

/** A missing file or folder, or a path through a file (what a folder replaced by a file gives). */
const gone = (err: unknown) => missing(err) || (err as NodeJS.ErrnoException).code === "ENOTDIR";

/**
 * A folder's entries with their types; undefined when the folder is gone. Where the filesystem does not
 * say an entry's type in the listing (NFS over READDIR, ext2/3/4 without `filetype`, XFS without
 * `ftype`, some FUSE ones), Node looks at each such entry (lstat) and fails the whole readdir ENOENT
 * when one is gone by then — a run's folder discarded or pruned by another worker a moment after the
 * read — and that read as the folder missing: a listing of a task's outputs left out every run (about one read
 * in three of a task's folder while another process kept and discarded attempts there). An entry
 * gone is left out; the folder is read again and its entries looked at here, one each.
 */
async function folderEntries(
  dir: string,
): Promise<{ name: string; dir: boolean; file: boolean }[] | undefined> {
  try {
    const entries = await fsp.readdir(dir, { withFileTypes: true });
    return entries.map((e) => ({ name: e.name, dir: e.isDirectory(), file: e.isFile() }));
  } catch (err) {
    if (!gone(err)) throw err;
    // The folder's own failure names the folder; an entry's names the entry.
    if ((err as NodeJS.ErrnoException).path === dir) return undefined;
  }
  let names: string[];
  try {
    names = await fsp.readdir(dir);
  } catch (err) {
    if (gone(err)) return undefined;
    throw err;
  }
  const found: { name: string; dir: boolean; file: boolean }[] = [];
  for (let i = 0; i < names.length; i += LIST_BATCH) {
    const stats = await Promise.all(
      names.slice(i, i + LIST_BATCH).map((name) =>
        fsp.lstat(path.join(dir, name)).then(
          (st) => ({ name, dir: st.isDirectory(), file: st.isFile() }),
          (err: unknown) => {
            if (gone(err)) return undefined;
            throw err;
          },
        ),
      ),
    );
    for (const e of stats) if (e) found.push(e);
  }
  return found;
}

/** A folder's files and folders (nothing else) in key order; undefined when it is not a folder. */
async function sortedFolder(dir: string): Promise<SortedFolder | undefined> {
  const entries = await folderEntries(dir);
  if (!entries) return undefined;
  const items: { sortName: string; dir: boolean }[] = [];
  let plain = true;
  for (const e of entries) {
    if (!e.dir && !e.file) continue;
    if (plain && HIGH.test(e.name)) plain = false;
    items.push({ sortName: e.dir ? `${e.name}/` : e.name, dir: e.dir });
  }
  const compare = byteOrder(plain);
  items.sort((a, b) => compare(a.sortName, b.sortName));
  return { sortNames: items.map((x) => x.sortName), dirs: items.map((x) => x.dir), compare };
}

/**
 * Flushes a file's bytes to the disk, every call in the thread pool: an upload's flushes, where a slow
 * or hung file system must hold up the upload and not every request of the API.
 */
async function syncFile(file: string): Promise<void> {
  const handle = await fsp.open(file, "r");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/**
 * syncFile for the runner (publishFolder), which makes its attempt's folders synchronously already:
 * opened and closed synchronously (metadata calls), flushed through the thread pool (it waits for the
 * disk) — one round trip instead of three, paid by each of a run's flushes. Under `assay all` (API and
 * worker in one process, for development) a hung mount under the data directory stalls the API too. The flush's error is the
 * one thrown; a close's only when the flush succeeded (NFS reports a failed write back at close).
 */
async function syncFileInline(file: string): Promise<void> {
  const fd = fs.openSync(file, "r");
  try {
    await new Promise<void>((resolve, reject) => fs.fsync(fd, (err) => (err ? reject(err) : resolve())));
  } catch (err) {
    try {
      fs.closeSync(fd);
    } catch {
      // The flush's error says what went wrong.
    }
    throw err;
  }
  fs.closeSync(fd);
}

/** Flushes a folder's entries (a rename into it, a folder made in it) to the disk. */
const syncFolder = syncFile;

/**
 * Flushes `dir`, and when `made` (a rename made the folders), each folder above it up to `root`;
 * with `sync`, syncFile or syncFileInline.
 */
async function syncUp(root: string, dir: string, made: boolean, sync = syncFolder): Promise<void> {
  for (; ; dir = path.dirname(dir)) {
    await sync(dir);
    if (!made || dir === root || !dir.startsWith(root + path.sep)) return;
  }
}

/** Rounds of renameInto when the target's folder keeps vanishing and coming back. */
const RENAME_TRIES = 5;
/**
 * Missing folders renameInto makes above a target, at most: the service's keys are at most four deep,
 * and a copied store's may be deeper (checkKey bounds none); a bound all the same.
 */
const RENAME_DEPTH = 64;

/**
 * Recursive removals tried when something keeps arriving in the folder (see deletePrefix), the n-th
 * retry after n ms: at most ~190 ms in all, spent only while arrivals keep coming.
 */
const REMOVE_TRIES = 20;

/** A rename onto a folder that holds something: Linux says ENOTEMPTY, POSIX allows EEXIST. */
const occupied = (err: unknown) =>
  ["ENOTEMPTY", "EEXIST"].includes((err as NodeJS.ErrnoException).code ?? "");

/**
 * Modes of what the store writes: nothing for other accounts on an API or worker host (users' files
 * and outputs); for the service's user and group what the process's umask gives. An upload is 0640;
 * a folder the store makes 0770 less the umask (0750 at 022; 0770 at 002, for an API and workers that
 * are different users of one group: each may then remove what the other made); a program's outputs
 * keep the modes it gave them less the others' bits (set-group-ID kept). Folders made before
 * 2026-12-07 (0755) and outputs then (0644) keep their modes.
 */
const FILE_MODE = 0o640;
const FOLDER_MODE = 0o770;

/** Takes the others' permission bits off `p` (a program's output or its folder), keeping the rest. */
function closeToOthers(p: string): void {
  const mode = fs.statSync(p).mode & 0o7777;
  if (mode & 0o007) fs.chmodSync(p, mode & ~0o007);
}

/** The file system calls renameInto makes: synchronous ones, or the thread pool's. */
export interface RenameCalls {
  rename(from: string, to: string): unknown;
  mkdir(dir: string): unknown;
  rmdir(dir: string): unknown;
  exists(p: string): boolean | Promise<boolean>;
}

/** Local metadata calls cost less than their thread-pool round trips: the runner's success path. */
export const SYNC_CALLS: RenameCalls = {
  rename: fs.renameSync,
  mkdir: (dir) => fs.mkdirSync(dir, { mode: FOLDER_MODE }),
  rmdir: fs.rmdirSync,
  exists: fs.existsSync,
};

/** The API's uploads: a slow or hung file system holds up the upload, not every request. */
const POOL_CALLS: RenameCalls = {
  rename: fsp.rename,
  mkdir: (dir) => fsp.mkdir(dir, { mode: FOLDER_MODE }),
  rmdir: fsp.rmdir,
  exists: (p) =>
    fsp.access(p).then(
      () => true,
      () => false,
    ),
};

/**
 * Renames `from` to `to`, making `to`'s missing folders, and says whether it may have made any (their
 * entries are to be flushed). A rename into a folder that exists costs nothing more. A missing folder
 * is not made empty and then renamed into: a delete that empties a folder removes it (see
 * LocalStore.prune) — a sweep, or another worker discarding its attempt of the same task — and such a
 * removal landing between the mkdir and the rename failed the rename again on each of five tries once
 * in a full test run (the test keeping and discarding as workers do). Instead `from` moves into a
 * staging folder beside it under `to`'s name, and the staging folder is renamed to `to`'s folder: the
 * folder appears with its content in one step, and a prune (rmdir) never removes a folder with
 * something in it. When the folder above is missing too, the staging folder goes into another under
 * that folder's name, and so on up. A folder missing at the first rename and back empty at the staged
 * one (a process of an earlier version made folders empty) is replaced by it; one back with something
 * in it is renamed into after all, `from` put back first — and its entry flushed all the same, as the
 * process that made it may not have yet. Each round needs a folder to vanish and come back full in two
 * windows microseconds wide. Synchronous calls by default (the runner).
 */
export async function renameInto(from: string, to: string, calls = SYNC_CALLS): Promise<boolean> {
  for (let tries = 1; ; tries++) {
    try {
      await calls.rename(from, to);
      return tries > 1;
    } catch (err) {
      if (!missing(err) || !(await calls.exists(from))) throw err;
      if (tries > RENAME_TRIES) throw err;
    }
    if (await stagedInto(calls, from, to)) return true;
  }
}

/**
 * renameInto's staged rename; false when a folder on the way came back occupied (`from` is in its
 * place again). Each stage is named after `from`, which is unique (an attempt's folder, a partial
 * upload): no other rename stages there. Any other failure is thrown as it was, once `from` is back
 * (or, when that fails too, left in a stage, which the sweeps remove with the attempt's folder or
 * the partial uploads): its code tells a full disk (isNoSpace).
 */
async function stagedInto(calls: RenameCalls, from: string, to: string): Promise<boolean> {
  // Each move made, undone in reverse order when the rename cannot land.
  const moves: { from: string; to: string; stage: string }[] = [];
  let item = from;
  let target = to;
  let failure: unknown;
  let cameBack = false;
  try {
    for (let depth = 1; ; depth++) {
      const stage = `${from}.stage${depth}`;
      await calls.mkdir(stage);
      const staged = path.join(stage, path.basename(target));
      try {
        await calls.rename(item, staged);
      } catch (err) {
        await quietly(() => calls.rmdir(stage));
        throw err;
      }
      moves.push({ from: item, to: staged, stage });
      item = stage;
      target = path.dirname(target);
      try {
        await calls.rename(item, target);
        return true;
      } catch (err) {
        cameBack = occupied(err);
        // Missing: the folder above is missing too, and is staged in turn.
        if (!missing(err) || depth === RENAME_DEPTH || path.dirname(target) === target) throw err;
      }
    }
  } catch (err) {
    failure = err;
  }
  for (const m of moves.reverse()) {
    if (!(await quietly(() => calls.rename(m.to, m.from)))) throw failure;
    await quietly(() => calls.rmdir(m.stage));
  }
  if (cameBack) return false;
  throw failure;
}

/** Whether `call` succeeded; its failure is not the caller's to report (a cleanup's). */
async function quietly(call: () => unknown): Promise<boolean> {
  try {
    await call();
    return true;
  } catch {
    return false;
  }
}

/**
 * Task folders whose entry in `outputs/` this process has flushed (or made and flushed), by path, with
 * the folder's identity then (device, inode, birth time): a publish into the same folder flushes
 * `outputs/` no more (see publishFolder). One pruned and made again since — by another worker, whose
 * own flush of it may come after this one's completion — is another folder, and is flushed again.
 * The oldest entries go first past FLUSHED_TASK_FOLDERS_KEPT.
 */
const flushedTaskFolders = new Map<string, string>();
const FLUSHED_TASK_FOLDERS_KEPT = 1000;

function folderIdentity(dir: string): string {
  const st = fs.statSync(dir);
  return `${st.dev}:${st.ino}:${st.birthtimeMs}`;
}

/**
 * Publishes an attempt's output folder `from` as `to` (renameInto), durably: the completion that names
 * the outputs commits next, and a power loss after it must not leave them empty or missing (new files'
 * bytes and a rename sit in the page cache for seconds). Renamed first, then flushed: its files
 * (`names`), the folder, the task's folder that holds it, and further up what this made (up to `root`)
 * — a crash before the flushes end leaves a folder no row names, which the store sweep removes; and
 * flushed after the rename, the first flush commits the rename with the files in one journal commit
 * (flushed before it, each run paid two: `bench/e2e.ts` ran at 0.91 of the plain loop against 0.93–0.98
 * without flushing). `outputs/`'s entry for the task's folder is flushed the first time this process
 * publishes into it (another attempt of the task may have made it a moment ago and not flushed it
 * yet), not for every run. One flush at a time, through the thread pool (each may wait for the disk).
 */
export async function publishFolder(root: string, from: string, to: string, names: readonly string[]) {
  // The program wrote them under its umask (0644 files in a 0755 folder, for every local account to
  // read): nothing for others, as an upload (FILE_MODE).
  closeToOthers(from);
  for (const n of names) closeToOthers(path.join(from, n));
  const made = await renameInto(from, to);
  const task = path.dirname(to);
  try {
    for (const n of names) await syncFileInline(path.join(to, n));
    await syncFileInline(to);
    await syncFileInline(task);
  } catch (err) {
    // Not published after all (the attempt fails, and is retried): nothing of it stays in the store
    // for the sweep to find a day later.
    await fsp.rm(to, { recursive: true, force: true }).catch(() => {});
    throw err;
  }
  const identity = folderIdentity(task);
  if (!made && flushedTaskFolders.get(task) === identity) return;
  await syncUp(root, path.dirname(task), made, syncFileInline);
  flushedTaskFolders.delete(task);
  flushedTaskFolders.set(task, identity);
  if (flushedTaskFolders.size > FLUSHED_TASK_FOLDERS_KEPT)
    flushedTaskFolders.delete(flushedTaskFolders.keys().next().value as string);
}

export class LocalStore implements ObjectStore {
  readonly kind = "local";
  readonly root: string;

  constructor(root: string) {
    this.root = path.resolve(root);
  }

  /** The absolute path of `key`, refusing anything outside the root. */
  localPath(key: string): string {
    const full = path.resolve(this.root, checkKey(key));
    if (!full.startsWith(this.root + path.sep)) throw new Error(`storage key escapes the root: ${key}`);
    return full;
  }

  /** The partial folder is made once per store (a folder removed meanwhile is made again). */
  private partialReady = false;

  private async partial(): Promise<string> {
    const dir = path.join(this.root, PARTIAL_DIR);
    if (!this.partialReady || !fs.existsSync(dir)) {
      await fsp.mkdir(dir, { recursive: true, mode: FOLDER_MODE });
      this.partialReady = true;
    }
    return path.join(dir, `${Date.now()}-${randomBytes(8).toString("hex")}`);
  }

  /**
   * Published by renameInto, through the thread pool: one rename, or when the key's folders are
   * missing, renames of staging folders that make them with the file in them, so that a delete
   * emptying one cannot remove it before the rename (a put costs no mkdir). The caller has flushed
   * `tmp`'s bytes to disk; the rename is flushed here, with the folders it made: the row that names
   * the key is committed next, and a power loss after that commit must not leave the key missing or
   * empty (a new file's bytes and a rename sit in the page cache for seconds otherwise).
   */
  private async publish(tmp: string, key: string): Promise<void> {
    const target = this.localPath(key);
    const made = await renameInto(tmp, target, POOL_CALLS);
    await syncUp(this.root, path.dirname(target), made);
  }

  async put(key: string, source: Readable, maxBytes = Number.POSITIVE_INFINITY): Promise<PutResult> {
    this.localPath(key);
    const tmp = await this.partial();
    const m = meter(maxBytes);
    // flush: the bytes reach the disk before the file is closed, and so before it is published.
    const file = fs.createWriteStream(tmp, { flags: "wx", mode: FILE_MODE, flush: true });
    const failure = watchPut(source, [m.stream, file]);
    try {
      await pipeline(source, m.stream, file).catch((err: unknown) => {
        throw failure(err);
      });
      await this.publish(tmp, key);
    } catch (err) {
      // A source that had failed already fails the pipeline before the file is even open: wait until
      // it is closed, or the removal would run first and the file appear after it.
      if (!file.closed) await new Promise<void>((resolve) => file.once("close", () => resolve()));
      await fsp.rm(tmp, { force: true });
      throw err;
    }
    return m.result();
  }

  async putFile(key: string, file: string): Promise<void> {
    this.localPath(key);
    const tmp = await this.partial();
    try {
      await fsp.copyFile(file, tmp);
      await syncFile(tmp);
      await this.publish(tmp, key);
    } catch (err) {
      await fsp.rm(tmp, { force: true });
      throw err;
    }
  }

  /**
   * Opens the file before returning: a key that is gone is known before anything is sent, and one
   * deleted while it is read is read to its end (the descriptor keeps it). The stream closes the
   * descriptor when it ends or is destroyed. A range is read from its first byte on (positioned reads).
   */
  async open(key: string, o: { range?: ByteRange } = {}): Promise<OpenObject> {
    const handle = await fsp.open(this.localPath(key), "r").catch((err: unknown) => {
      throw missing(err) ? new ObjectMissingError(key) : err;
    });
    try {
      const stat = await handle.stat();
      if (!stat.isFile()) throw new ObjectMissingError(key);
      const range = o.range && rangeIn(o.range, stat.size);
      if (o.range && !range) throw new RangeNotSatisfiableError(key, stat.size);
      const length = range ? range.end - range.start + 1 : stat.size;
      // A read buffer the file's size when it is small (most outputs are): a 64 KiB buffer per object
      // is garbage that a zip of 100,000 small outputs makes faster than it is collected.
      const highWaterMark = Math.max(1, Math.min(length, 64 * 1024));
      return range
        ? { stream: handle.createReadStream({ highWaterMark, ...range }), size: stat.size, range }
        : { stream: handle.createReadStream({ highWaterMark }), size: stat.size };
    } catch (err) {
      await handle.close();
      throw err;
    }
  }

  async stat(key: string): Promise<ObjectInfo> {
    const stat = await fsp.stat(this.localPath(key)).catch((err: unknown) => {
      throw missing(err) || (err as NodeJS.ErrnoException).code === "ENOTDIR"
        ? new ObjectMissingError(key)
        : err;
    });
    // A folder is no object (as open() says).
    if (!stat.isFile()) throw new ObjectMissingError(key);
    return { key, size: stat.size, modified: stat.mtime };
  }

  /** A copy on one disk: `signal` is looked at before it, not during. */
  async download(key: string, file: string, signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    await fsp.copyFile(this.localPath(key), file).catch((err: unknown) => {
      throw missing(err) ? new ObjectMissingError(key) : err;
    });
  }

  async delete(keys: readonly string[], o: { signal?: AbortSignal } = {}): Promise<void> {
    const folders = new Set<string>();
    for (const key of keys) {
      o.signal?.throwIfAborted();
      const file = this.localPath(key);
      await fsp.rm(file, { force: true });
      folders.add(path.dirname(file));
    }
    for (const folder of folders) await this.prune(folder);
  }

  /**
   * Removes the prefix's folder whole. A recursive rm reads a folder, removes what it read and then the
   * folder, which fails ENOTEMPTY when something was renamed into it in between: a keep into a task
   * whose outputs are being deleted (a stale attempt of a task retention removes, publishing late; its
   * completion is fenced off). That is a reason to remove the folder again, the arrival with it: no
   * row will name it (S3's listing-then-delete leaves such an arrival to the store sweep instead). Each
   * retry needs another arrival during the rm — against a process keeping and discarding attempts there
   * as fast as it could, the first rm failed one time in two, and on a loaded machine five in a row
   * failed once in 249 deletes — so the tries are many and spaced out. Anything else throws.
   */
  async deletePrefix(prefix: string): Promise<number> {
    const n = await this.count(checkPrefix(prefix));
    const folder = this.localPath(prefix.slice(0, -1));
    try {
      for (let tries = 1; ; tries++) {
        try {
          await fsp.rm(folder, { recursive: true, force: true });
          break;
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== "ENOTEMPTY" || tries === REMOVE_TRIES) throw err;
        }
        await new Promise((resolve) => setTimeout(resolve, tries));
      }
    } finally {
      // Its listing, kept from the count above or an earlier read, lists what is (being) removed.
      this.deletions++;
      if (this.top && (this.top.dir === folder || this.top.dir.startsWith(`${folder}${path.sep}`))) {
        this.keep(undefined);
      }
    }
    await this.prune(path.dirname(folder));
    return n;
  }

  /**
   * Removes `dir` and then its parents while they are empty, up to a key's first folder (`outputs/`,
   * `files/`), which stays. A folder holds no object of its own: one whose last object was deleted
   * (the store sweep's orphans, a fenced-off attempt's discard, an earlier attempt's leftovers) was
   * otherwise left behind for good, and every later listing walked it — a task whose deletion was
   * interrupted left a folder per run. rmdir removes only an empty folder, so nothing stored is at
   * risk, and a rename makes a missing folder with its content in it (renameInto), so none is pruned
   * between its making and the rename. Best effort: the delete has happened whatever this finds.
   */
  private async prune(dir: string): Promise<void> {
    for (let d = dir; path.dirname(path.relative(this.root, d)) !== "."; d = path.dirname(d)) {
      if (!d.startsWith(this.root + path.sep)) return;
      try {
        await fsp.rmdir(d);
      } catch (err) {
        // Gone already (another delete pruned it): its parent may be empty now too.
        if (!missing(err)) return;
      }
    }
  }

  private async count(prefix: string): Promise<number> {
    let n = 0;
    for (let after: string | undefined, page: ObjectInfo[]; ; after = page.at(-1)?.key) {
      page = await this.list(prefix, after === undefined ? {} : { after });
      n += page.length;
      if (page.length < 1000) return n;
    }
  }

  /**
   * Walks the directories the prefix names in key order, and stops at `limit` (S3 lists by prefix
   * natively): each folder is read once and sorted, folders and files wholly at or before `after` are
   * skipped without a look inside, and only the files returned are stat'ed. Paging through a task's
   * outputs (a folder per run) thus reads the task's folder, and `limit` run folders, per page — not
   * every run folder for every page. Keys come out in the same order S3 gives them: by their UTF-8
   * bytes (a file `a` before the keys `a.b/…` before the keys `a/…`).
   */
  async list(prefix: string, o: { after?: string; limit?: number } = {}): Promise<ObjectInfo[]> {
    const limit = o.limit ?? 1000;
    const after = o.after;
    const afterPlain = after === undefined || !HIGH.test(after);
    const slash = prefix.lastIndexOf("/");
    const dirKey = slash === -1 ? "" : prefix.slice(0, slash);
    if (dirKey !== "") checkKey(dirKey);
    const base = dirKey === "" ? this.root : this.localPath(dirKey);
    /** Up to `max` objects under `dir` (whose keys start with `keyPrefix`), in key order. */
    const walk = async (dir: string, keyPrefix: string, max: number, top: boolean): Promise<ObjectInfo[]> => {
      const folder = top ? await this.sortedTop(dir) : await sortedFolder(dir);
      if (!folder) return [];
      const { sortNames, dirs } = folder;
      const compare = afterPlain ? folder.compare : byteOrder(false);
      // Where `after` falls among this folder's entries: every key here starts with keyPrefix.
      let start = 0;
      if (after !== undefined) {
        if (!after.startsWith(keyPrefix)) {
          if (compare(after, keyPrefix) > 0) return [];
        } else {
          const rel = after.slice(keyPrefix.length);
          let lo = 0;
          let hi = sortNames.length;
          while (lo < hi) {
            const mid = (lo + hi) >>> 1;
            if (compare(sortNames[mid] as string, rel) <= 0) lo = mid + 1;
            else hi = mid;
          }
          // The folder `after` is inside of comes just before: its later keys are still to come.
          start = lo > 0 && dirs[lo - 1] && rel.startsWith(sortNames[lo - 1] as string) ? lo - 1 : lo;
        }
      }
      // The prefix, below this folder's keys: what an entry's sort name must begin with (or, for a
      // folder the prefix goes into, be the beginning of).
      const rel = prefix.length > keyPrefix.length ? prefix.slice(keyPrefix.length) : "";
      const found: ObjectInfo[] = [];
      let i = start;
      while (i < sortNames.length && found.length < max) {
        // A few at a time (a folder per run is one readdir and one stat, each a round trip to the
        // thread pool), appended in order; a batch may read a few folders past `max`.
        const batch: Promise<ObjectInfo[]>[] = [];
        for (; i < sortNames.length && batch.length < LIST_BATCH; i++) {
          const sortName = sortNames[i] as string;
          if (rel !== "" && !sortName.startsWith(rel) && !(dirs[i] && rel.startsWith(sortName))) continue;
          const name = dirs[i] ? sortName.slice(0, -1) : sortName;
          const full = path.join(dir, name);
          const key = `${keyPrefix}${name}`;
          if (dirs[i]) batch.push(walk(full, `${key}/`, max - found.length, false));
          else {
            batch.push(
              fsp.stat(full).then(
                (stat) => (stat.isFile() ? [{ key, size: stat.size, modified: stat.mtime }] : []),
                () => [],
              ),
            );
          }
        }
        for (const objects of await Promise.all(batch)) found.push(...objects);
      }
      return found.slice(0, max);
    };
    return limit > 0 ? walk(base, dirKey === "" ? "" : `${dirKey}/`, limit, true) : [];
  }

  /**
   * The folder a listing starts in, sorted — kept while it does not change (its inode and modification
   * time, to the nanosecond, stay the same), so paging through a task's 100,000 run folders reads and
   * sorts the task's folder once, not once per page. Small folders are not kept.
   */
  private top: { dir: string; stamp: string; folder: SortedFolder } | undefined;
  /**
   * Drops the kept listing once it has gone unused for keptIdleMs: a paging reads it again within
   * milliseconds, while a listing left by the last zip or store sweep (~40 bytes an entry: 3.8 MiB for a
   * 100,000-run task) was otherwise kept until another large folder replaced it.
   */
  private topTimer: NodeJS.Timeout | undefined;
  protected keptIdleMs = 10_000;
  /** Moved by every deletePrefix: a listing read across one is not kept (it may list what is gone). */
  private deletions = 0;

  private keep(top: { dir: string; stamp: string; folder: SortedFolder } | undefined): void {
    this.top = top;
    if (!top) {
      clearTimeout(this.topTimer);
      this.topTimer = undefined;
    } else if (this.topTimer) this.topTimer.refresh();
    else {
      this.topTimer = setTimeout(() => {
        this.top = undefined;
        this.topTimer = undefined;
      }, this.keptIdleMs);
      this.topTimer.unref();
    }
  }

  private async sortedTop(dir: string): Promise<SortedFolder | undefined> {
    // The clock before the folder is read: the read must begin a full second after its last change.
    const readAt = BigInt(Date.now()) * 1_000_000n;
    const stat = await fsp.stat(dir, { bigint: true }).catch((err: unknown) => {
      if (missing(err) || (err as NodeJS.ErrnoException).code === "ENOTDIR") return undefined;
      throw err;
    });
    if (!stat?.isDirectory()) return undefined;
    const stamp = `${stat.dev}:${stat.ino}:${stat.mtimeNs}:${stat.ctimeNs}`;
    if (this.top?.dir === dir && this.top.stamp === stamp) {
      this.keep(this.top);
      return this.top.folder;
    }
    const deletions = this.deletions;
    const folder = await sortedFolder(dir);
    // A folder changed within the last second is not kept: where timestamps advance once per clock
    // tick (older kernels, NFS), a change in the same tick as the one read would leave the stamp as it
    // was and the kept listing stale (git's "racy" rule). A small folder does not evict a kept one.
    const settled = readAt - stat.mtimeNs > 1_000_000_000n;
    if (folder && folder.sortNames.length >= 1000 && settled && deletions === this.deletions) {
      this.keep({ dir, stamp, folder });
    } else if (this.top?.dir === dir) this.keep(undefined);
    return folder;
  }

  async check(): Promise<void> {
    await fsp.mkdir(this.root, { recursive: true, mode: FOLDER_MODE });
    await fsp.access(this.root, fs.constants.R_OK | fs.constants.W_OK);
  }

  /**
   * Removes partial uploads started before `olderThan`: what a process killed mid-upload left behind
   * (a live upload writes its partial file all the time, so its modification time is recent).
   */
  async abortIncompleteUploads(olderThan: Date): Promise<number> {
    const dir = path.join(this.root, PARTIAL_DIR);
    const names = await fsp.readdir(dir).catch(() => [] as string[]);
    let removed = 0;
    for (const name of names) {
      const full = path.join(dir, name);
      const stat = await fsp.stat(full).catch(() => undefined);
      if (stat && stat.mtimeMs < olderThan.getTime()) {
        // A folder is a put's staging folder (renameInto), its process killed in the middle.
        await fsp.rm(full, { recursive: true, force: true });
        removed++;
      }
    }
    return removed;
  }
}
