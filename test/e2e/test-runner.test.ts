// test/run.ts itself (what `make test` runs): interrupted while it starts, it leaves nothing running
// and nothing on disk — not its embedded PostgreSQL, which runs detached and so outlived a runner
// ended by Ctrl-C, nor (as root) that server's cluster under /var/lib/assay-embedded/clusters.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { isAlive } from "../../src/proc.ts";
import { cleanEnv, collect, ROOT, removeWithClusters } from "../helpers/cli.ts";
import { waitFor } from "../helpers/queue.ts";

test("test/run.ts interrupted while it starts: its embedded PostgreSQL is stopped and its cluster removed", async () => {
  // The runner's scratch folder lands in here (as root, readable by the `postgres` user: initdb reads
  // its password file from the temporary folder).
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "assay-run-interrupt-"));
  fs.chmodSync(tmp, 0o755);
  const env = cleanEnv({ TMPDIR: tmp });
  delete env.NODE_TEST_CONTEXT; // a runner of its own, not a part of this one
  const runner = spawn(process.execPath, ["--import", "tsx", "test/run.ts", "test/unit/config.test.ts"], {
    cwd: ROOT,
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  const done = collect(runner);
  let postmaster: number | undefined;
  let cluster: string | undefined;
  try {
    // Its embedded server is up once the server's owner file is written (src/db/embedded.ts).
    const scratch = await waitFor(
      async () => {
        const name = fs.readdirSync(tmp).find((n) => n.startsWith("assay-test-"));
        return name && fs.existsSync(path.join(tmp, name, "pg.owner")) ? path.join(tmp, name) : undefined;
      },
      60_000,
      "the runner's embedded PostgreSQL to start",
    );
    cluster = fs.realpathSync(path.join(scratch, "pg"));
    postmaster = Number(fs.readFileSync(path.join(cluster, "postmaster.pid"), "utf8").split("\n")[0]);
    assert.ok(isAlive(postmaster), "the runner's PostgreSQL runs");
    runner.kill("SIGINT");
    const exit = await done;
    assert.notEqual(exit.code, 0, `an interrupted run fails:\n${exit.stderr}`);
    assert.equal(isAlive(postmaster), false, "the runner stopped its PostgreSQL before it exited");
    assert.equal(fs.existsSync(cluster), false, `the cluster ${cluster} is removed`);
    assert.deepEqual(
      fs.readdirSync(tmp).filter((n) => n.startsWith("assay-")),
      [],
      "the runner's scratch folder is removed (tsx keeps its cache beside it)",
    );
  } finally {
    runner.kill("SIGKILL");
    await done;
    // What a failed run left: its server stopped, then its cluster removed with the folder.
    if (postmaster && isAlive(postmaster)) {
      process.kill(postmaster, "SIGINT");
      await waitFor(async () => !isAlive(postmaster as number), 30_000, "the left PostgreSQL to stop");
    }
    removeWithClusters(tmp);
    if (cluster) fs.rmSync(cluster, { recursive: true, force: true });
  }
});
