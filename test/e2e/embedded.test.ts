// The two-command promise: with no DATABASE_URL, `assay all` starts an embedded PostgreSQL from a
// data directory only its owner can read, migrates it, serves, and leaves nothing running on SIGINT.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { freePort } from "../../src/db/embedded.ts";
import { cleanEnv, collect, spawnCli, watch } from "../helpers/cli.ts";

const home = fs.mkdtempSync(path.join(os.tmpdir(), "assay-embedded-")); // mode 0700: only its owner reads it
after(() => fs.rmSync(home, { recursive: true, force: true }));

function postmasterPid(dataDir: string): number | undefined {
  try {
    return Number(fs.readFileSync(path.join(dataDir, "pg", "postmaster.pid"), "utf8").split("\n")[0]);
  } catch {
    return undefined;
  }
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

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
