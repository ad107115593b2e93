// The two-command promise: with no DATABASE_URL, `assay all` starts an embedded PostgreSQL from a
// data directory only its owner can read, migrates it, serves, and leaves nothing running on SIGINT.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
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
