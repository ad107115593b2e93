// Processes by pid.
import fs from "node:fs";

/**
 * Whether a process with this pid exists (one of another user's counts: EPERM). A zombie does not: it
 * has exited and only waits for its parent to collect it — in a container whose PID 1 collects late
 * (this sandbox's took ~1.9 s) a SIGKILLed worker was counted alive that long, and a worker started
 * meanwhile left its scratch folder to a later start.
 */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EPERM") return false;
  }
  return !isZombie(pid);
}

/** Whether the pid is a zombie, on Linux (`/proc/<pid>/stat`); elsewhere, or unreadable, it is not. */
function isZombie(pid: number): boolean {
  let stat: string;
  try {
    stat = fs.readFileSync(`/proc/${pid}/stat`, "latin1");
  } catch {
    return false;
  }
  // "<pid> (<comm>) <state> …": the command may hold spaces and parentheses, so after the last ")".
  return stat[stat.lastIndexOf(")") + 2] === "Z";
}
