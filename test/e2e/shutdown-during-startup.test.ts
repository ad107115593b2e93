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
