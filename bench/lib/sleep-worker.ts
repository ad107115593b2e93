// A worker process for bench/scale.ts: the production queue worker and reaper, with the configuration's
// defaults (ASSAY_* from the environment), and a handler that waits 20 ms without using the CPU — so
// what is measured is the queue's own cost, not a program's. Prints "ready" once it listens; SIGTERM
// stops it.
//   DATABASE_URL=… BENCH_SLOTS=4 node --import tsx bench/lib/sleep-worker.ts
import { Readable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { loadConfig } from "../../src/config.ts";
import { createDatabase } from "../../src/db/client.ts";
import { createLogger } from "../../src/log.ts";
import { Reaper } from "../../src/queue/reaper.ts";
import { type Handler, Worker } from "../../src/queue/worker.ts";
import { attemptOutputKey } from "../../src/runner/outputs.ts";
import { openStore } from "../../src/storage/open.ts";
import { outputObjectKey } from "../../src/storage/store.ts";

const config = loadConfig();
const logger = createLogger({ level: "warn", destination: process.stderr });
const database = createDatabase(config.databaseUrl as string, { applicationName: "assay-bench-worker" });
const handlerMs = Number(process.env.BENCH_HANDLER_MS ?? 20);
// BENCH_TYPE: the analysis type it claims (default "sleep"); BENCH_OUTPUTS=1: each run stores a small
// result.json in the configured store and records it, as a program's output would be (for downloads).
const type = process.env.BENCH_TYPE ?? "sleep";
const store = process.env.BENCH_OUTPUTS === "1" ? await openStore(config) : undefined;
const handler: Handler = async (run) => {
  if (handlerMs > 0) await sleep(handlerMs);
  if (!store) return { status: "succeeded" };
  const outputKey = attemptOutputKey(run.taskId, run.id, run.attempt, run.leaseToken);
  const body = Buffer.from(`{"run":"${run.id}"}\n`);
  await store.put(outputObjectKey(outputKey, "result.json"), Readable.from([body]));
  return {
    status: "succeeded",
    result: {
      outputFileName: "result.json",
      metrics: { bytes: body.length },
      files: [{ name: "result.json", size: body.length }],
    },
    outputKey,
  };
};
const worker = new Worker({
  sql: database.sql,
  logger,
  types: { [type]: { handler } },
  concurrency: Number(process.env.BENCH_SLOTS ?? 4),
  leaseTtlMs: config.leaseTtlMs,
  pollIntervalMs: config.pollIntervalMs,
  retryBaseMs: config.retryBaseMs,
  prefetch: config.prefetch,
  prefetchWindowMs: config.prefetchWindowMs,
  completionDelayMs: config.completionDelayMs,
});
const reaper = new Reaper({
  sql: database.sql,
  logger,
  intervalMs: config.reapIntervalMs,
  leaseTtlMs: config.leaseTtlMs,
  retryBaseMs: config.retryBaseMs,
  workerWaitMs: config.workerWaitMs,
});
await worker.start();
reaper.start();
process.stdout.write("ready\n");
process.once("SIGTERM", async () => {
  await reaper.stop();
  await worker.stop();
  await database.close();
  process.exit(0);
});
