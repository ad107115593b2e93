// A signal while `assay all` is still starting its worker (after the API listens): start-up stops there.
// Before, the worker started anyway — registered, listened and claimed queued runs — only to be stopped
// right after by the shutdown that had begun before it.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { machineTag } from "../../src/runner/workdir.ts";
import { cleanEnv, collect, spawnCli, watch } from "../helpers/cli.ts";
import { runnerEnv } from "../helpers/runner.ts";

/** Files in a dead worker's scratch folder: removing them holds start-up ~0.25 s (the signal takes ~5 ms). */
const LEFTOVER_FILES = 10_000;

test("SIGTERM while assay all starts its worker: no worker starts, nothing is claimed, exit 0", async () => {
  const own = await runnerEnv();
  try {
    const taskId = await own.task("summary", [await own.file("a,b\n1,2\n3,4\n")], {});
    // A scratch folder of a worker of this machine that is gone (a pid that has exited): the worker's
    // start removes it before it registers, which holds start-up there long enough to be signalled.
    const dead = spawn(process.execPath, ["-e", ""]);
    await once(dead, "exit");
    const leftover = path.join(own.dataDir, "work", `${machineTag()}.${dead.pid}.0badf00d`);
    fs.mkdirSync(path.join(leftover, "déjà vu"), { recursive: true });
    for (let i = 0; i < LEFTOVER_FILES; i++)
      fs.writeFileSync(path.join(leftover, "déjà vu", `${i}.json`), "");

    const child = spawnCli(
      ["all", "--dev-token"],
      cleanEnv({
        DATABASE_URL: own.db.url,
        ASSAY_DATA_DIR: own.dataDir,
        PORT: "0",
        LOG_LEVEL: "info",
        ASSAY_POLL_INTERVAL_MS: "100",
      }),
    );
    const out = watch(child);
    const exited = collect(child);
    await out.waitFor(/Server listening at/, 30_000);
    assert.ok(fs.existsSync(leftover), "signalled while the leftover is being removed");
    child.kill("SIGTERM");
    const exit = await exited;
    assert.equal(exit.code, 0, exit.stderr);
    assert.match(exit.stdout, /"msg":"stopped"/);
    assert.doesNotMatch(exit.stdout, /"msg":"worker started"/);
    assert.doesNotMatch(exit.stdout, /Development token/, "start-up did not go on to the dev token");
    const [run] = await own.db.sql`select status, attempt, lease_owner from runs where task_id = ${taskId}`;
    assert.deepEqual({ ...run }, { status: "queued", attempt: 0, lease_owner: null });
    assert.equal((await own.db.sql`select id from workers`).length, 0, "no worker row");
    // The scratch folder start-up had made was removed again.
    assert.deepEqual(
      fs.readdirSync(path.join(own.dataDir, "work")).filter((n) => !n.endsWith(".0badf00d")),
      [],
    );
  } finally {
    await own.close();
  }
});

/**
 * The signals process `pid` catches (its SigCgt mask in /proc), as bits: signal n is bit n - 1. Node
 * catches SIGINT and SIGTERM itself from its start (to restore the terminal, then dies by them),
 * listener or not; nothing but a listener catches SIGQUIT; close-with-grace (the server's shutdown)
 * catches SIGILL too, which bin/assay.js's hold does not.
 */
function caught(pid: number): bigint {
  let status: string;
  try {
    status = fs.readFileSync(`/proc/${pid}/status`, "latin1");
  } catch {
    return 0n;
  }
  const mask = /^SigCgt:\s*([0-9a-f]+)$/m.exec(status)?.[1];
  return mask === undefined ? 0n : BigInt(`0x${mask}`);
}
const SIGQUIT_BIT = 1n << 2n;
const SIGILL_BIT = 1n << 3n;

test("SIGTERM while a server command loads its modules is held and ends the start: exit 0, not 143", {
  skip: process.platform !== "linux",
}, async () => {
  // Until 2026-12-07 a stop signal in the first ~0.2 s (the modules loading, before the server's
  // handlers were installed) killed the process by Node's default action (exit 143).
  const own = await runnerEnv();
  try {
    const child = spawnCli(
      ["worker"],
      cleanEnv({ DATABASE_URL: own.db.url, ASSAY_DATA_DIR: own.dataDir, LOG_LEVEL: "info" }),
    );
    const exited = collect(child);
    const pid = child.pid as number;
    // The first listener for stop signals is bin/assay.js's hold, installed before the modules load
    // (after the re-exec with the server's Node flags, which keeps the pid); close-with-grace's comes
    // ~0.2 s later. Signalled in between: without the hold, Node's default action (exit 143).
    const deadline = performance.now() + 30_000;
    let mask = caught(pid);
    while ((mask & SIGQUIT_BIT) === 0n) {
      assert.ok(performance.now() < deadline, "the worker never listened for stop signals");
      await new Promise((r) => setImmediate(r));
      mask = caught(pid);
    }
    child.kill("SIGTERM");
    assert.equal(
      mask & SIGILL_BIT,
      0n,
      `signalled before the server's own handlers (mask ${mask.toString(16)})`,
    );
    const exit = await exited;
    assert.equal(exit.code, 0, `${exit.signal ?? ""} ${exit.stderr}`);
    // Held and sent again once the server listens (logged), or still undelivered when it did.
    assert.match(exit.stdout, /"msg":"stopped"/);
    assert.doesNotMatch(exit.stdout, /"msg":"worker started"/);
    assert.equal((await own.db.sql`select id from workers`).length, 0, "no worker row");
  } finally {
    await own.close();
  }
});
