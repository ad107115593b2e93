// `assay worker` as a real process: SIGTERM mid-run and a second signal.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import { shutdownBoundMs } from "../../src/cli/serve.ts";
import { startWorkerRuntime } from "../../src/cli/worker-runtime.ts";
import { loadConfig } from "../../src/config.ts";
import { freePort } from "../../src/db/embedded.ts";
import { createLogger } from "../../src/log.ts";
import type { ObjectStore } from "../../src/storage/store.ts";
import { ASSAY_BIN, cleanEnv, collect, ROOT, spawnCli, watch } from "../helpers/cli.ts";
import { createTask, waitFor, waitForTerminal } from "../helpers/queue.ts";
import { type RunnerEnv, runnerEnv, strayOutputs } from "../helpers/runner.ts";
import { scratchDir } from "../helpers/tmp.ts";

let env: RunnerEnv;
let bigFile: string;
before(async () => {
  env = await runnerEnv();
  // Large enough that `summary` runs for seconds (it streams), so signals land mid-run.
  const rows = ["a,b,c"];
  for (let i = 0; i < 3_000_000; i++) rows.push(`${i},${i % 7},${i % 13}`);
  bigFile = await env.file(`${rows.join("\n")}\n`);
});
after(() => env.close());

const workerEnv = (extra: Record<string, string> = {}) =>
  cleanEnv({
    DATABASE_URL: env.db.url,
    ASSAY_DATA_DIR: env.dataDir,
    LOG_LEVEL: "info",
    ASSAY_POLL_INTERVAL_MS: "100",
    ...extra,
  });

/** GET /metrics of a worker's own endpoint (ASSAY_METRICS_PORT). */
const scrape = async (port: number) => {
  const res = await fetch(`http://127.0.0.1:${port}/metrics`);
  assert.equal(res.status, 200);
  return res.text();
};

/** Until the task's run has started running (its process is up). */
const runRunning = (taskId: string) =>
  waitFor(
    async () =>
      (await env.db.sql`select 1 from runs where task_id = ${taskId} and status = 'running'`).length > 0,
  );

test("SIGTERM mid-run: the worker exits 0 within its grace, the run goes back unspent and another worker finishes it", async () => {
  const taskId = await env.task("summary", [bigFile], {}, 1);
  const [firstPort, secondPort] = [await freePort(), await freePort()];
  const first = spawnCli(
    ["worker", "--concurrency", "1"],
    workerEnv({ ASSAY_SHUTDOWN_GRACE_MS: "0", ASSAY_METRICS_PORT: String(firstPort) }),
  );
  const out = watch(first);
  const done = collect(first);
  await out.waitFor(/worker started/);
  await runRunning(taskId);
  // The worker's own metrics endpoint: one live process, one claimed run.
  const during = await scrape(firstPort);
  assert.match(during, /assay_worker_attempts_live\{analysis_type="summary"\} 1\n/);
  assert.match(during, /assay_claim_latency_seconds_count\{analysis_type="summary"\} 1\n/);
  assert.match(during, /assay_process_resident_memory_bytes \d+/);
  const t0 = Date.now();
  first.kill("SIGTERM");
  const exit = await done;
  assert.equal(exit.code, 0, exit.stderr);
  assert.ok(Date.now() - t0 < 15_000, "bounded shutdown");
  const [mid] = await env.db.sql`select status, attempt from runs where task_id = ${taskId}`;
  assert.deepEqual({ ...mid }, { status: "queued", attempt: 0 });
  assert.deepEqual(await strayOutputs(env), [], "the aborted attempt's partial output is gone");
  assert.deepEqual(fs.readdirSync(path.join(env.dataDir, "work")), [], "and so is its scratch folder");

  const second = spawnCli(["worker"], workerEnv({ ASSAY_METRICS_PORT: String(secondPort) }));
  const secondDone = collect(second);
  const task = await waitForTerminal(env.db.sql, taskId, 60_000);
  // The duration is observed once the completion is written: poll until it shows.
  const finished = await waitFor(async () => {
    const text = await scrape(secondPort);
    return /assay_run_duration_seconds_count\{analysis_type="summary",outcome="succeeded"\} 1\n/.test(text)
      ? text
      : undefined;
  });
  assert.match(finished, /assay_worker_attempts_live\{analysis_type="summary"\} 0\n/);
  second.kill("SIGTERM");
  assert.equal((await secondDone).code, 0);
  assert.equal(task.status, "succeeded", "max_attempts 1: a spent attempt would have failed it");
});

test("a second signal exits at once", async () => {
  // The run takes seconds, so the graceful shutdown is still waiting for it.
  const taskId = await env.task("summary", [bigFile], {}, 1);
  const w = spawnCli(["worker", "--concurrency", "1"], workerEnv({ ASSAY_SHUTDOWN_GRACE_MS: "60000" }));
  const out = watch(w);
  const done = collect(w);
  await out.waitFor(/worker started/);
  await runRunning(taskId);
  w.kill("SIGTERM");
  await out.waitFor(/shutting down/);
  // Timed from the second signal: the first one's shutdown line reaching the test is not the
  // worker's doing. Far below the 60 s grace the first signal would wait for.
  const t0 = Date.now();
  w.kill("SIGTERM");
  const exit = await done;
  assert.notEqual(
    exit.code,
    0,
    `${exit.code} ${exit.signal} ${Date.now() - t0}ms\n${exit.stdout.slice(-1500)}`,
  );
  assert.ok(Date.now() - t0 < 15_000, `exited after ${Date.now() - t0} ms, not after the 60 s grace`);
  // At once: not after the run it was waiting for had ended.
  const [run] = await env.db.sql<{ status: string }[]>`select status from runs where task_id = ${taskId}`;
  assert.notEqual(run?.status, "succeeded", "the worker left before its run could finish");
});

test("a worker without ASSAY_METRICS_PORT loads neither the HTTP stack, TypeBox, drizzle nor prom-client", async () => {
  // What a worker loads is its start-up time and its idle memory (bench/startup.ts: from ~1.1 s and
  // ~260 MiB when it loaded drizzle's driver and TypeBox to ~0.2 s and ~63 MiB).
  const taskId = await env.task("summary", [await env.file("a,b\n1,2\n")], {}, 1);
  const trace = path.join(scratchDir("assay-trace-"), "imports.txt");
  const w = spawn(
    process.execPath,
    ["--import", path.join(ROOT, "test/helpers/trace-imports.mjs"), ASSAY_BIN, "worker"],
    // The sources, module by module (test/unit/bundle.test.ts checks the bundle's chunks alike).
    {
      env: { ...workerEnv(), ASSAY_TRACE_IMPORTS: trace, ASSAY_BUNDLE: "0" },
      cwd: ROOT,
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  const done = collect(w);
  try {
    const task = await waitForTerminal(env.db.sql, taskId, 60_000);
    assert.equal(task.status, "succeeded");
  } finally {
    w.kill("SIGTERM");
  }
  const exit = await done;
  assert.equal(exit.code, 0, exit.stderr);
  const loaded = fs.readFileSync(trace, "utf8").split("\n").filter(Boolean);
  assert.ok(
    loaded.some((u) => u.endsWith("/src/queue/worker.ts")),
    "the trace sees the worker's modules",
  );
  const heavy = loaded.filter((u) =>
    /node_modules\/(fastify|@fastify|typebox|drizzle-orm|prom-client|@opentelemetry|@aws-sdk|tsx)\/|\/src\/http\//.test(
      u,
    ),
  );
  assert.deepEqual([...new Set(heavy)], []);
});

test("on stop the worker stops claiming at once, not after a background pass in progress ends", async () => {
  // A database of its own: the runs other tests left queued are not this worker's to claim.
  const own = await runnerEnv();
  let passStarted: () => void = () => {};
  const inPass = new Promise<void>((resolve) => (passStarted = resolve));
  let endPass: () => void = () => {};
  const passMayEnd = new Promise<void>((resolve) => (endPass = resolve));
  // A retention pass deleting a big task's outputs (minutes on S3): it ends when the test says so.
  const slow: ObjectStore = Object.create(own.storage);
  slow.deletePrefix = async (prefix: string) => {
    passStarted();
    await passMayEnd;
    return own.storage.deletePrefix(prefix);
  };
  const expired = await createTask(own.db.sql, own.owner, "summary", 1);
  await own.db.sql`update runs set status = 'cancelled', finished_at = now() where task_id = ${expired}`;
  await own.db.sql`
    update tasks set status = 'cancelled', cancelled_count = total_count, finished_at = now() - interval '40 days'
    where id = ${expired}`;
  const config = loadConfig({
    DATABASE_URL: own.db.url,
    ASSAY_DATA_DIR: own.dataDir,
    ASSAY_RETENTION_DAYS: "30",
    ASSAY_RETENTION_INTERVAL_MS: "1000",
    ASSAY_SHUTDOWN_GRACE_MS: "0",
    ASSAY_POLL_INTERVAL_MS: "100",
  });
  const runtime = await startWorkerRuntime(
    config,
    own.db,
    slow,
    createLogger({ level: "silent" }),
    2,
    undefined,
  );
  try {
    await inPass;
    const stopping = runtime.stop(); // what SIGTERM calls
    const taskId = await own.task("summary", [await own.file("a,b\n1,2\n")], {});
    // Either the worker deregisters (it has stopped) or it claims the new run (it has not stopped claiming).
    const seen = await waitFor(async () => {
      const [run] = await own.db.sql<
        { attempt: number }[]
      >`select attempt from runs where task_id = ${taskId}`;
      if ((run?.attempt ?? 0) > 0) return "claimed";
      const registered = await own.db.sql`select 1 from workers where id = ${runtime.worker.id}`;
      return registered.length === 0 ? "stopped" : undefined;
    });
    assert.equal(seen, "stopped", "the stopping worker claimed a run created after stop()");
    endPass();
    await stopping;
    const [run] = await own.db.sql`select status, attempt from runs where task_id = ${taskId}`;
    assert.deepEqual({ ...run }, { status: "queued", attempt: 0 });
  } finally {
    endPass();
    await own.close();
  }
});

test("the shutdown bound leaves room for the kill grace after the shutdown grace", () => {
  // A program slow to die on SIGTERM is SIGKILLed ASSAY_KILL_GRACE_MS after the grace ends; the forced
  // exit must come after that (and the final writes), or it leaves the run leased.
  const bound = (env: Record<string, string>) =>
    shutdownBoundMs(loadConfig({ ASSAY_DATA_DIR: "/x", ...env }));
  // After the kill grace a leader's output may take the kill grace again (at least 1 s) to close, and
  // 1 s more to find a process that left the group holding it (the runner's bounded drain).
  assert.equal(
    bound({}),
    46_000,
    "the defaults: 25 s grace, 5 s kill grace, 5 + 1 s for the output to close, 10 s for the final writes",
  );
  assert.equal(bound({ ASSAY_SHUTDOWN_GRACE_MS: "0", ASSAY_KILL_GRACE_MS: "20000" }), 51_000);
  assert.equal(bound({ ASSAY_SHUTDOWN_GRACE_MS: "0", ASSAY_KILL_GRACE_MS: "0" }), 12_000);
  assert.equal(bound({ ASSAY_SHUTDOWN_GRACE_MS: "60000", ASSAY_KILL_GRACE_MS: "120000" }), 311_000);
});
