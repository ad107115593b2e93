// End-to-end benchmark (issue 4): `summary` over 200 small CSVs through the queue with one worker at
// concurrency 2, next to a plain loop that spawns the same script directly with the same concurrency
// (the physical reference). One JSON line each; target ≥ 0.95× the plain loop, and PostgreSQL ≤ 0.5 ms of CPU per run.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { findPrograms } from "../src/analyses/programs.ts";
import { childMemoryLimit } from "../src/cli/worker-runtime.ts";
import { loadConfig } from "../src/config.ts";
import { createDatabase } from "../src/db/client.ts";
import { createLogger } from "../src/log.ts";
import { NO_OBSERVER } from "../src/queue/observer.ts";
import { Worker } from "../src/queue/worker.ts";
import { childEnv, discardAttempt, processHandler } from "../src/runner/handler.ts";
import { openWorkDir } from "../src/runner/workdir.ts";
import { LocalStore } from "../src/storage/local.ts";
import { taskCreate } from "../src/tasks/create.ts";
import { benchDatabase, report } from "./lib/db.ts";

const N = Number(process.env.BENCH_E2E_N ?? 200);
const C = 2;
/**
 * Plain and Assay rounds of N runs each, interleaved. One round's ratio moves by ±0.1 on this machine
 * (its speed drifts between rounds), so the default is 8 pairs.
 */
const ROUNDS = Number(process.env.BENCH_E2E_ROUNDS ?? 8);
const summary = findPrograms({}).available.find((p) => p.type === "summary");
if (!summary) throw new Error("summary program not found");

const bench = await benchDatabase();
const { sql, close } = createDatabase(bench.url);
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bench-e2e-"));
const storage = new LocalStore(dataDir);
try {
  fs.mkdirSync(path.join(dataDir, "files"));
  const [user] = await sql<
    { id: number }[]
  >`insert into users (name, role) values ('bench-e2e', 'admin') returning id::float8`;
  const owner = { userId: user?.id as number, name: "bench-e2e", role: "admin" as const };
  const ids: string[] = [];
  for (let i = 0; i < N; i++) {
    const content = `id,value,label\n${Array.from({ length: 50 }, (_, r) => `${r},${(r * 7 + i) % 101},l${r}`).join("\n")}\n`;
    const [row] = await sql<{ id: string }[]>`
      with next as (select nextval(pg_get_serial_sequence('files', 'id')) as id)
      insert into files (id, owner_id, name, content_type, size_bytes, sha256, storage_key)
      select id, ${owner.userId}, ${`f${i}.csv`}, 'text/csv', ${content.length}, repeat('0', 64), 'files/' || id from next
      returning id::text`;
    fs.writeFileSync(path.join(dataDir, "files", row?.id as string), content, { mode: 0o640 });
    ids.push(row?.id as string);
  }

  // The physical reference: spawn the script directly, C at a time.
  const plainRound = async () => {
    const plainOut = fs.mkdtempSync(path.join(dataDir, "plain-"));
    let next = 0;
    const latencies: number[] = [];
    const cpu0 = process.cpuUsage();
    const pg0 = bench.serverCpuMs();
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: C }, async () => {
        while (next < ids.length) {
          const id = ids[next++] as string;
          const out = path.join(plainOut, id);
          fs.mkdirSync(out);
          const s = performance.now();
          await new Promise<void>((resolve, reject) => {
            const child = spawn(
              summary.executable,
              [
                summary.script,
                "--input",
                storage.localPath(`files/${id}`),
                "--output-dir",
                out,
                "--params",
                "{}",
              ],
              { cwd: summary.cwd, env: childEnv(os.tmpdir()), stdio: ["ignore", "pipe", "pipe"] },
            );
            child.stdout.resume();
            child.stderr.resume();
            child.on("close", (code) => (code === 0 ? resolve() : reject(new Error(`exit ${code}`))));
          });
          latencies.push(performance.now() - s);
        }
      }),
    );
    const seconds = (performance.now() - t0) / 1000;
    const pg1 = bench.serverCpuMs();
    // Nothing of the plain loop's touches PostgreSQL: what it spends meanwhile is deferred work of the
    // queue's (autovacuum, checkpoints), charged to the Assay rounds below.
    const pgMs = pg0 === undefined || pg1 === undefined ? Number.NaN : pg1 - pg0;
    return { seconds, cpu: process.cpuUsage(cpu0), pgMs, latencies, ok: true };
  };

  // Through Assay: one task of N runs, one worker at concurrency C, the production handler.
  let waiting = { left: 0, done: () => {} };
  // The worker as `assay worker` runs it: kill grace, the analysis processes' CPU priority,
  // prefetch and the completion delay from the configuration (its defaults, or ASSAY_* from the environment).
  const config = loadConfig();
  const benchLogger = createLogger({ level: "warn", destination: process.stderr });
  const memory = childMemoryLimit(config, benchLogger);
  const worker = new Worker({
    sql,
    logger: benchLogger,
    types: {
      summary: {
        handler: processHandler(summary, {
          store: storage,
          workDir: (await openWorkDir(dataDir)).dir,
          killGraceMs: config.killGraceMs,
          nice: config.childNice,
          // The memory limit as well (each program started through prlimit).
          ...(memory ? { memory } : {}),
        }),
      },
    },
    concurrency: C,
    leaseTtlMs: 30_000,
    pollIntervalMs: 2000,
    retryBaseMs: 1000,
    onDiscard: discardAttempt(storage),
    // The end of a round is signalled by the worker itself once it has recorded N endings: neither
    // polling nor LISTEN, whose queries and notifications would be the benchmark's own load.
    observer: {
      ...NO_OBSERVER,
      attemptEnded: () => {
        if (--waiting.left === 0) waiting.done();
      },
    },
    prefetch: config.prefetch,
    prefetchWindowMs: config.prefetchWindowMs,
    completionDelayMs: config.completionDelayMs,
  });
  await worker.start();
  const assayRound = async () => {
    const finished = new Promise<void>((resolve) => {
      waiting = { left: N, done: resolve };
    });
    const cpu0 = process.cpuUsage();
    const pg0 = bench.serverCpuMs();
    const t0 = performance.now();
    const created = await taskCreate(sql, owner, {
      analysisType: "summary",
      fileIds: ids,
      parameters: {},
      maxAttempts: 3,
    });
    if (created.kind !== "created") throw new Error("create failed");
    await finished;
    const seconds = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    const pg1 = bench.serverCpuMs();
    const pgMs = pg0 === undefined || pg1 === undefined ? Number.NaN : pg1 - pg0;
    const [check] = await sql<{ status: string; succeeded: number; latencies: number[] }[]>`
      select t.status, t.succeeded_count as succeeded,
             (select array_agg(extract(epoch from finished_at - started_at) * 1000) from runs where task_id = t.id) as latencies
      from tasks t where t.id = ${created.taskId}`;
    return {
      seconds,
      cpu,
      pgMs,
      latencies: (check?.latencies ?? []).map(Number),
      ok: check?.status === "succeeded" && check.succeeded === N,
    };
  };

  // Interleaved rounds, so drift of the machine (other tenants, CPU frequency) hits both sides alike.
  type Round = Awaited<ReturnType<typeof plainRound>>;
  const sum = (rounds: Round[]) => ({
    seconds: rounds.reduce((a, r) => a + r.seconds, 0),
    cpuMs: Math.round(rounds.reduce((a, r) => a + r.cpu.user + r.cpu.system, 0) / 1000 / rounds.length),
    userMs: Math.round(rounds.reduce((a, r) => a + r.cpu.user, 0) / 1000 / rounds.length),
    latencies: rounds.flatMap((r) => r.latencies),
    ok: rounds.every((r) => r.ok),
  });
  const plainRounds: Round[] = [];
  const assayRounds: Round[] = [];
  // ABBA: which side goes first alternates, so a trend over the run favours neither.
  for (let i = 0; i < ROUNDS; i++) {
    if (i % 2 === 0) {
      plainRounds.push(await plainRound());
      assayRounds.push(await assayRound());
    } else {
      assayRounds.push(await assayRound());
      plainRounds.push(await plainRound());
    }
  }
  await worker.stop();
  const p = sum(plainRounds);
  const a = sum(assayRounds);
  const plain = report("e2e:plain-spawn", N * ROUNDS, C, p.seconds, p.latencies, p.ok, {
    rounds: ROUNDS,
    parentCpuMsPerRound: p.cpuMs,
    parentUserMsPerRound: p.userMs,
  });
  const pgMs = [...plainRounds, ...assayRounds].reduce((x, r) => x + r.pgMs, 0);
  const assay = report("e2e:assay", N * ROUNDS, C, a.seconds, a.latencies, a.ok, {
    rounds: ROUNDS,
    workerCpuMsPerRound: a.cpuMs,
    workerUserMsPerRound: a.userMs,
    // PostgreSQL's CPU (all its processes, from /proc) over every round, plain ones included (its
    // deferred work, autovacuum and checkpoints, lands there), per run through Assay. Target ≤ 0.5.
    pgCpuMsPerRun: Math.round((pgMs / (N * ROUNDS)) * 1000) / 1000,
  });
  console.log(
    JSON.stringify({
      workload: "e2e:ratio",
      ratio: Math.round((assay.rate / plain.rate) * 100) / 100,
      perRound: plainRounds.map(
        (r, i) => Math.round((r.seconds / (assayRounds[i] as Round).seconds) * 100) / 100,
      ),
      target: 0.95,
    }),
  );
} finally {
  await close();
  await bench.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
}
