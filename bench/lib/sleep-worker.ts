// A worker process for bench/scale.ts: the production queue worker and reaper, with the configuration's
// defaults (ASSAY_* from the environment), and a handler that waits 20 ms without using the CPU — so
// what is measured is the queue's own cost, not a program's. Prints "ready" once it listens; SIGTERM
// stops it.
//   DATABASE_URL=… BENCH_SLOTS=4 node --import tsx bench/lib/sleep-worker.ts
import { setTimeout as sleep } from "node:timers/promises";
import { loadConfig } from "../../src/config.ts";
import { createDatabase } from "../../src/db/client.ts";
import { createLogger } from "../../src/log.ts";
import { Reaper } from "../../src/queue/reaper.ts";
import { Worker } from "../../src/queue/worker.ts";

const config = loadConfig();
const logger = createLogger({ level: "warn", destination: process.stderr });
const database = createDatabase(config.databaseUrl as string, { applicationName: "assay-bench-worker" });
const handlerMs = Number(process.env.BENCH_HANDLER_MS ?? 20);
const worker = new Worker({
  sql: database.sql,
  logger,
  types: {
    sleep: {
      handler: async () => {
        await sleep(handlerMs);
        return { status: "succeeded" };
      },
    },
  },
  concurrency: Number(process.env.BENCH_SLOTS ?? 4),
  leaseTtlMs: config.leaseTtlMs,
  pollIntervalMs: config.pollIntervalMs,
  retryBaseMs: config.retryBaseMs,
  prefetch: config.prefetch,
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
