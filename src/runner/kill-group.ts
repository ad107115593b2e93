// Signals a whole process group. The group is the child we spawned with `detached: true`, so its
// id is the child's pid *as returned by spawn in this process* — never a pid read from a database.
// Never throws: it is called from a child's `exit` handler and from timers, where an exception would
// take the whole worker down.
import fsp from "node:fs/promises";

/**
 * How a signal went: `sent` to at least one process of the group; the group is `gone` (ESRCH); or it
 * `failed` — EPERM: every process left in the group runs as another user now (a program that changed
 * its user through a setuid helper such as `su`), and nothing more can be done from here.
 */
export type KillResult = "sent" | "gone" | "failed";

/** Sends `signal` to every process in the group led by `pid`. */
export function killGroup(pid: number, signal: NodeJS.Signals): KillResult {
  try {
    process.kill(-pid, signal);
    return "sent";
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "ESRCH" ? "gone" : "failed";
  }
}

/**
 * SIGKILLs every process that has `marker` (`NAME=value`) in its environment, as read from
 * `/proc/<pid>/environ`; returns their pids. It finds processes that left their run's group (setsid, or
 * a daemon's double fork) — a group kill cannot reach them — as long as they kept the environment they
 * were given: the marker must be an entry no other process has (the attempt's private HOME). Best
 * effort: where there is no /proc, or a process cleared its environment or runs as another user, it
 * finds nothing. It reads every process's environment, so it is only for the rare run that needs it.
 */
export async function killMarked(marker: string): Promise<number[]> {
  const wanted = Buffer.from(`${marker}\0`);
  const killed: number[] = [];
  const names = await fsp.readdir("/proc").catch(() => [] as string[]);
  for (const name of names) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    const environ = await fsp.readFile(`/proc/${name}/environ`).catch(() => undefined);
    // An entry is matched whole: at the start, or after the NUL that ends the one before it.
    if (!environ || !(environ.subarray(0, wanted.length).equals(wanted) || environ.includes(`\0${marker}\0`)))
      continue;
    try {
      process.kill(Number(name), "SIGKILL");
      killed.push(Number(name));
    } catch {
      // Gone meanwhile, or not ours to kill.
    }
  }
  return killed;
}
