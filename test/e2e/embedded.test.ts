// The two-command promise: with no DATABASE_URL, `assay all` starts an embedded PostgreSQL from a
// data directory only its owner can read, migrates it, serves, and leaves nothing running on SIGINT.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { freePort } from "../../src/db/embedded.ts";
import { isAlive } from "../../src/proc.ts";
import { cleanEnv, collect, ROOT, removeWithClusters, spawnCli, watch } from "../helpers/cli.ts";

const home = fs.mkdtempSync(path.join(os.tmpdir(), "assay-embedded-")); // mode 0700: only its owner reads it
after(() => removeWithClusters(home));

function postmasterPid(dataDir: string): number | undefined {
  try {
    return Number(fs.readFileSync(path.join(dataDir, "pg", "postmaster.pid"), "utf8").split("\n")[0]);
  } catch {
    return undefined;
  }
}

/** A process that has exited is not alive, collected by its parent or not (src/proc.ts). */
const alive = isAlive;

test("assay all with the embedded database: dev token works, data kept across runs, Ctrl-C leaves nothing", async () => {
  const dataDir = path.join(home, "data");
  assert.equal(fs.statSync(home).mode & 0o777, 0o700);
  for (const round of [1, 2]) {
    const child = spawnCli(["all", "--dev-token"], cleanEnv({ ASSAY_DATA_DIR: dataDir, PORT: "0" }));
    const out = watch(child);
    const done = collect(child);
    const [, address] = await out.waitFor(/listening on (http:\/\/[\d.:]+)/);
    const [, token] = await out.waitFor(/export ASSAY_TOKEN=(\S+)/);
    const health = await fetch(`${address}/healthz`);
    assert.equal(health.status, 200);
    assert.equal((await fetch(`${address}/readyz`)).status, 200);
    const form = new FormData();
    form.append("file", new Blob([`round,${round}\n`]), "r.csv");
    const up = await fetch(`${address}/api/files`, {
      method: "POST",
      body: form,
      headers: { authorization: `Bearer ${token}` },
    });
    assert.equal(up.status, 201);
    const { data } = (await up.json()) as { data: { fileId: string } };
    assert.equal(data.fileId, String(round), "the database survives a restart: ids keep counting");
    const pid = postmasterPid(dataDir);
    assert.ok(pid && alive(pid), "the embedded server runs while the service runs");

    child.kill("SIGINT");
    const exit = await done;
    assert.equal(exit.code, 0, exit.stderr);
    assert.equal(alive(pid), false, "Ctrl-C stops the embedded PostgreSQL too");
  }
});

test("after a SIGKILL the embedded server survives; the next start adopts it and stops it on exit", async () => {
  const dataDir = path.join(home, "adopt");
  const start = async () => {
    const child = spawnCli(["api"], cleanEnv({ ASSAY_DATA_DIR: dataDir, PORT: "0" }));
    const out = watch(child);
    const done = collect(child);
    const [, address] = await out.waitFor(/Server listening at (http:\/\/[\d.:]+)/);
    assert.equal((await fetch(`${address}/readyz`)).status, 200);
    return { child, done, out };
  };
  const first = await start();
  const pid = postmasterPid(dataDir);
  assert.ok(pid && alive(pid));
  first.child.kill("SIGKILL");
  await first.done;
  assert.ok(alive(pid), "SIGKILL cannot stop the detached server");

  const second = await start();
  await second.out.waitFor(/adopted the embedded PostgreSQL/);
  assert.equal(postmasterPid(dataDir), pid, "the same server, not a second one");
  second.child.kill("SIGINT");
  assert.equal((await second.done).code, 0);
  assert.equal(alive(pid), false, "the adopted server is stopped with the process that adopted it");
});

test("two commands starting the embedded database at once on a fresh data dir: one initialises it, the other attaches", async () => {
  const dataDir = path.join(home, "race");
  const env = cleanEnv({ ASSAY_DATA_DIR: dataDir, PORT: "0", LOG_LEVEL: "info" });
  const start = (mode: string, ready: RegExp) => {
    const child = spawnCli([mode], env);
    const out = watch(child);
    return { child, out, done: collect(child), ready: out.waitFor(ready) };
  };
  // Both at once: without the start lock both ran initdb, and one failed (a cluster directory not empty,
  // or no pg.password yet).
  const both = [start("api", /Server listening at/), start("worker", /worker started/)];
  await Promise.all(both.map((p) => p.ready));
  const pid = postmasterPid(dataDir);
  assert.ok(pid && alive(pid), "one server for both");
  const attached = both.filter((p) =>
    /attached to the embedded PostgreSQL of process \d+/.test(p.out.stdout()),
  );
  assert.equal(attached.length, 1, "the second attached to the first's server");
  assert.equal(fs.existsSync(`${dataDir}.lock`), false, "the start lock is released");
  // The one attached first (it leaves the server running), then the owner (it stops it).
  const owner = both.find((p) => !attached.includes(p));
  for (const p of [...attached, owner]) {
    p?.child.kill("SIGINT");
    const exit = await p?.done;
    assert.equal(exit?.code, 0, exit?.stderr);
  }
  assert.equal(alive(pid), false, "the owner stopped the server on exit");
});

test("SIGTERM during start-up (waiting for the object store) stops the embedded database and exits 0", async () => {
  const dataDir = path.join(home, "early-signal");
  const child = spawnCli(
    ["worker"],
    cleanEnv({
      ASSAY_DATA_DIR: dataDir,
      LOG_LEVEL: "info",
      ASSAY_STORAGE: "s3",
      ASSAY_S3_BUCKET: "nowhere",
      // Nothing listens there: start-up waits for the store, after the embedded database started.
      ASSAY_S3_ENDPOINT: `http://127.0.0.1:${await freePort()}`,
      ASSAY_S3_FORCE_PATH_STYLE: "true",
    }),
  );
  const out = watch(child);
  const done = collect(child);
  await out.waitFor(/object store unreachable; waiting/);
  const pid = postmasterPid(dataDir);
  assert.ok(pid && alive(pid), "the embedded server runs while start-up waits");
  try {
    child.kill("SIGTERM");
    const exit = await done;
    assert.equal(exit.code, 0, `${exit.code} ${exit.signal}\n${exit.stdout.slice(-1500)}\n${exit.stderr}`);
    assert.equal(alive(pid), false, "the signal stopped the embedded PostgreSQL, not only the process");
  } finally {
    if (alive(pid)) process.kill(pid, "SIGINT");
  }
});

/**
 * A process that takes the start lock of `dataDir` (lockStart, as a start does), prints HELD, and
 * releases it at a line on its stdin. With `pause`, it stops after judging a lock stale, before taking
 * it over, until a line on its stdin.
 */
function lockTaker(dataDir: string, pause = false) {
  const script = `
    import readline from "node:readline";
    const { lockStart } = await import(${JSON.stringify(path.join(ROOT, "src/db/embedded.ts"))});
    const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
    const log = (m) => console.log(m);
    const beforeTakeover = ${pause} ? async () => { console.log("PAUSED"); await lines.next(); } : undefined;
    console.log("READY");
    const release = await lockStart(${JSON.stringify(dataDir)}, log, { beforeTakeover });
    console.log("HELD");
    await lines.next();
    await release();
    console.log("RELEASED");
    process.exit(0);
  `;
  const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
    cwd: ROOT,
    stdio: ["pipe", "pipe", "pipe"],
  });
  return { child, out: watch(child), done: collect(child), say: () => child.stdin?.write("go\n") };
}

/** Rejects after `ms`: a bound on a wait that, without the fix, would last minutes. */
const within = <T>(ms: number, what: string, p: Promise<T>) =>
  Promise.race([
    p,
    new Promise<never>((_, reject) =>
      setTimeout(() => reject(new Error(`no ${what} within ${ms} ms`)), ms).unref(),
    ),
  ]);

test("two starts taking over the same stale start lock: only one holds it", async () => {
  const dataDir = path.join(home, "stale-race");
  fs.writeFileSync(`${dataDir}.lock`, String(spawnSync("true").pid)); // a dead pid
  const x = lockTaker(dataDir, true);
  let y: ReturnType<typeof lockTaker> | undefined;
  try {
    // X judged the lock stale and pauses before taking it over; Y takes it over meanwhile.
    await x.out.waitFor(/PAUSED/);
    y = lockTaker(dataDir);
    await y.out.waitFor(/HELD/);
    const yPid = y.child.pid as number;
    assert.match(fs.readFileSync(`${dataDir}.lock`, "utf8"), new RegExp(`^${yPid}\\b`));
    x.say();
    // X, resumed, must find Y's lock live and wait (before the fix it removed Y's lock and took it too).
    const [seen] = await x.out.waitFor(new RegExp(`HELD|waiting for process ${yPid}`));
    assert.notEqual(seen, "HELD", "X took the lock Y holds");
    assert.match(fs.readFileSync(`${dataDir}.lock`, "utf8"), new RegExp(`^${yPid}\\b`), "Y's lock put back");
    y.say();
    await y.out.waitFor(/RELEASED/);
    await x.out.waitFor(/HELD/);
    x.say();
    assert.equal((await x.done).code, 0);
    assert.equal((await y.done).code, 0);
    assert.equal(fs.existsSync(`${dataDir}.lock`), false);
    assert.deepEqual(
      fs.readdirSync(home).filter((f) => f.startsWith("stale-race.lock.")),
      [],
      "no renamed lock left",
    );
  } finally {
    x.child.kill("SIGKILL");
    y?.child.kill("SIGKILL");
  }
});

test("a start lock naming a live process with another start time (a reused pid) is taken over at once", async () => {
  const dataDir = path.join(home, "reused-pid");
  const bootId = fs.readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
  // This test's own pid — alive, but not the process that took the lock: its start time differs.
  fs.writeFileSync(`${dataDir}.lock`, `${process.pid} 1 ${bootId}`);
  // Written "now": not an empty-lock takeover either.
  const future = new Date(Date.now() + 3_600_000);
  fs.utimesSync(`${dataDir}.lock`, future, future);
  const taker = lockTaker(dataDir);
  try {
    await taker.out.waitFor(/READY/);
    await within(10_000, "takeover", taker.out.waitFor(/HELD/));
    assert.match(taker.out.stdout(), /taking over/);
    assert.doesNotMatch(taker.out.stdout(), /waiting for process/);
    taker.say();
    assert.equal((await taker.done).code, 0);
  } finally {
    taker.child.kill("SIGKILL");
  }
});

test("SIGTERM while start-up waits for another start's lock: exits 0 at once, having started nothing", async () => {
  const dataDir = path.join(home, "lock-signal");
  fs.mkdirSync(dataDir);
  const holder = spawn("sleep", ["600"], { stdio: "ignore" }); // a live start holding the lock
  fs.writeFileSync(path.join(dataDir, "pg.lock"), String(holder.pid));
  // Shutdown bound 10 s: before the fix the lock wait (2 min) outlasted it and the forced exit was 1.
  const env = cleanEnv({
    ASSAY_DATA_DIR: dataDir,
    LOG_LEVEL: "info",
    ASSAY_SHUTDOWN_GRACE_MS: "0",
    ASSAY_KILL_GRACE_MS: "0",
  });
  const child = spawnCli(["worker"], env);
  const out = watch(child);
  const done = collect(child);
  try {
    await out.waitFor(/waiting for process/);
    child.kill("SIGTERM");
    const exit = await done;
    assert.equal(exit.code, 0, `${exit.code} ${exit.signal}\n${exit.stdout.slice(-1500)}\n${exit.stderr}`);
    assert.match(exit.stdout, /"msg":"stopped"/);
    assert.doesNotMatch(exit.stdout, /initialising|listening|forced/);
    assert.equal(fs.existsSync(path.join(dataDir, "pg")), false, "no cluster made");
    assert.equal(
      fs.readFileSync(path.join(dataDir, "pg.lock"), "utf8"),
      String(holder.pid),
      "the holder's lock kept",
    );
  } finally {
    child.kill("SIGKILL");
    holder.kill("SIGKILL");
  }
});

/** A running initdb that initialises `clusterDir`, if any: its pid and its password file. */
function initdbOf(clusterDir: string): { pid: number; pwfile: string } | undefined {
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const argv = fs.readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
      if (path.basename(argv[0] ?? "") === "initdb" && argv.includes(`--pgdata=${clusterDir}`)) {
        const pwfile = argv.find((a) => a.startsWith("--pwfile="))?.slice("--pwfile=".length) ?? "";
        return { pid: Number(entry), pwfile };
      }
    } catch {
      // Ended meanwhile.
    }
  }
  return undefined;
}

/** Polls `probe` every 10 ms until it returns something other than undefined (at most `ms`). */
async function until<T>(ms: number, what: string, probe: () => T | undefined): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`no ${what} within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** The cluster directory of `dataDir`: `dataDir/pg`, or as root the folder its symlink names. */
function clusterOf(dataDir: string): string | undefined {
  const pg = path.join(dataDir, "pg");
  try {
    return fs.lstatSync(pg).isSymbolicLink() ? fs.readlinkSync(pg) : pg;
  } catch {
    return undefined;
  }
}

test("a first start SIGKILLed during initdb: the next start uses the cluster initdb finished", async () => {
  const dataDir = path.join(home, "killed-initdb ünï");
  const env = cleanEnv({ ASSAY_DATA_DIR: dataDir });
  const first = spawnCli(["migrate"], env);
  const firstDone = collect(first);
  let initdb: { pid: number; pwfile: string } | undefined;
  try {
    initdb = await until(60_000, "initdb", () => {
      const cluster = clusterOf(dataDir);
      return cluster === undefined ? undefined : initdbOf(cluster);
    });
    first.kill("SIGKILL"); // the OOM killer, a supervisor's kill: initdb, its child, runs on
    await firstDone;
    const running = initdb.pid;
    await until(60_000, "initdb's end", () => (alive(running) ? undefined : true));
    // Before the fix the password was written after initdb, so never: every later start failed with
    // "ENOENT: no such file or directory, open '…/pg.password'".
    const second = await collect(spawnCli(["migrate"], env));
    assert.equal(second.code, 0, second.stderr);
    assert.match(second.stdout, /applied \d+ migrations: the database has all \d+/);
  } finally {
    first.kill("SIGKILL");
    if (initdb !== undefined && alive(initdb.pid)) process.kill(initdb.pid, "SIGKILL");
    // The killed start could not remove initdb's password file.
    if (initdb?.pwfile) fs.rmSync(initdb.pwfile, { force: true });
  }
});

test("as root, a data dir whose cluster under /var/lib/assay-embedded was removed starts afresh", {
  skip: process.getuid?.() !== 0 && "only root keeps the cluster apart from the data dir",
}, async () => {
  const dataDir = path.join(home, "cluster-removed");
  const env = cleanEnv({ ASSAY_DATA_DIR: dataDir });
  const first = await collect(spawnCli(["migrate"], env));
  assert.equal(first.code, 0, first.stderr);
  const cluster = clusterOf(dataDir) ?? "";
  assert.ok(cluster.startsWith("/var/lib/assay-embedded/clusters/"), cluster);
  // A new machine or container that kept the data dir (with its symlink), not /var/lib.
  fs.rmSync(cluster, { recursive: true, force: true });
  // Before the fix initdb, as postgres, could not create it there: "Permission denied", every start.
  const second = await collect(spawnCli(["migrate"], env));
  assert.equal(second.code, 0, second.stderr);
  assert.match(second.stdout, /applied \d+ migrations: the database has all \d+/);
  assert.equal(clusterOf(dataDir), cluster, "the same symlink, its cluster made again");
});

test("a cluster without its password file (left by a start killed during initdb before the fix) says what to remove", async () => {
  const dataDir = path.join(home, "no-password");
  const env = cleanEnv({ ASSAY_DATA_DIR: dataDir });
  const first = await collect(spawnCli(["migrate"], env));
  assert.equal(first.code, 0, first.stderr);
  fs.rmSync(path.join(dataDir, "pg.password"));
  const res = await collect(spawnCli(["migrate"], env));
  assert.equal(res.code, 1, res.stderr);
  // Before: only "ENOENT: no such file or directory, open '…/pg.password'".
  assert.match(
    res.stderr,
    /^assay: the embedded cluster in \S+ has no password file \(\S+\/pg\.password\), so nothing can connect to it \(a first start killed during initdb left it so, or the file was removed\): remove \S+( and \S+)? to start afresh\n/,
  );
});
