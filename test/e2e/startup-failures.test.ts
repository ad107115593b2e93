// `assay worker | api | all` when start-up fails: the process says why and exits non-zero by itself
// (a supervisor's restart must fire), instead of idling forever on what it had opened.
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { once } from "node:events";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import postgres from "postgres";
import { cleanEnv, exitWithin as exitWithinMs, spawnCli, watch } from "../helpers/cli.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { runnerEnv } from "../helpers/runner.ts";

/**
 * Well above a failed start's own time (a second or two) and below the 30 s after which cli.ts exits
 * a failed command whatever is still open: a process still running at this bound hangs.
 */
const EXIT_BOUND_MS = 20_000;

let home: string;
let db: TestDatabase;
before(async () => {
  home = fs.mkdtempSync(path.join(os.tmpdir(), "assay-startup-"));
  db = await createTestDatabase();
});
after(async () => {
  await db.drop();
  fs.rmSync(home, { recursive: true, force: true });
});

const exitWithin = (child: ChildProcess, what: string) => exitWithinMs(child, EXIT_BOUND_MS, what);

/** An empty database (no migrations applied), dropped after the test. */
async function unmigratedDatabase(): Promise<{ url: string; drop(): Promise<void> }> {
  const adminUrl = process.env.ASSAY_TEST_ADMIN_URL as string;
  const name = `assay_unmigrated_${randomBytes(5).toString("hex")}`;
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    await admin`create database ${admin(name)}`;
  } finally {
    await admin.end({ timeout: 5 });
  }
  const u = new URL(adminUrl);
  u.pathname = `/${name}`;
  return {
    url: u.toString(),
    drop: async () => {
      const a = postgres(adminUrl, { max: 1, onnotice: () => {} });
      try {
        await a`drop database if exists ${a(name)} with (force)`;
      } finally {
        await a.end({ timeout: 5 });
      }
    },
  };
}

test("assay worker and assay all against an unmigrated database exit 1, saying to migrate", async () => {
  const empty = await unmigratedDatabase();
  try {
    for (const mode of ["worker", "all"]) {
      const dataDir = fs.mkdtempSync(path.join(home, "unmigrated-"));
      const child = spawnCli(
        [mode],
        cleanEnv({ DATABASE_URL: empty.url, ASSAY_DATA_DIR: dataDir, PORT: "0", LOG_LEVEL: "info" }),
      );
      const exit = await exitWithin(child, `assay ${mode}`);
      assert.equal(exit.code, 1, `${mode}: ${exit.stderr}`);
      assert.match(exit.stderr, /not migrated.*assay migrate/, mode);
      assert.match(exit.stderr, /relation "\w+" does not exist \(SQLSTATE 42P01\)/, mode);
      // The worker's scratch folder went with it (the group guard was closed too, or it would not exit).
      assert.deepEqual(fs.readdirSync(path.join(dataDir, "work")), [], mode);
    }
  } finally {
    await empty.drop();
  }
});

test("ASSAY_DATA_DIR under a regular file: exits 1 at once, naming the folder, instead of waiting for it", async () => {
  const file = path.join(home, "a-file");
  fs.writeFileSync(file, "not a folder");
  const dataDir = path.join(file, "data");
  for (const mode of ["worker", "api"]) {
    const child = spawnCli(
      [mode],
      cleanEnv({ DATABASE_URL: db.url, ASSAY_DATA_DIR: dataDir, PORT: "0", LOG_LEVEL: "info" }),
    );
    const exit = await exitWithin(child, `assay ${mode}`);
    assert.equal(exit.code, 1, `${mode}: ${exit.stderr}`);
    assert.match(exit.stderr, /ASSAY_DATA_DIR cannot hold the stored files/, mode);
    assert.ok(exit.stderr.includes(`ENOTDIR: not a directory, mkdir '${dataDir}'`), exit.stderr);
    assert.doesNotMatch(exit.stdout, /object store unreachable; waiting/, mode);
  }
});

test("SIGTERM while start-up waits for a database that does not answer: exits 0 at once, not after the connect timeout", async () => {
  // A database host that takes the connection and never answers (a hung server, a proxy whose
  // backend is gone): start-up waits for it (each probe gives up after 10 s, then another; a signal
  // between probes: db-connect-faults.test.ts). The shutdown used to wait for postgres.js's connect
  // timeouts (30 s each) and the API was killed by its shutdown bound (46 s, exit 1).
  const sockets = new Set<net.Socket>();
  let accepted = 0;
  let connected: () => void = () => {};
  const silent = net.createServer((socket) => {
    sockets.add(socket);
    socket.on("error", () => {});
    socket.on("close", () => sockets.delete(socket));
    accepted++;
    connected();
  });
  silent.listen(0, "127.0.0.1");
  await once(silent, "listening");
  const { port } = silent.address() as net.AddressInfo;
  try {
    // Signalled at the first connection (the worker's probe of the database; the API's caches'
    // LISTEN or its pool's first): start-up is waiting for it.
    for (const [mode, connections] of [
      ["api", 1],
      ["worker", 1],
      ["all", 1],
    ] as const) {
      const dataDir = fs.mkdtempSync(path.join(home, "silent-db-"));
      accepted = 0;
      const reached = new Promise<void>((resolve) => {
        connected = () => {
          if (accepted >= connections) resolve();
        };
      });
      const child = spawnCli(
        [mode],
        cleanEnv({
          DATABASE_URL: `postgres://assay:pw@127.0.0.1:${port}/assay_ünï`,
          ASSAY_DATA_DIR: dataDir,
          PORT: "0",
          LOG_LEVEL: "info",
          // A misspelt setting (the _MS left out) is named in a warning, not ignored without a word.
          ASSAY_SHUTDOWN_GRACE: "60000",
        }),
      );
      const out = watch(child);
      const exited = exitWithin(child, `assay ${mode}`);
      await reached; // start-up is waiting for the database
      child.kill("SIGTERM");
      const t0 = Date.now();
      await out.waitFor(/"msg":"shutting down"/);
      const exit = await exited;
      const took = Date.now() - t0;
      const what = `${mode} signalled at connection ${connections}`;
      assert.equal(exit.code, 0, `${what}: ${exit.stderr}\n${exit.stdout.slice(-2000)}`);
      assert.match(exit.stdout, /"msg":"stopped"/, what);
      assert.match(
        exit.stdout,
        /"level":40,.*"variable":"ASSAY_SHUTDOWN_GRACE","didYouMean":"ASSAY_SHUTDOWN_GRACE_MS","msg":"unknown ASSAY_ variable ignored/,
        what,
      );
      assert.ok(took < 10_000, `${what} took ${took} ms to stop`);
      for (const s of sockets) s.destroy();
    }
  } finally {
    for (const s of sockets) s.destroy();
    silent.close();
  }
});

test("a port that is taken fails assay worker and assay all before they claim anything", async () => {
  // Listening came after the worker's start: a worker whose port was taken had claimed and started the
  // queued runs by then, and ran them for its shutdown grace before it gave them back and exited 1 —
  // again on every restart by its supervisor.
  const own = await runnerEnv();
  const taken = net.createServer();
  taken.listen(0, "127.0.0.1");
  await once(taken, "listening");
  const { port } = taken.address() as net.AddressInfo;
  try {
    const taskId = await own.task("summary", [await own.file("a,b\n1,2\n3,4\n")], {});
    for (const [mode, portEnv] of [
      ["worker", { ASSAY_METRICS_PORT: String(port) }],
      ["all", { PORT: String(port) }],
    ] as const) {
      const child = spawnCli(
        [mode],
        cleanEnv({
          DATABASE_URL: own.db.url,
          ASSAY_DATA_DIR: own.dataDir,
          LOG_LEVEL: "info",
          ASSAY_POLL_INTERVAL_MS: "100",
          ...portEnv,
        }),
      );
      const exit = await exitWithin(child, `assay ${mode}`);
      assert.equal(exit.code, 1, `${mode}: ${exit.stderr}`);
      assert.match(exit.stderr, /EADDRINUSE/, mode);
      // Said as what to do, naming the setting.
      const variable = mode === "worker" ? "ASSAY_METRICS_PORT" : "PORT";
      assert.match(
        exit.stderr,
        new RegExp(
          `assay: port ${port} on 127\\.0\\.0\\.1 is taken: stop what listens there, or set ${variable} to another port`,
        ),
        mode,
      );
      // 0 picks a free port for PORT only: ASSAY_METRICS_PORT=0 turns the worker's /metrics off (the
      // advice did that until 2026-12-07).
      if (mode === "worker") assert.doesNotMatch(exit.stderr, /0 picks a free one/, mode);
      else assert.match(exit.stderr, /to another port \(0 picks a free one\)/, mode);
      assert.doesNotMatch(exit.stdout, /"msg":"worker started"/, mode);
      const [run] = await own.db.sql`select status, attempt, started_at from runs where task_id = ${taskId}`;
      assert.deepEqual({ ...run }, { status: "queued", attempt: 0, started_at: null }, mode);
    }
  } finally {
    taken.close();
    await own.close();
  }
});

test("an S3 store the AWS SDK finds no region for: exits 1 at once, naming ASSAY_S3_REGION, instead of waiting for it", async () => {
  const { createTestBucket } = await import("../helpers/s3.ts");
  const bucket = await createTestBucket();
  try {
    for (const mode of ["worker", "api"]) {
      const env = cleanEnv({
        DATABASE_URL: db.url,
        ASSAY_DATA_DIR: path.join(home, `no-region-${mode}`),
        PORT: "0",
        LOG_LEVEL: "info",
        ...bucket.env,
        // Nowhere to find a region: no variable, no ~/.aws/config.
        HOME: home,
        AWS_CONFIG_FILE: path.join(home, "no-such-aws-config"),
      });
      delete env.AWS_REGION;
      delete env.AWS_DEFAULT_REGION;
      const exit = await exitWithin(spawnCli([mode], env), `assay ${mode}`);
      assert.equal(exit.code, 1, `${mode}: ${exit.stderr}`);
      assert.match(exit.stderr, /the AWS SDK found no region: set ASSAY_S3_REGION \(or AWS_REGION\)/, mode);
      assert.doesNotMatch(exit.stdout, /object store unreachable; waiting/, mode);
    }
  } finally {
    await bucket.drop();
  }
});
