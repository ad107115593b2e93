// A program the worker cannot start because the worker is out of open files (EMFILE: a burst of runs,
// uploads and downloads against a low `ulimit -n`) is the worker's shortage at that moment, not a
// broken program: the run is retried (ANALYSIS_PROCESS_START_FAILED, transient), not failed for good.
// Real processes: this test process lowers its own limit (`prlimit`), takes every descriptor left, and
// runs the handler of a claimed run.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import { decide } from "../../src/queue/outcomes.ts";
import { runClaim } from "../../src/queue/sql.ts";
import type { HandlerContext } from "../../src/queue/worker.ts";
import { processHandler } from "../../src/runner/handler.ts";
import { idsCrossPowerOfTen } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";

let env: RunnerEnv;
before(async () => {
  env = await runnerEnv();
  await idsCrossPowerOfTen(env.db.sql, "runs", 1);
});
after(() => env.close());

const hasPrlimit = (() => {
  try {
    execFileSync("prlimit", ["--version"]);
    return true;
  } catch {
    return false;
  }
})();

/** Runs `fn` with every file descriptor this process may open taken (the limit lowered to `limit`). */
async function withoutDescriptors<T>(limit: number, fn: () => Promise<T>): Promise<T> {
  const [soft, hard] = execFileSync("prlimit", [
    "--pid",
    String(process.pid),
    "--nofile",
    "--noheadings",
    "--raw",
    "-o",
    "SOFT,HARD",
  ])
    .toString()
    .trim()
    .split(/\s+/);
  execFileSync("prlimit", ["--pid", String(process.pid), `--nofile=${limit}:${hard}`]);
  const taken: number[] = [];
  try {
    try {
      for (;;) taken.push(fs.openSync("/dev/null", "r"));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EMFILE") throw err;
    }
    return await fn();
  } finally {
    for (const fd of taken) fs.closeSync(fd);
    execFileSync("prlimit", ["--pid", String(process.pid), `--nofile=${soft}:${hard}`]);
  }
}

test("a program that cannot be started for want of open files (EMFILE) → a transient failure, retried", {
  skip: hasPrlimit ? false : "prlimit is not installed",
}, async () => {
  const type = "spawn-émfile";
  const handler = processHandler(fixtureProgram(type), {
    store: env.storage,
    workDir: path.join(env.dataDir, "work"),
    killGraceMs: 500,
  });
  const input = await env.file("a,b\n1,2\n");
  await env.task(type, [input], { mode: "ok" }, 3);
  const [run] = await runClaim(env.db.sql, {
    workerId: "spawn-shortage-test",
    analysisType: type,
    limit: 1,
    globalLimit: 0,
    leaseTtlMs: 30_000,
  });
  assert.ok(run, "claimed");
  const ctx: HandlerContext = {
    signal: new AbortController().signal,
    reportProgress: () => {},
    releaseSlot: () => {},
    finishing: () => {},
  };
  const outcome = await withoutDescriptors(256, () => handler(run, ctx));
  assert.ok(outcome.status === "failed", JSON.stringify(outcome));
  assert.equal(outcome.errorCode, "ANALYSIS_PROCESS_START_FAILED");
  assert.equal(outcome.errorMessage, "the program could not be started (EMFILE)");
  assert.equal(outcome.transient, true);
  assert.equal(decide(run, undefined, outcome, 50).kind, "retry");
});
