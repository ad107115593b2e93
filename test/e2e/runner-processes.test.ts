// Worker processes running real analysis processes: a crash mid-run and a rolling restart.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";
import { alive, type RunnerEnv, runnerEnv, runOutputDir, strayOutputs } from "../helpers/runner.ts";
import {
  createExecutionsTable,
  startWorkerProcess,
  type WorkerProcess,
  type WorkerSpec,
} from "../helpers/workers.ts";

let env: RunnerEnv;
const procs: WorkerProcess[] = [];
before(async () => {
  env = await runnerEnv();
  await createExecutionsTable(env.db.sql);
});
after(async () => {
  for (const p of procs) p.child.kill("SIGKILL");
  await Promise.all(procs.map((p) => p.exited));
  await env.close();
});

async function start(spec: WorkerSpec) {
  const p = await startWorkerProcess(env.db.url, { ...spec, dataDir: env.dataDir });
  procs.push(p);
  return p;
}

/** A rolling restart's step: a new worker joins, then the old one gets SIGTERM and exits 0 by itself. */
async function replace(old: Awaited<ReturnType<typeof start>>, spec: WorkerSpec) {
  const replacement = await start(spec);
  old.child.kill("SIGTERM");
  assert.equal(await old.exited, 0, "a worker exits 0 by itself after SIGTERM");
  assert.ok(replacement.id);
}

test("a worker killed mid-run: its analysis dies with it, the lease expires, another worker finishes it, no tmp dir is left", async () => {
  const file = await env.file("a\n1\n");
  // The first attempt would sleep a minute: only the group guard can end it in time.
  const once = path.join(env.dataDir, "crash-once");
  const taskId = await env.task("proc-crash", [file], { mode: "sleep", ms: 60_000, thenMs: 300, once }, 2);
  const victim = await start({
    types: { "proc-crash": { sleepMs: 0, program: true } },
    concurrency: 1,
    leaseTtlMs: 1000,
    reapIntervalMs: 200,
  });
  await waitFor(
    async () =>
      (await env.db.sql`select 1 from runs where task_id = ${taskId} and status = 'running'`).length > 0,
  );
  const orphan = await waitFor(async () =>
    fs.existsSync(once) ? Number(fs.readFileSync(once, "utf8")) : undefined,
  );
  assert.ok(alive(orphan));
  victim.child.kill("SIGKILL");
  await victim.exited;
  await waitFor(async () => !alive(orphan), 10_000, "the killed worker's analysis to die");
  const survivor = await start({
    types: { "proc-crash": { sleepMs: 0, program: true } },
    concurrency: 1,
    leaseTtlMs: 1000,
    reapIntervalMs: 200,
  });
  const task = await waitForTerminal(env.db.sql, taskId, 30_000);
  survivor.child.kill("SIGTERM");
  await survivor.exited;
  assert.equal(task.status, "succeeded");
  const [run] = await env.db.sql`select id::float8, attempt from runs where task_id = ${taskId}`;
  assert.equal(run?.attempt, 2);
  // The killed attempt's folder went when the second attempt's success was recorded.
  assert.deepEqual(await strayOutputs(env), []);
  assert.ok(fs.existsSync(path.join(await runOutputDir(env, run?.id), "out.json")));
});

test("a rolling restart with runs in flight: none lost, none failed, no attempt spent", async () => {
  const files = await Promise.all(Array.from({ length: 6 }, (_, i) => env.file(`a\n${i}\n`)));
  const spec: WorkerSpec = {
    types: { "proc-roll": { sleepMs: 0, program: true } },
    concurrency: 2,
    leaseTtlMs: 5000,
    reapIntervalMs: 500,
    graceMs: 100,
  };
  // Both workers are up before the task exists, so each claims runs at once, even on a loaded machine.
  const a = await start(spec);
  const b = await start(spec);
  // max_attempts 1: a run whose attempt were spent by the restart would fail.
  const taskId = await env.task("proc-roll", files, { mode: "sleep", ms: 2000 }, 1);
  await waitFor(
    async () =>
      (await env.db.sql`select 1 from runs where task_id = ${taskId} and status = 'running'`).length >= 3,
  );
  for (const old of [a, b]) {
    await replace(old, spec);
  }
  const task = await waitForTerminal(env.db.sql, taskId, 60_000);
  assert.deepEqual(task, {
    status: "succeeded",
    total: 6,
    succeeded: 6,
    failed: 0,
    timedOut: 0,
    cancelled: 0,
  });
  const runs = await env.db.sql`select attempt from runs where task_id = ${taskId}`;
  assert.ok(runs.every((r) => r.attempt === 1));
});

test("a rolling restart of 3 workers during a 300-run task: none lost, none failed, no attempt spent", async () => {
  const files: string[] = [];
  for (let i = 0; i < 300; i++) files.push(await env.file(`a\n${i}\n`));
  const spec: WorkerSpec = {
    types: { "proc-roll-300": { sleepMs: 0, program: true } },
    concurrency: 4,
    leaseTtlMs: 5000,
    reapIntervalMs: 500,
    graceMs: 100,
  };
  const workers = [await start(spec), await start(spec), await start(spec)];
  const taskId = await env.task("proc-roll-300", files, { mode: "sleep", ms: 150 }, 1);
  const finished = async () =>
    Number((await env.db.sql`select succeeded_count as n from tasks where id = ${taskId}`)[0]?.n ?? 0);
  for (const [i, old] of workers.entries()) {
    // Roll while runs are in flight: after each third of the work has begun.
    await waitFor(async () => (await finished()) >= (i + 1) * 60, 60_000, `${(i + 1) * 60} runs done`);
    await replace(old, spec);
  }
  const task = await waitForTerminal(env.db.sql, taskId, 120_000);
  assert.deepEqual(task, {
    status: "succeeded",
    total: 300,
    succeeded: 300,
    failed: 0,
    timedOut: 0,
    cancelled: 0,
  });
  const [spent] = await env.db
    .sql`select count(*)::int as n from runs where task_id = ${taskId} and attempt <> 1`;
  assert.equal(spent?.n, 0, "no attempt was spent by the restarts");
});
