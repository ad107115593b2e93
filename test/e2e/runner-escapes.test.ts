// Programs that start a process which leaves their process group (its own session, as setsid or a
// daemon's double fork does) and keeps their stdout and stderr open: the group kill at the leader's
// exit cannot reach it, so `close` never comes on its own. The run must settle all the same, a bounded
// wait after the leader's exit — with an abort or a timeout in that wait reported — and, through a
// worker, the escaped process is found by the attempt's HOME and killed.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { outcomeOf } from "../../src/runner/handler.ts";
import { MIN_DRAIN_MS, type ProcessResult, runProcess } from "../../src/runner/run-process.ts";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";
import { alive, fixtureProgram, runnerEnv } from "../helpers/runner.ts";

/**
 * The analysis: starts a process in a session of its own that inherits its stdout and stderr and lives
 * for ever, says `leader <pid> escaped <pid>`, writes its result (unless `--params` says
 * `{"result": false}`) and exits 0.
 */
const ESCAPING = `
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
const arg = (name) => process.argv[process.argv.indexOf(name) + 1];
const params = JSON.parse(arg("--params"));
const say = (e) => process.stdout.write(JSON.stringify(e) + "\\n");
// detached: setsid() before exec, so when spawn returns the process has left this group.
const escaped = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], {
  detached: true,
  stdio: ["ignore", "inherit", "inherit"],
});
escaped.unref();
say({ type: "progress", percent: 50, message: "leader " + process.pid + " escaped " + escaped.pid });
if (params.result !== false) {
  fs.writeFileSync(path.join(arg("--output-dir"), "out.json"), "{}");
  say({ type: "result", outputFileName: "out.json", metrics: {} });
}
`;

let scratch: string;
let script: string;
const escapees: number[] = [];
before(() => {
  scratch = fs.mkdtempSync(path.join(os.tmpdir(), "assay-escapes-"));
  script = path.join(scratch, "escaping.mjs");
  fs.writeFileSync(script, ESCAPING);
});
after(() => {
  for (const pid of escapees) if (alive(pid)) process.kill(pid, "SIGKILL");
  fs.rmSync(scratch, { recursive: true, force: true });
});

/** The pids a run's first progress message named. */
const pids = (message: string | undefined) => {
  const m = /leader (\d+) escaped (\d+)/.exec(message ?? "");
  assert.ok(m, `the program said who it is: ${message}`);
  const found = { leader: Number(m[1]), escaped: Number(m[2]) };
  escapees.push(found.escaped);
  return found;
};

/** `promise`, or a failure after `ms` (a runner that never settles must fail the test, not hang it). */
function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not settle within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** Runs the escaping program with runProcess; `onPids` is told the pids once it has spoken. */
function runEscaping(
  o: {
    signal?: AbortSignal;
    killGraceMs: number;
    timeoutMs?: number;
    result?: boolean;
    marker?: boolean;
  },
  onPids?: (p: { leader: number; escaped: number }) => void,
): { done: Promise<ProcessResult>; home: string } {
  const home = fs.mkdtempSync(path.join(scratch, "home-"));
  const out = fs.mkdtempSync(path.join(scratch, "out-"));
  const done = runProcess(
    {
      executable: process.execPath,
      args: [
        script,
        "--input",
        script,
        "--output-dir",
        out,
        "--params",
        JSON.stringify({ result: o.result }),
      ],
      cwd: scratch,
      env: { PATH: process.env.PATH ?? "", HOME: home },
    },
    o.signal ?? new AbortController().signal,
    {
      killGraceMs: o.killGraceMs,
      ...(o.timeoutMs === undefined ? {} : { timeoutMs: o.timeoutMs }),
      ...(o.marker ? { marker: `HOME=${home}` } : {}),
    },
    (p) => onPids?.(pids(p.message)),
  );
  return { done, home };
}

test("a process that left the group holds stdout and stderr: the run settles a grace after the leader's exit, with that exit", async () => {
  let seen: { leader: number; escaped: number } | undefined;
  const { done } = runEscaping({ killGraceMs: 300 }, (p) => {
    seen = p;
  });
  const r = await within(done, 20_000, "the run");
  assert.ok(seen);
  // The leader exited 0 with its result: that stands (the output check decides the rest).
  assert.equal(r.exitCode, 0);
  assert.equal(r.signal, null);
  assert.deepEqual(r.result, { type: "result", outputFileName: "out.json", metrics: {} });
  assert.equal(r.protocolError, undefined);
  assert.equal(r.outputHeld, true, "the output was still open when the wait ended");
  assert.equal(r.timedOut, false);
  assert.equal(r.isCanceled, false);
  assert.ok(r.durationMs >= MIN_DRAIN_MS, `it waited for the pipes first (${r.durationMs} ms)`);
  // But a process it started outlived it, holding its output: the run fails, its outputs unkept.
  assert.deepEqual(
    { ...outcomeOf(r, { ok: true }), result: undefined },
    {
      status: "failed",
      errorCode: "ANALYSIS_PROCESS_FAILED",
      errorMessage: "a process the program started outlived it, holding its output",
      transient: false,
      result: undefined,
    },
  );
  // Without a marker nothing can find it: it lives on (killed by this test's `after`).
  assert.ok(alive(seen.escaped));
});

test("an abort after the leader's exit changes nothing, and the run settles without the pipes closing", async () => {
  const ac = new AbortController();
  let seen: { leader: number; escaped: number } | undefined;
  // A long grace: the abort comes while the runner still waits for the pipes after the exit.
  const { done } = runEscaping({ signal: ac.signal, killGraceMs: 2500, result: false, marker: true }, (p) => {
    seen = p;
  });
  await waitFor(async () => seen && !alive(seen.leader), 20_000, "the leader to exit");
  ac.abort("cancel");
  const r = await within(done, 20_000, "the run");
  // What the leader did stands: it exited before the abort.
  assert.equal(r.isCanceled, false);
  assert.equal(r.exitCode, 0, "the exit as it was");
  assert.equal(r.outputHeld, true);
  assert.notEqual(outcomeOf(r).status, "cancelled");
  // Found by the marker (its HOME) and killed.
  await waitFor(async () => !alive(seen?.escaped as number), 10_000, "the escaped process to be killed");
});

test("a timeout after the leader's exit changes nothing, and the run settles without the pipes closing", async () => {
  let seen: { leader: number; escaped: number } | undefined;
  const { done } = runEscaping({ killGraceMs: 5000, timeoutMs: 3000, result: false, marker: true }, (p) => {
    seen = p;
  });
  const r = await within(done, 20_000, "the run");
  assert.ok(seen);
  assert.equal(r.timedOut, false, "the leader had exited: what it did stands");
  assert.equal(r.exitCode, 0);
  assert.equal(r.outputHeld, true);
  assert.notEqual(outcomeOf(r).status, "timed_out");
  await waitFor(async () => !alive(seen?.escaped as number), 10_000, "the escaped process to be killed");
});

test("through a worker: the run is recorded, the escaped process is killed and the worker stops", async () => {
  const env = await runnerEnv();
  try {
    const type = "escaping";
    const w = env.worker([fixtureProgram(type, { script, cwd: scratch })], { killGraceMs: 500 });
    const taskId = await env.task(type, [await env.file("a\n1\n")], {});
    await w.start();
    const [event] = await waitFor(async () => {
      const rows = await env.db
        .sql`select data from task_events where task_id = ${taskId} and type = 'run.progress'`;
      return rows.length > 0 ? rows : undefined;
    });
    const { escaped } = pids(event?.data.message);
    const task = await waitForTerminal(env.db.sql, taskId, 30_000);
    // The slot was freed and nothing is left running: the worker stops in bounded time.
    await within(w.stop(), 20_000, "Worker.stop()");
    // The program exited 0 with a valid result, but left a process holding its output: it failed, and
    // nothing it wrote was kept (the holder was killed before the outputs were looked at).
    assert.equal(task.status, "failed");
    const [run] = await env.db
      .sql`select id::float8, error_code, output_key from runs where task_id = ${taskId}`;
    assert.equal(run?.error_code, "ANALYSIS_PROCESS_FAILED");
    assert.equal(run?.output_key, null);
    await waitFor(async () => !alive(escaped), 10_000, "the escaped process to be killed");
  } finally {
    // Stops its workers too: bounded, since a worker whose attempt never settles never stops.
    await within(env.close(), 30_000, "closing the worker and the database");
  }
});
