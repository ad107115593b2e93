// `assay api | worker | all`: long-running processes with a graceful shutdown.
import closeWithGrace from "close-with-grace";
import { tokenCreate } from "../auth/tokens.ts";
import type { Config } from "../config.ts";
import { expectedMigrationCount } from "../db/migrate.ts";
import { openDatabase } from "../db/open.ts";
import { createLogger, type Logger } from "../log.ts";
import { LocalStore } from "../storage/local.ts";
import { openStore } from "../storage/open.ts";
import type { ObjectStore } from "../storage/store.ts";
import { timerDelay } from "../timers.ts";
import { need, parse, UsageError } from "./usage.ts";
import { startWorkerRuntime } from "./worker-runtime.ts";

const HELP = {
  api: `Usage: assay api [--dev-token]

Serves the HTTP API on $HOST:$PORT. Never runs analysis processes.
  --dev-token   create an admin token for user "dev" and print it with a curl example`,
  worker: `Usage: assay worker [--concurrency N]

Runs a worker: it claims analysis runs from the queue and executes them.
  --concurrency N   analysis processes this worker runs at once (default 4)`,
  all: `Usage: assay all [--concurrency N] [--dev-token]

API and worker in one process, for development (\`make dev\`).
  --concurrency N   analysis processes the worker runs at once (default 4)
  --dev-token       create an admin token for user "dev" and print it with a curl example`,
} as const;

/**
 * Total shutdown is bounded by ASSAY_SHUTDOWN_GRACE_MS plus this margin (kill grace, final writes);
 * a second signal exits at once and the reaper covers what that leaves.
 */
const SHUTDOWN_MARGIN_MS = 15_000;
/** Partial uploads older than this are what a killed process left behind. */
const PARTIAL_UPLOAD_MAX_AGE_MS = 60 * 60 * 1000;

/**
 * Waits until the object store answers, retrying with a growing pause (a bucket that is down at start
 * is waited for, as a database is): the cause is logged each time, never a credential.
 */
async function waitForStore(store: ObjectStore, logger: Logger): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await store.check();
      if (attempt > 1) logger.info({ storage: store.kind }, "object store reachable");
      return;
    } catch (err) {
      const pauseMs = Math.min(10_000, 250 * 2 ** attempt);
      logger.warn({ err, storage: store.kind, retryInMs: pauseMs }, "object store unreachable; waiting");
      await new Promise((r) => setTimeout(r, pauseMs));
    }
  }
}

export async function serveCommand(
  mode: "api" | "worker" | "all",
  argv: string[],
  config: Config | undefined,
): Promise<number> {
  const { values } = parse({
    args: argv,
    options: {
      help: { type: "boolean", short: "h" },
      ...(mode === "api" ? {} : { concurrency: { type: "string" as const } }),
      ...(mode === "worker" ? {} : { "dev-token": { type: "boolean" as const } }),
    },
  });
  if (values.help) {
    console.log(HELP[mode]);
    return 0;
  }
  const concurrency = Number((values as { concurrency?: string }).concurrency ?? 4);
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 256) {
    throw new UsageError("--concurrency must be an integer from 1 to 256");
  }
  const cfg = need(config);
  const logger = createLogger({ level: cfg.logLevel, pretty: cfg.logFormat === "pretty" });
  const database = await openDatabase(cfg, logger, { applicationName: `assay-${mode}` });
  // Opens the pool's first connection (TCP, authentication) while the rest of the process loads,
  // not on the first request; a failure here is the first request's to report.
  database.sql`select 1`.catch(() => {});
  const storage = await openStore(cfg);
  if (storage instanceof LocalStore) {
    const swept = await storage.abortIncompleteUploads(new Date(Date.now() - PARTIAL_UPLOAD_MAX_AGE_MS));
    if (swept > 0) logger.info({ swept }, "removed partial uploads left by an earlier process");
  }
  await waitForStore(storage, logger);

  // `assay worker` without ASSAY_METRICS_PORT has no /metrics, so it keeps no metrics (and does not
  // load prom-client: ~20 MiB of its idle RSS and ~50 ms of its start, bench/startup.ts).
  const metrics =
    mode === "worker" && cfg.metricsPort === 0
      ? undefined
      : (await import("../metrics/registry.ts")).processRegistry();
  // Imported only where needed: a worker without the HTTP stack is smaller, and the cost of every
  // spawn (a fork) grows with the parent's resident memory.
  const server =
    mode === "worker" || metrics === undefined
      ? undefined
      : await (await import("../http/server.ts")).buildServer(
          { config: cfg, database, storage, expectedMigrations: expectedMigrationCount(), metrics },
          logger,
        );
  const worker =
    mode === "api"
      ? undefined
      : await startWorkerRuntime(cfg, database.sql, storage, logger, concurrency, metrics);
  /** `assay worker`'s own /metrics endpoint (the API serves its registry itself). */
  let metricsServer: { close(): Promise<void> } | undefined;
  const closer = closeWithGrace(
    { delay: timerDelay(cfg.shutdownGraceMs + SHUTDOWN_MARGIN_MS), logger },
    async ({ signal, err }) => {
      if (err) logger.error({ err }, "shutting down after an unexpected error");
      else logger.info({ signal }, "shutting down");
      await Promise.all([server?.close(), worker?.stop(), metricsServer?.close()]);
      await database.close();
      logger.info("stopped");
    },
  );
  try {
    if (server) await server.listen({ host: cfg.host, port: cfg.port });
    else if (metrics)
      metricsServer = await (await import("../metrics/server.ts")).serveMetrics(
        metrics,
        cfg.host,
        cfg.metricsPort,
        logger,
      );
  } catch (err) {
    logger.error({ err }, "could not listen");
    closer.uninstall();
    await worker?.stop();
    await database.close();
    return 1;
  }
  if ((values as { "dev-token"?: boolean })["dev-token"] && server) {
    const { token } = await tokenCreate(database.sql, "dev", "admin");
    const address = `http://${cfg.host}:${(server.server.address() as { port: number }).port}`;
    console.log(
      [
        "",
        `Assay is listening on ${address}  (docs: ${address}/docs)`,
        // The token rides in the fragment, which a browser never sends to a server (nor to its logs);
        // the dashboard stores it and removes it from the address bar.
        "Dashboard (signs you in as dev):",
        `  ${address}/#token=${encodeURIComponent(token)}`,
        "Development token (user dev, admin):",
        `  export ASSAY_TOKEN=${token}`,
        "Try:",
        `  curl -s -H "Authorization: Bearer $ASSAY_TOKEN" -F file=@data.csv ${address}/api/files`,
        "",
      ].join("\n"),
    );
  }
  // Keeps running until a signal; close-with-grace exits the process when shutdown is done.
  return new Promise<number>(() => {});
}
