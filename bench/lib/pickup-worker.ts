// A worker process for bench/queue.ts's pickup workloads: the production Worker with the
// configuration's claim settings (ASSAY_* from the environment) and a handler of type "noop" that
// tells its parent (over the IPC channel) when a watched input file's run starts, on the system's
// monotonic clock (process.hrtime, shared by every process on the machine). Other runs take
// BENCH_RUN_MS on average (0: none; else uniformly 0.5–1.5× that). The parent creates the tasks from its
// own process, as the API does from its own: a create and the worker's claims never share an event loop.
//   fork("bench/lib/pickup-worker.ts", { env: { DATABASE_URL, BENCH_SLOTS, BENCH_RUN_MS } })
// Messages in: {watch: fileId[]}, {stop: true}. Out: {ready: true}, {started: fileId, at: ms}. After
// {stop: true} it exits 0 once stopped, 1 if stopping failed.
import { loadConfig } from "../../src/config.ts";
import { createDatabase } from "../../src/db/client.ts";
import { createLogger } from "../../src/log.ts";
import { Worker } from "../../src/queue/worker.ts";

type In = { watch: string[] } | { stop: true };

const config = loadConfig();
const logger = createLogger({ level: "warn", destination: process.stderr });
const database = createDatabase(config.databaseUrl as string, {
  applicationName: "assay-bench-pickup",
  max: 10,
});
const runMs = Number(process.env.BENCH_RUN_MS ?? 0);
const watched = new Set<string>();
const send = (m: object) => process.send?.(m);
const worker = new Worker({
  sql: database.sql,
  logger,
  types: {
    noop: {
      handler: async (run) => {
        const fileId = String(run.inputFileId);
        if (watched.delete(fileId)) send({ started: fileId, at: Number(process.hrtime.bigint()) / 1e6 });
        else if (runMs > 0) await new Promise((res) => setTimeout(res, runMs * (0.5 + Math.random())));
        return { status: "succeeded" };
      },
    },
  },
  concurrency: Number(process.env.BENCH_SLOTS ?? 10),
  leaseTtlMs: 30_000,
  pollIntervalMs: 2000,
  retryBaseMs: 1000,
  prefetchWindowMs: config.prefetchWindowMs,
  completionDelayMs: config.completionDelayMs,
});
process.on("message", (m: In) => {
  if ("watch" in m) {
    for (const id of m.watch) watched.add(id);
    return;
  }
  worker
    .stop()
    .then(() => database.close())
    .then(
      () => process.exit(0),
      (err: unknown) => {
        process.stderr.write(`pickup worker: stopping failed: ${String(err)}\n`);
        process.exit(1);
      },
    );
});
await worker.start();
send({ ready: true });
