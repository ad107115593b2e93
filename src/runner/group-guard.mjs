// The group guard's helper process (see group-guard.ts). Plain JavaScript, no dependencies: it must
// start fast and stay small. Reads "+<pgid>" / "-<pgid>" lines on stdin; when stdin ends — the worker
// closed it, or the worker died and the kernel closed it — sends SIGKILL to every group still listed
// and exits.
let pending = "";
const groups = new Set();

process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => {
  pending += chunk;
  for (let nl = pending.indexOf("\n"); nl >= 0; nl = pending.indexOf("\n")) {
    const line = pending.slice(0, nl);
    pending = pending.slice(nl + 1);
    const pgid = Number(line.slice(1));
    if (!Number.isInteger(pgid) || pgid <= 1) continue;
    if (line[0] === "+") groups.add(pgid);
    else if (line[0] === "-") groups.delete(pgid);
  }
});
process.stdin.on("end", () => {
  for (const pgid of groups) {
    try {
      process.kill(-pgid, "SIGKILL");
    } catch {
      // already gone
    }
  }
  process.exit(0);
});
// Signals meant for the worker (Ctrl-C reaches the whole foreground group) must not take the guard
// down first: it leaves when the worker does, by stdin.
process.on("SIGINT", () => {});
process.on("SIGTERM", () => {});
process.on("SIGHUP", () => {});
