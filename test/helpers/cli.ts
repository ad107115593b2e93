// Runs the real CLI (`node bin/assay.js`) as a child process.
import { type ChildProcess, spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { STAGE_ROOT } from "../../src/db/embedded.ts";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
export const ASSAY_BIN = path.join(ROOT, "bin", "assay.js");

export interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** The environment without anything that points the CLI at the developer's own setup. */
export function cleanEnv(extra: Record<string, string | undefined> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const k of Object.keys(env)) {
    if (k.startsWith("ASSAY_") || ["DATABASE_URL", "PORT", "HOST", "LOG_LEVEL", "LOG_FORMAT"].includes(k))
      delete env[k];
  }
  for (const [k, v] of Object.entries(extra)) if (v !== undefined) env[k] = v;
  return env;
}

export function spawnCli(args: string[], env: NodeJS.ProcessEnv): ChildProcess {
  return spawn(process.execPath, [ASSAY_BIN, ...args], { env, cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
}

export function runCli(args: string[], env: NodeJS.ProcessEnv): Promise<CliResult> {
  const child = spawnCli(args, env);
  return collect(child);
}

export function collect(child: ChildProcess): Promise<CliResult> {
  let stdout = "";
  let stderr = "";
  child.stdout?.on("data", (c: Buffer) => (stdout += c.toString()));
  child.stderr?.on("data", (c: Buffer) => (stderr += c.toString()));
  return new Promise((resolve) =>
    child.on("close", (code, signal) => resolve({ code, signal, stdout, stderr })),
  );
}

/** Everything `child` printed on stdout so far, and a way to wait for a pattern in it. */
/** The process's exit, or a failure (and SIGKILL) when it is still running after `ms`. */
export async function exitWithin(child: ChildProcess, ms: number, what: string): Promise<CliResult> {
  const done = collect(child);
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<"hung">((resolve) => {
    timer = setTimeout(() => resolve("hung"), ms);
  });
  const result = await Promise.race([done, bound]);
  clearTimeout(timer);
  if (result === "hung") {
    child.kill("SIGKILL");
    const { stdout, stderr } = await done;
    throw new Error(`${what} still running ${ms} ms after start:\n${stdout.slice(-2000)}\n${stderr}`);
  }
  return result;
}

export interface Watched {
  readonly stdout: () => string;
  /**
   * Resolves with the first match of `pattern` in all stdout so far, or rejects when the process ends
   * first — or, given `timeoutMs`, when that passes first (the message shows what was printed).
   */
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<RegExpExecArray>;
}

export function watch(child: ChildProcess): Watched {
  let buffer = "";
  let errors = "";
  let ended = false;
  const waiters = new Set<() => void>();
  // The last of stderr, for the message when the process ends too early.
  child.stderr?.on("data", (chunk: Buffer) => {
    errors = (errors + chunk.toString()).slice(-4000);
  });
  child.stdout?.on("data", (chunk: Buffer) => {
    buffer += chunk.toString();
    for (const w of waiters) w();
  });
  child.on("close", () => {
    ended = true;
    for (const w of waiters) w();
  });
  return {
    stdout: () => buffer,
    waitFor: (pattern, timeoutMs) =>
      new Promise((resolve, reject) => {
        let timer: NodeJS.Timeout | undefined;
        const settle = () => {
          waiters.delete(check);
          clearTimeout(timer);
        };
        const check = () => {
          const match = pattern.exec(buffer);
          if (match) {
            settle();
            resolve(match);
          } else if (ended) {
            settle();
            reject(new Error(`process exited before printing ${pattern}:\n${buffer}\nstderr:\n${errors}`));
          }
        };
        waiters.add(check);
        if (timeoutMs !== undefined)
          timer = setTimeout(() => {
            settle();
            reject(
              new Error(
                `process ${child.pid} printed no ${pattern} in ${timeoutMs} ms:\n${buffer.slice(-4000)}\nstderr:\n${errors}`,
              ),
            );
          }, timeoutMs);
        check();
      }),
  };
}

/**
 * Removes `root`, and first the embedded clusters its data dirs' `pg` links point to under
 * STAGE_ROOT/clusters (as root a data dir's cluster lives there, and removing the data dir leaves it:
 * each test file that ran `assay` on one left ~50 MB behind). The servers must be stopped.
 */
export function removeWithClusters(root: string): void {
  const clusters = path.join(STAGE_ROOT, "clusters") + path.sep;
  const walk = (dir: string, depth: number): void => {
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const full = path.join(dir, e.name);
      if (e.isSymbolicLink() && e.name === "pg") {
        const target = path.resolve(dir, fs.readlinkSync(full));
        if (target.startsWith(clusters)) fs.rmSync(target, { recursive: true, force: true });
      } else if (e.isDirectory() && depth < 4) walk(full, depth + 1);
    }
  };
  walk(root, 0);
  fs.rmSync(root, { recursive: true, force: true });
}
