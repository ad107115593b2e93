// Runner tests: real files in storage, real processes, a worker in-process.

import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Readable, Writable } from "node:stream";
import type { FastifyInstance } from "fastify";
import { type Program, resolveExecutable } from "../../src/analyses/programs.ts";
import type { Principal } from "../../src/auth/tokens.ts";
import { loadConfig } from "../../src/config.ts";
import { expectedMigrationCount } from "../../src/db/migrate.ts";
import { buildServer } from "../../src/http/server.ts";
import { createLogger } from "../../src/log.ts";
import type { QueueObserver } from "../../src/queue/observer.ts";
import { type TypeOptions, Worker } from "../../src/queue/worker.ts";
import { childEnv, discardAttempt, processHandler, removeLeftovers } from "../../src/runner/handler.ts";
import type { ProgressEvent } from "../../src/runner/jsonl.ts";
import { type ProcessResult, runProcess } from "../../src/runner/run-process.ts";
import { LocalStore } from "../../src/storage/local.ts";
import type { ObjectStore } from "../../src/storage/store.ts";
import { taskCreate } from "../../src/tasks/create.ts";
import { ROOT } from "./cli.ts";
import { createTestDatabase, type TestDatabase } from "./db.ts";
import { seedUser } from "./queue.ts";

export const FIXTURE = path.join(ROOT, "test/fixtures/scripts/behave.mjs");

/** A test-only program (never in the production registry). */
export const fixtureProgram = (type: string, overrides: Partial<Program> = {}): Program => ({
  type,
  executable: process.execPath,
  script: FIXTURE,
  cwd: path.dirname(FIXTURE),
  ...overrides,
});

/**
 * A program written for one test under `dir`: an ES module given the usual arguments, with `arg`,
 * `out` (the output folder) and `say` (a JSON line on stdout) in scope, and fs, os and path imported.
 */
export function writeProgram(dir: string, name: string, body: string): { script: string; cwd: string } {
  const folder = fs.mkdtempSync(path.join(dir, "scripts-"));
  const script = path.join(folder, `${name}.mjs`);
  fs.writeFileSync(
    script,
    `import fs from "node:fs";
import os from "node:os";
import path from "node:path";
const arg = (name) => process.argv[process.argv.indexOf(name) + 1];
const out = arg("--output-dir");
const say = (e) => process.stdout.write(JSON.stringify(e) + "\\n");
${body}`,
  );
  return { script, cwd: folder };
}

/**
 * Runs `p` as the runner would, without a queue: the usual arguments, an output folder of its own under
 * `work`, an environment from the allowlist (HOME is `work`).
 */
export async function runProgram(
  p: Program,
  work: string,
  input: string,
  params: unknown,
  o: { timeoutMs: number; onProgress?: (event: ProgressEvent) => void },
): Promise<{ r: ProcessResult; out: string }> {
  const out = fs.mkdtempSync(path.join(work, "out-"));
  const r = await runProcess(
    {
      executable: p.executable,
      args: [p.script, "--input", input, "--output-dir", out, "--params", JSON.stringify(params)],
      cwd: p.cwd,
      env: childEnv(work),
    },
    new AbortController().signal,
    { killGraceMs: 1000, timeoutMs: o.timeoutMs },
    o.onProgress,
  );
  return { r, out };
}

export interface RunnerEnv {
  db: TestDatabase;
  dataDir: string;
  storage: ObjectStore;
  outputsRoot: string;
  owner: Principal;
  /** Stores `content` as an uploaded file; returns its id. */
  file(content: string, mode?: number): Promise<string>;
  task(
    type: string,
    fileIds: string[],
    parameters: Record<string, unknown>,
    maxAttempts?: number,
  ): Promise<string>;
  worker(
    programs: (Program & { timeoutMs?: number })[],
    options?: {
      concurrency?: number;
      leaseTtlMs?: number;
      killGraceMs?: number;
      nice?: number;
      /** ASSAY_CHILD_MEMORY_MB's limit, set by prlimit (found on PATH) as the worker sets it. */
      memoryMb?: number;
      /** The claims' hold after a full disk (Worker's storageFullHoldMs): 100 ms here. */
      storageFullHoldMs?: number;
      /** The claims' hold after the store could not be used (Worker's storeDownHoldMs): 100 ms here. */
      storeDownHoldMs?: number;
      /** What the worker reports for metrics. */
      observer?: QueueObserver;
    },
  ): Worker;
  /** The HTTP app over this database and data directory (closed with the env); logs into `logs` if given. */
  app(logs?: Record<string, unknown>[]): Promise<FastifyInstance>;
  close(): Promise<void>;
}

/** With `store` (an S3 test bucket's, say) files and outputs live there; by default under `dataDir`. */
export async function runnerEnv(
  o: { store?: ObjectStore; configEnv?: Record<string, string> } = {},
): Promise<RunnerEnv> {
  const db = await createTestDatabase();
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-runner-"));
  const storage = o.store ?? new LocalStore(dataDir);
  const workDir = path.join(dataDir, "work");
  fs.mkdirSync(workDir);
  const outputsRoot = path.join(dataDir, "outputs");
  const owner = await seedUser(db.sql, "runner");
  const workers: Worker[] = [];
  const apps: FastifyInstance[] = [];
  return {
    db,
    dataDir,
    storage,
    outputsRoot,
    owner,
    file: async (content, mode = 0o640) => {
      const [row] = await db.sql<{ id: string }[]>`
        with next as (select nextval(pg_get_serial_sequence('files', 'id')) as id)
        insert into files (id, owner_id, name, content_type, size_bytes, sha256, storage_key)
        select id, ${owner.userId}, 'in.csv', 'text/csv', ${Buffer.byteLength(content)},
               ${createHash("sha256").update(content).digest("hex")}, 'files/' || id
        from next returning id::text`;
      const id = row?.id as string;
      await storage.put(`files/${id}`, Readable.from([Buffer.from(content)]));
      if (storage.localPath) fs.chmodSync(storage.localPath(`files/${id}`), mode);
      return id;
    },
    task: async (type, fileIds, parameters, maxAttempts = 1) => {
      const r = await taskCreate(db.sql, owner, { analysisType: type, fileIds, parameters, maxAttempts });
      if (r.kind !== "created") throw new Error(r.kind);
      return r.taskId;
    },
    worker: (programs, o = {}) => {
      const types: Record<string, TypeOptions> = {};
      for (const p of programs) {
        types[p.type] = {
          handler: processHandler(p, {
            store: storage,
            workDir,
            killGraceMs: o.killGraceMs ?? 500,
            ...(o.nice === undefined ? {} : { nice: o.nice }),
            ...(o.memoryMb === undefined
              ? {}
              : { memory: { bytes: o.memoryMb * 2 ** 20, prlimit: resolveExecutable("prlimit") as string } }),
          }),
          ...(p.timeoutMs === undefined ? {} : { timeoutMs: p.timeoutMs }),
        };
      }
      const w = new Worker({
        sql: db.sql,
        logger: createLogger({ level: "silent" }),
        types,
        concurrency: o.concurrency ?? 2,
        leaseTtlMs: o.leaseTtlMs ?? 30_000,
        pollIntervalMs: 100,
        retryBaseMs: 50,
        storageFullHoldMs: o.storageFullHoldMs ?? 100,
        storeDownHoldMs: o.storeDownHoldMs ?? 100,
        ...(o.observer ? { observer: o.observer } : {}),
        onDiscard: discardAttempt(storage),
        onRecorded: removeLeftovers(storage),
      });
      workers.push(w);
      return w;
    },
    app: async (logs) => {
      const config = loadConfig({ ASSAY_DATA_DIR: dataDir, DATABASE_URL: db.url, ...o.configEnv });
      const logger = logs
        ? createLogger({
            level: "info",
            destination: new Writable({
              write(chunk: Buffer, _enc, done) {
                for (const line of chunk.toString().split("\n")) if (line) logs.push(JSON.parse(line));
                done();
              },
            }),
          })
        : createLogger({ level: "silent" });
      const app = await buildServer(
        { config, database: db, storage, expectedMigrations: expectedMigrationCount() },
        logger,
      );
      apps.push(app);
      return app;
    },
    close: async () => {
      await Promise.all(apps.map((a) => a.close()));
      await Promise.all(workers.map((w) => w.stop()));
      await db.drop();
      fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

export const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** Files and folders left under the outputs root, relative to it. */
export function outputTree(root: string): string[] {
  if (!fs.existsSync(root)) return [];
  return (fs.readdirSync(root, { recursive: true }) as string[]).sort();
}

/** A succeeded run's output folder, as its completion recorded it. */
export async function runOutputDir(env: RunnerEnv, runId: number | string): Promise<string> {
  const [row] = await env.db.sql<
    { key: string | null }[]
  >`select output_key as key from runs where id = ${runId}`;
  if (!row?.key) throw new Error(`run ${runId} has no recorded output`);
  return path.join(env.outputsRoot, row.key);
}

/**
 * Attempt outputs that no run records as its output: what a failed, cancelled, fenced-off or killed
 * attempt would have left behind — objects in the store, and (local store) folders on disk, as
 * `<taskId>/<runId>.<attempt>.<token>`.
 */
export async function strayOutputs(env: RunnerEnv): Promise<string[]> {
  const recorded = new Set(
    (
      await env.db.sql<{ key: string }[]>`select output_key as key from runs where output_key is not null`
    ).map((r) => r.key),
  );
  const found = new Set<string>();
  for (let after: string | undefined; ; ) {
    const page = await env.storage.list("outputs/", after === undefined ? {} : { after });
    for (const o of page) found.add(o.key.split("/").slice(1, 3).join("/"));
    if (page.length < 1000) break;
    after = page.at(-1)?.key;
  }
  if (env.storage.localPath && fs.existsSync(env.outputsRoot)) {
    for (const task of fs.readdirSync(env.outputsRoot)) {
      for (const entry of fs.readdirSync(path.join(env.outputsRoot, task), { withFileTypes: true })) {
        if (entry.isDirectory()) found.add(`${task}/${entry.name}`);
      }
    }
  }
  return [...found].filter((f) => !recorded.has(f) && f.includes("/")).sort();
}

/**
 * A runner environment on each store, for tests that must hold for both: the local directory, and a
 * bucket of its own on the test S3 server under `prefix` (`drop` removes the bucket after `close`).
 */
export const runnerEnvBackends = (
  prefix: string,
): [string, () => Promise<{ env: RunnerEnv; drop?: () => Promise<void> }>][] => [
  ["local", async () => ({ env: await runnerEnv() })],
  [
    "s3",
    async () => {
      // Loaded only here: the AWS SDK is not every runner test's to load.
      const { createTestBucket } = await import("./s3.ts");
      const bucket = await createTestBucket();
      const env = await runnerEnv({
        store: bucket.store(prefix),
        configEnv: { ...bucket.env, ASSAY_S3_PREFIX: prefix },
      });
      return { env, drop: () => bucket.drop() };
    },
  ],
];
