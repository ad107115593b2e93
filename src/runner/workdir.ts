// A worker's scratch folder, `$ASSAY_DATA_DIR/work/<machine>.<pid>.<random>/` (mode 0700): each attempt
// writes its outputs (and, with a remote store, fetches its input) in a folder of its own here.
//
// A worker killed outright leaves its folder behind; other workers remove such leftovers. The data
// directory may be shared by workers that cannot see each other's processes (containers on one volume,
// hosts on NFS), so a pid alone says nothing: a folder is judged by its pid only when its `<machine>`
// tag — hostname, boot and pid namespace — is this process's own, where pids mean the same thing.
// Every other folder is judged by its age: a live worker touches its folder every minute, and a
// folder untouched for an hour belongs to no one.
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import fsp from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { isAlive } from "../proc.ts";

/** How often a live worker touches its folder. */
export const WORKDIR_TOUCH_MS = 60_000;
/** A folder of another machine (or pid namespace) untouched this long is a leftover. */
export const WORKDIR_ABANDONED_MS = 60 * 60_000;
/** How often a worker looks for leftovers (besides at start). */
const SWEEP_EVERY_TOUCHES = 10;
/**
 * The folders this process has open. Its own pid on a folder of its own machine proves nothing more:
 * a container restarted in place gets the same hostname, boot and — a few seconds after the old one is
 * gone — the same pid namespace inode, and its worker the same pid, so the killed worker's folder (with
 * its fetched inputs) read as the live worker's own and was never removed.
 */
const OWN_FOLDERS = new Set<string>();

export interface WorkDir {
  readonly dir: string;
  /** Stops touching the folder and removes it and whatever is left in it. */
  close(): Promise<void>;
}

function readOr(file: string, fallback: string): string {
  try {
    return fs.readFileSync(file, "utf8").trim();
  } catch {
    return fallback;
  }
}

function pidNamespace(): string {
  try {
    return fs.readlinkSync("/proc/self/ns/pid");
  } catch {
    return "";
  }
}

/** This process's machine tag: processes with the same tag see the same pids. */
export function machineTag(): string {
  const identity = [os.hostname(), readOr("/proc/sys/kernel/random/boot_id", ""), pidNamespace()].join("\n");
  return createHash("sha256").update(identity).digest("hex").slice(0, 12);
}

/** Whether the folder `name` (in `root`) is a leftover of a worker that is gone. */
async function abandoned(root: string, name: string, tag: string, now: number): Promise<boolean> {
  const m = /^([0-9a-f]{12})\.(\d+)\.[0-9a-f]+$/.exec(name);
  if (m?.[1] === tag) {
    const pid = Number(m[2]);
    // Same machine and namespace: the pid is the truth; this process's pid, only its open folders.
    return pid === process.pid ? !OWN_FOLDERS.has(name) : !isAlive(pid);
  }
  const stat = await fsp.stat(path.join(root, name)).catch(() => undefined);
  return stat !== undefined && now - stat.mtimeMs > WORKDIR_ABANDONED_MS;
}

/**
 * Removes a folder and everything in it, also what a program left read-only (a Go module cache in its
 * HOME is read-only directories): a plain recursive rm fails there for any user but root, so on
 * EACCES or EPERM the tree's folders are made writable and the rm tried once more.
 */
export async function removeTree(dir: string): Promise<void> {
  // No `maxRetries`: Node's retries nest with the tree's depth (a busy mount three folders down took
  // 12.7 s to fail with 3); removeAttemptDir tries a failed folder again later instead.
  const options = { recursive: true, force: true };
  try {
    await fsp.rm(dir, options);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== "EACCES" && code !== "EPERM") throw err;
    await writable(dir);
    await fsp.rm(dir, options);
  }
}

/**
 * Attempt folders whose removal failed — descriptors short (EMFILE: the recursive delete needs them
 * too), a busy mount, an NFS hiccup: the worker's folder timer tries them again each touch. Without
 * this such a folder, with its fetched input, stayed until the worker stopped.
 */
const REMOVE_LATER = new Set<string>();

/**
 * removeTree for an attempt's folder: when it fails, the folder is tried again with each touch of the
 * worker's folder (openWorkDir) until it goes. Rejects with the failure, as removeTree does.
 */
export async function removeAttemptDir(dir: string): Promise<void> {
  try {
    await removeTree(dir);
    REMOVE_LATER.delete(dir);
  } catch (err) {
    REMOVE_LATER.add(dir);
    throw err;
  }
}

/** A pass of removeFailedAttemptDirs under way: a hung mount must not get one more each minute. */
let removing: Promise<number> | undefined;

/**
 * Tries again the attempt folders whose removal failed; returns how many went. One pass at a time: a
 * pass stuck on a hung mount holds a thread of libuv's pool, and a new one each touch would take them
 * all (every file and DNS call of the worker would wait).
 */
export function removeFailedAttemptDirs(): Promise<number> {
  removing ??= (async () => {
    let removed = 0;
    for (const dir of [...REMOVE_LATER]) {
      try {
        await removeTree(dir);
        REMOVE_LATER.delete(dir);
        removed++;
      } catch {
        // Still there: the next touch tries again.
      }
    }
    return removed;
  })().finally(() => {
    removing = undefined;
  });
  return removing;
}

async function writable(dir: string): Promise<void> {
  await fsp.chmod(dir, 0o700).catch(() => {});
  const entries = await fsp.readdir(dir, { withFileTypes: true }).catch(() => []);
  for (const e of entries) if (e.isDirectory()) await writable(path.join(dir, e.name));
}

/**
 * Removes the leftovers of workers that are gone; returns how many. A folder that cannot be removed is
 * skipped (the next sweep tries again): it must not stop a worker from starting.
 */
export async function sweepWorkDirs(root: string, tag = machineTag(), now = Date.now()): Promise<number> {
  let removed = 0;
  for (const name of await fsp.readdir(root).catch(() => [])) {
    if (await abandoned(root, name, tag, now)) {
      try {
        await removeTree(path.join(root, name));
        removed++;
      } catch {
        // Left for the next sweep; the folder's owner may fix its permissions meanwhile.
      }
    }
  }
  return removed;
}

export async function openWorkDir(dataDir: string, o: { touchMs?: number } = {}): Promise<WorkDir> {
  const root = path.join(dataDir, "work");
  await fsp.mkdir(root, { recursive: true, mode: 0o700 });
  const tag = machineTag();
  await sweepWorkDirs(root, tag);
  const name = `${tag}.${process.pid}.${randomBytes(4).toString("hex")}`;
  const dir = path.join(root, name);
  // Before the folder exists: another sweep of this process must never see it unclaimed.
  OWN_FOLDERS.add(name);
  try {
    await fsp.mkdir(dir, { mode: 0o700 });
  } catch (err) {
    OWN_FOLDERS.delete(name);
    throw err;
  }
  let touches = 0;
  const timer = setInterval(() => {
    const now = new Date();
    fsp.utimes(dir, now, now).catch(() => {});
    if (REMOVE_LATER.size > 0) removeFailedAttemptDirs().catch(() => {});
    if (++touches % SWEEP_EVERY_TOUCHES === 0) sweepWorkDirs(root, tag).catch(() => {});
  }, o.touchMs ?? WORKDIR_TOUCH_MS);
  timer.unref();
  return {
    dir,
    close: async () => {
      clearInterval(timer);
      try {
        await removeTree(dir);
        for (const later of REMOVE_LATER)
          if (later.startsWith(`${dir}${path.sep}`)) REMOVE_LATER.delete(later);
      } finally {
        OWN_FOLDERS.delete(name);
      }
    },
  };
}
