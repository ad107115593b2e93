// Signals a whole process group. The group is the child we spawned with `detached: true`, so its
// id is the child's pid *as returned by spawn in this process* — never a pid read from a database.

/** Sends `signal` to every process in the group led by `pid`; false if the group is gone. */
export function killGroup(pid: number, signal: NodeJS.Signals): boolean {
  try {
    process.kill(-pid, signal);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ESRCH") return false;
    throw err;
  }
}
