// Takes the analysis processes down with their worker, even when the worker is SIGKILLed (Node has no
// parent-death signal). A small helper process, started once per worker, is told the id of every
// process group the worker spawns and of every group that ended; when its stdin closes — the worker
// stopped, or died and the kernel closed the pipe — it kills the groups still listed. The ids come
// from spawn in this process, never from a database.
import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";

const HELPER = path.join(path.dirname(fileURLToPath(import.meta.url)), "group-guard.mjs");

export interface GroupRegistry {
  /** A process group was spawned (its id is the leader's pid). */
  add(pgid: number): void;
  /** The group is gone. */
  remove(pgid: number): void;
}

export class GroupGuard implements GroupRegistry {
  private closing = false;
  /** The helper could not be spawned ('error' without a pid): reported lost once. */
  private unspawned = false;

  private readonly child: ChildProcess;

  private constructor(child: ChildProcess) {
    this.child = child;
  }

  /**
   * Starts the helper; it lives until close() or until this process dies. `onLost` is called if it
   * ends on its own (killed by someone): analyses keep running, only the protection is gone.
   */
  static start(onLost?: () => void): GroupGuard {
    const child = spawn(process.execPath, [HELPER], {
      stdio: ["pipe", "ignore", "inherit"],
      env: { PATH: process.env.PATH ?? "" },
    });
    const guard = new GroupGuard(child);
    // A write after the helper died must not crash the worker; the worker's own cleanup still runs.
    child.stdin?.on("error", () => {});
    // Spawning it failed (EAGAIN, EMFILE, ENOENT: what spawn() emits rather than throws): an 'error'
    // without a listener crashed the worker. Now the protection is lost, as when it is killed.
    child.on("error", () => {
      if (child.pid !== undefined || guard.unspawned) return;
      guard.unspawned = true;
      if (!guard.closing) onLost?.();
    });
    child.on("exit", () => {
      if (!guard.closing) onLost?.();
    });
    child.unref();
    return guard;
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  add(pgid: number): void {
    this.child.stdin?.write(`+${pgid}\n`);
  }

  remove(pgid: number): void {
    this.child.stdin?.write(`-${pgid}\n`);
  }

  /** Ends the helper (killing any group still listed) and waits for it to exit. */
  close(): Promise<void> {
    this.closing = true;
    // No pid: it was never spawned (its 'error' may not even have come yet), so no 'exit' will come.
    if (this.child.pid === undefined || this.child.exitCode !== null || this.child.signalCode !== null)
      return Promise.resolve();
    this.child.ref(); // wait for it even if nothing else keeps this process busy
    const exited = new Promise<void>((resolve) => this.child.once("exit", () => resolve()));
    this.child.stdin?.end();
    return exited;
  }
}
