// Node flags for the long-running server commands (`assay api | worker | all`), applied by re-executing
// the process with them — the same process (process.execve: the pid, stdio and signals stay), before
// anything is loaded. V8 reads heap sizes only when it sets its heap up, so they cannot be set from
// inside (v8.setFlagsFromString changes nothing once the heap exists).
//
// --max-semi-space-size=8 (MiB): V8 sizes the young generation by the machine's memory (a 64 MiB new
// space with Node 24 on a 24 GiB machine), and a busy server fills all of it between scavenges, so its
// resident size is that much higher than its live heap.
// --optimize-for-size (workers): a heap grown sparingly, for the workers' ~108 MiB against ~157. It
// also keeps the young generation at ~1 MiB whatever --max-semi-space-size says (V8 does not grow it in
// that mode), so a busy API scavenged six times as often, and the runs page served 0.18× a bare route
// instead of 0.45×.
// --heap-growing-percent=20 (the API): the old generation grown by 20% of what a full collection left,
// where V8 would grow it by up to 4×: what keeps the API under 200 MiB without --optimize-for-size.
// docs/operations.md, "Memory", has the figures.
//
// ASSAY_NODE_FLAGS: unset, the flags above; `0`, none; anything else, those flags instead, for every
// server command (space-separated). Client commands (`assay status`, `submit`, …) never re-execute:
// their start-up is what a user waits for. Without process.execve (Node < 22.15, Windows) the process
// runs as started.

import fs from "node:fs";

/** The flags `assay worker` runs with, unless ASSAY_NODE_FLAGS says otherwise. */
export const WORKER_NODE_FLAGS = ["--max-semi-space-size=8", "--optimize-for-size"];
/** The flags `assay api` and `assay all` (which serves the API) run with, unless ASSAY_NODE_FLAGS says otherwise. */
export const API_NODE_FLAGS = ["--max-semi-space-size=8", "--heap-growing-percent=20"];

const SERVER_COMMANDS = new Set(["api", "worker", "all"]);

/** The flags server command `command` should run with, from ASSAY_NODE_FLAGS (or its default). */
export function serverNodeFlags(env, command) {
  if (!SERVER_COMMANDS.has(command)) throw new Error(`not a server command: ${command}`);
  const value = env.ASSAY_NODE_FLAGS?.trim();
  if (value === undefined || value === "") return command === "worker" ? WORKER_NODE_FLAGS : API_NODE_FLAGS;
  if (value === "0") return [];
  const flags = value.split(/\s+/);
  // `--name` or `--name=value` only: `--` or `-` would end Node's options (the process would re-execute
  // forever, or read a script from stdin), and a flag with a separate value would take the script's place.
  const bad = flags.find((f) => !/^--[A-Za-z0-9][\w-]*(=.*)?$/.test(f));
  if (bad !== undefined) {
    process.stderr.write(`ASSAY_NODE_FLAGS: "${bad}" is not a flag (write each as --name or --name=value)\n`);
    process.exit(2);
  }
  return flags;
}

/** A flag's name as V8 and Node compare it: `_` and `-` alike, `--no-x` the same setting as `--x`. */
const flagName = (f) =>
  f
    .split("=")[0]
    .replaceAll("_", "-")
    .replace(/^--no-/, "--");

/**
 * Re-executes this process with the server flags it lacks when it runs a server command; returns
 * (doing nothing) otherwise. A flag counts as there when Node was started with it, by name (any value),
 * on its command line or in NODE_OPTIONS.
 */
export function execWithServerFlags(argv = process.argv, env = process.env) {
  if (!SERVER_COMMANDS.has(argv[2] ?? "") || typeof process.execve !== "function") return;
  // Started with an IPC channel (a process manager's fork mode, `node --watch`): a new image would lose
  // it (Node has already taken NODE_CHANNEL_FD out of the environment). Such a manager passes Node
  // flags itself, on the command line (PM2's node_args): NODE_OPTIONS refuses --optimize-for-size and
  // --heap-growing-percent.
  if (process.channel) return;
  // Re-executed already (execve keeps the pid): never twice, whatever the flags look like to this image.
  if (env.ASSAY_REEXECUTED === String(process.pid)) return;
  const present = [...process.execArgv, ...(env.NODE_OPTIONS ?? "").split(/\s+/)].map(flagName);
  const missing = serverNodeFlags(env, argv[2]).filter((f) => !present.includes(flagName(f)));
  if (missing.length === 0) return;
  // Node 24 aborts the process (no exception to catch) when execve fails: check what it would run.
  try {
    fs.accessSync(process.execPath, fs.constants.X_OK);
  } catch {
    return;
  }
  process.execve(process.execPath, [process.execPath, ...missing, ...process.execArgv, ...argv.slice(1)], {
    ...env,
    ASSAY_REEXECUTED: String(process.pid),
  });
}
