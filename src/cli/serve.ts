// `assay api | worker | all`: long-running processes with a graceful shutdown.
import fs from "node:fs";
import net from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import closeWithGrace from "close-with-grace";
import { tokenCreate } from "../auth/tokens.ts";
import { type Config, unknownVariables } from "../config.ts";
import {
  BOUNDED_CONNECT_MS,
  CONNECTION_LOST,
  createDatabase,
  DB_ANSWER_MS,
  droppedTypeRead,
  endPool,
  firstAnswer,
  NoAnswerError,
} from "../db/client.ts";
import { databaseNow } from "../db/clock.ts";
import { startSignal } from "../db/embedded.ts";
import { expectedMigrationCount, type SchemaState, schemaState, schemaTooOld } from "../db/migrate.ts";
import { type OpenedDatabase, openDatabase } from "../db/open.ts";
import { SilentSweep } from "../db/silent.ts";
import { createLogger, type Logger } from "../log.ts";
import { MIN_DRAIN_MS } from "../runner/run-process.ts";
import { LocalStore } from "../storage/local.ts";
import { openStore } from "../storage/open.ts";
import { type ObjectStore, StoreConfigError } from "../storage/store.ts";
import { timerDelay } from "../timers.ts";
import { need, parse, UsageError } from "./usage.ts";
import { startWorkerRuntime, type WorkerRuntime } from "./worker-runtime.ts";

const HELP = {
  api: `Usage: assay api [--dev-token]

Serves the HTTP API on $HOST:$PORT. Never runs analysis processes.
  --dev-token   create an admin token for user "dev" (good for 30 days) and print it with a curl example`,
  worker: `Usage: assay worker [--concurrency N]

Runs a worker: it claims analysis runs from the queue and executes them.
  --concurrency N   analysis processes this worker runs at once (default 4)`,
  all: `Usage: assay all [--concurrency N] [--dev-token]

API and worker in one process, for development (\`make dev\`).
  --concurrency N   analysis processes the worker runs at once (default 4)
  --dev-token       create an admin token for user "dev" (good for 30 days) and print it with a curl example`,
} as const;

/**
 * What a graceful shutdown may take after the kill grace: the last outcomes and progress written, the
 * worker deregistered, the pool and an embedded database closed.
 */
const FINAL_WRITES_MS = 10_000;
/** Partial uploads older than this are what a killed process left behind. */
const PARTIAL_UPLOAD_MAX_AGE_MS = 60 * 60 * 1000;
/** How long start-up waits for the database's clock before it leaves partial uploads be. */
const PARTIAL_SWEEP_CLOCK_WAIT_MS = 2_000;

/**
 * Removes a local store's partial uploads older than PARTIAL_UPLOAD_MAX_AGE_MS, at start: what a
 * process killed mid-upload left. Old by the database's clock and by this host's alike, as the store
 * sweep judges (queue/store-sweep.ts): on a data directory several hosts share, one whose clock ran an
 * hour ahead removed the others' uploads under way (their files' times are written by their own
 * clocks). Without the database's time within PARTIAL_SWEEP_CLOCK_WAIT_MS (`assay api` starts whatever
 * the database does) nothing is removed, and undefined returned: the store sweep's next pass ends them.
 */
export async function removeStalePartialUploads(
  storage: LocalStore,
  databaseTime: Promise<number>,
  hostNow = Date.now(),
): Promise<number | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const now = await Promise.race([
    databaseTime.catch(() => undefined),
    new Promise<undefined>((resolve) => {
      timer = setTimeout(() => resolve(undefined), PARTIAL_SWEEP_CLOCK_WAIT_MS);
    }),
  ]);
  clearTimeout(timer);
  if (now === undefined) return undefined;
  return storage.abortIncompleteUploads(new Date(Math.min(now, hostNow) - PARTIAL_UPLOAD_MAX_AGE_MS));
}
/**
 * Errors of the local store's folder that no wait will fix: a path through a regular file, no
 * permission, a read-only file system. Start-up fails on them at once, saying which folder.
 */
const PERMANENT_LOCAL_ERRORS = new Set([
  "ENOTDIR",
  "EEXIST",
  "EACCES",
  "EPERM",
  "EROFS",
  "ELOOP",
  "ENAMETOOLONG",
]);

/** How long the token `--dev-token` makes works: a development session, not for ever. */
const DEV_TOKEN_DAYS = 30;

/**
 * The bound on a shutdown, after which the process exits 1 (the reaper covers what that leaves): the
 * worker's grace for running analyses (ASSAY_SHUTDOWN_GRACE_MS), then the kill grace of those still
 * running (SIGTERM to their groups, SIGKILL after ASSAY_KILL_GRACE_MS), then the wait for their output
 * to close after their exit (the runner's: the kill grace again, at least MIN_DRAIN_MS, and up to
 * MIN_DRAIN_MS to find a process that left the group), then the final writes. 46 s with the defaults.
 */
export function shutdownBoundMs(config: Pick<Config, "shutdownGraceMs" | "killGraceMs">): number {
  const drain = Math.max(config.killGraceMs, MIN_DRAIN_MS) + MIN_DRAIN_MS;
  return timerDelay(config.shutdownGraceMs + config.killGraceMs + drain + FINAL_WRITES_MS);
}

/**
 * Waits until the object store answers, retrying with a growing pause (a bucket that is down at start
 * is waited for, as a database is): the cause is logged each time, never a credential. A local
 * store's permanent error fails at once; `signal` (a shutdown) ends the wait.
 */
async function waitForStore(store: ObjectStore, logger: Logger, signal: AbortSignal): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    signal.throwIfAborted();
    try {
      await store.check();
      if (attempt > 1) logger.info({ storage: store.kind }, "object store reachable");
      return;
    } catch (err) {
      // Settings that cannot work (no region): time mends nothing, and the process said so only in a
      // warning repeated for ever.
      if (err instanceof StoreConfigError) throw err;
      const code = (err as NodeJS.ErrnoException).code;
      if (store instanceof LocalStore && code !== undefined && PERMANENT_LOCAL_ERRORS.has(code)) {
        throw new Error(
          `ASSAY_DATA_DIR cannot hold the stored files (${(err as Error).message}): point it at a folder this user can write`,
          { cause: err },
        );
      }
      const pauseMs = Math.min(10_000, 250 * 2 ** attempt);
      logger.warn({ err, storage: store.kind, retryInMs: pauseMs }, "object store unreachable; waiting");
      await sleep(pauseMs, undefined, { signal });
    }
  }
}

/**
 * Whether waitForDatabase waits out this failure of a first query: time may mend it. No answer
 * (NoAnswerError); no connection, or a cut one — an errno (`ECONNREFUSED`, `ENOENT` for a socket file
 * not there yet, `EAI_AGAIN`…) or postgres.js's own; PostgreSQL's connection errors (class 08, which a
 * pooler in front of a database that is down answers), its shutdown and start-up (57P01–57P03) and too
 * many connections (53300). Not: any other answer of PostgreSQL's (a wrong password, no such
 * database), TLS and certificate failures (`ERR_TLS_…`, `CERT_HAS_EXPIRED`…), postgres.js's protocol
 * and authentication errors — the steps after report those, and exit 1.
 */
export function databaseMayComeUp(err: unknown): boolean {
  if (err instanceof NoAnswerError) return true;
  const { name, code } = (err ?? {}) as { name?: unknown; code?: unknown };
  if (typeof code !== "string") return false;
  if (name === "PostgresError") return code.startsWith("08") || /^57P0[123]$/.test(code) || code === "53300";
  return /^E[A-Z]+$/.test(code) || code === "EAI_AGAIN" || CONNECTION_LOST.has(code);
}

/**
 * Waits until the database answers a query, as for the object store: each attempt, on a connection of
 * its own, waits at most DB_ANSWER_MS (postgres.js alone waited for ever for a database whose
 * connections are closed before it answers, and 30 s for each connection that never opens), and the
 * cause is logged each time (`err`, `reason`: postgres.js's errors name the host, never a credential).
 * A failure time does not mend (databaseMayComeUp) ends the wait: an answer that is an error (a wrong
 * password, no such database), a certificate that does not verify — the steps after report it, and
 * exit 1.
 * `signal` (a shutdown) ends the wait at once.
 */
async function waitForDatabase(
  url: string,
  applicationName: string,
  logger: Logger,
  signal: AbortSignal,
): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    signal.throwIfAborted();
    const probe = createDatabase(url, { max: 1, applicationName, connectTimeoutMs: BOUNDED_CONNECT_MS });
    try {
      await firstAnswer(probe.sql, DB_ANSWER_MS, signal);
      if (attempt > 1) logger.info("database reachable");
      return;
    } catch (err) {
      signal.throwIfAborted();
      // Only what time may mend is waited for; anything else (a wrong password, no such database, a
      // certificate that does not verify) is the steps' after to report, with exit 1 as before.
      if (!databaseMayComeUp(err)) return;
      const pauseMs = Math.min(10_000, 250 * 2 ** attempt);
      logger.warn(
        { err, reason: (err as Error).message, retryInMs: pauseMs },
        "database unreachable; waiting",
      );
      await sleep(pauseMs, undefined, { signal });
    } finally {
      await probe.close();
    }
  }
}

/**
 * What `process.on("unhandledRejection")` does in a server command. An unhandled rejection is an
 * unexpected error: it is passed on as an uncaught exception, on which close-with-grace shuts down
 * (`fail`). Except the one postgres.js leaves when a new connection dies while it reads the array
 * types (droppedTypeRead): during a database failover that shut every process down, though each only
 * has to connect again. That one is a warning.
 */
export function rejectionHandler(
  logger: Logger,
  fail: (err: unknown) => void = (err) => {
    (process.emit as (event: string, ...args: unknown[]) => boolean)(
      "uncaughtException",
      err,
      "unhandledRejection",
    );
  },
): (reason: unknown) => void {
  return (reason) => {
    if (droppedTypeRead(reason))
      logger.warn({ err: reason }, "a new database connection failed as it opened; it is opened again");
    else fail(reason);
  };
}

/**
 * HOST as the host of a link printed for this machine's user: an IPv6 address in brackets (`::1` →
 * `[::1]`; `http://:::3000` was no URL), and an address that listens on all of a family's
 * (`0.0.0.0`, `::`) — no address to connect to — as that family's loopback.
 */
export function linkHost(host: string): string {
  if (net.isIPv4(host)) return host === "0.0.0.0" ? "127.0.0.1" : host;
  if (!net.isIPv6(host)) return host;
  // Normalised by the URL parser (`0:0::0` is `::`), which takes no zone: a zone (`%eth0`) is put
  // back percent-encoded, as curl reads it.
  const [address = host, zone] = host.split("%");
  const normal = new URL(`http://[${address}]`).hostname.slice(1, -1);
  if (normal === "::") return "[::1]";
  return `[${normal}${zone === undefined ? "" : `%25${zone}`}]`;
}

/**
 * Start-up's look at the database's schema against this release's migrations (schemaState). Older
 * (`assay migrate` not run for this release): a worker would fail on a missing column at its first
 * claim, or write what the schema does not hold, so start-up fails (exit 1), naming the migrations
 * missing. Newer (the rolling upgrade's other half: a newer release migrated it): fine, as its
 * migrations only add; said once. Unmigrated (no migration at all): the first query's 42P01 says to
 * migrate (explained()).
 */
function heedSchema(state: SchemaState, logger: Logger): void {
  if (state.kind === "older") throw schemaTooOld(state);
  if (state.kind === "newer")
    logger.info(
      { applied: state.applied, expected: state.expected },
      "the database has migrations newer than this release (a newer release migrated it): running on it",
    );
}

/**
 * A file the banner's commands can upload as they are: the checkout's sample (`make dev` runs in the
 * checkout, and the README's quick start uses it), else a name to replace.
 */
const sampleCsv = () =>
  fs.existsSync("test/fixtures/csv/normal.csv") ? "test/fixtures/csv/normal.csv" : "data.csv";

/** Stops bin/early-signals.js holding stop signals; the first it held, if any (none when not run by bin/assay.js). */
function releaseEarlySignals(): NodeJS.Signals | undefined {
  const held = (globalThis as Record<symbol, { release(): NodeJS.Signals | undefined } | undefined>)[
    Symbol.for("assay.earlySignals")
  ];
  return held?.release();
}

/**
 * A listen that failed, said as what to do: a port that is taken (the message was Node's bare
 * `listen EADDRINUSE: address already in use 127.0.0.1:3000`) or one below 1024 for a user who may not.
 */
function listenProblem(err: unknown, host: string, [variable, port]: [string, number]): unknown {
  const code = (err as { code?: unknown } | undefined)?.code;
  if (code === "EADDRINUSE")
    return new Error(
      // (ASSAY_METRICS_PORT=0 turns the worker's /metrics off: no free port is picked for it.)
      `port ${port} on ${host} is taken: stop what listens there, or set ${variable} to another port${variable === "PORT" ? " (0 picks a free one)" : ""}`,
      { cause: err },
    );
  if (code === "EACCES")
    return new Error(
      port > 0 && port < 1024
        ? `port ${port} on ${host} needs privileges this user lacks: set ${variable} to 1024 or above`
        : `listening on port ${port} on ${host} was refused (EACCES: a security policy?): set ${variable} to another port`,
      { cause: err },
    );
  return err;
}

/** A missing table (42P01, undefined_table) is a database that `assay migrate` has not brought up to date. */
function explained(err: unknown): unknown {
  return (err as { code?: unknown } | undefined)?.code === "42P01"
    ? new Error("the database is not migrated to this version: run `assay migrate`", { cause: err })
    : err;
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
  for (const { name, nearest } of unknownVariables()) {
    logger.warn(
      { variable: name, ...(nearest ? { didYouMean: nearest } : {}) },
      "unknown ASSAY_ variable ignored: `assay config` lists the settings",
    );
  }

  // What start-up has opened so far: a shutdown, or a start-up that fails, closes exactly that.
  let database: OpenedDatabase | undefined;
  let server: Awaited<ReturnType<typeof import("../http/server.ts").buildServer>> | undefined;
  let worker: WorkerRuntime | undefined;
  /**
   * `assay api`'s look for silent pool connections (the worker runtime has its own, which `assay all`'s
   * shared pool uses): the gate looks only when a request comes, and a quiet API's requests would wait
   * on such a connection until the next one.
   */
  let silentSweep: SilentSweep | undefined;
  /** `assay worker`'s own /metrics endpoint (the API serves its registry itself). */
  let metricsServer: { close(): Promise<void> } | undefined;
  let closing: Promise<void> | undefined;
  const closeOpened = () => {
    closing ??= (async () => {
      // Each is closed whatever the others do; the first failure is reported after the database is
      // closed too (with Promise.all a failing worker stop skipped it, and left an embedded PostgreSQL).
      const closed = await Promise.allSettled([
        server?.close(),
        worker?.stop(),
        metricsServer?.close(),
        silentSweep?.stop(),
      ]);
      // Last: the pool, and an embedded database this process started.
      await database?.close();
      const failed = closed.find((c) => c.status === "rejected");
      if (failed) throw failed.reason;
    })();
    return closing;
  };
  /** Aborted by the first signal: start-up stops at its next step (a wait for the store at once). */
  const shutdown = new AbortController();
  let startup: Promise<void> = Promise.resolve();
  /** Why start-up failed, once it has. */
  let failure: { err: unknown } | undefined;
  /** The HTTP API listens: its requests may be using the pool. */
  let listening = false;

  const onRejection = rejectionHandler(logger);
  process.on("unhandledRejection", onRejection);
  // Installed before anything is opened: a signal during start-up (waiting for the store, starting or
  // migrating the embedded database) ends the step in progress and closes what was opened, instead of
  // killing the process and leaving a detached embedded PostgreSQL behind.
  const closer = closeWithGrace(
    { delay: shutdownBoundMs(cfg), logger, skip: ["unhandledRejection"] },
    async ({ signal, err }) => {
      if (err) logger.error({ err }, "shutting down after an unexpected error");
      else logger.info({ signal }, "shutting down");
      shutdown.abort();
      // Start-up waiting for a database that does not answer (each connection attempt waits up to 30 s,
      // and the API's caches and the worker each make one in turn) held the shutdown until the forced
      // exit. While no worker can have claimed anything yet, and no request can be using the pool (not
      // listening yet), end its connections at once: what start-up is waiting for fails, and it ends (a
      // step of it started after this checks the signal). Once listening, the server's close lets
      // requests in flight finish instead (a review: they got 500s).
      if (!listening && worker === undefined && database) void endPool(database.sql, 0);
      await startup.catch(() => {});
      await closeOpened();
      logger.info("stopped");
      // A signal while a failed start-up was closing: still a failure (exit 1).
      if (failure) throw failure.err;
    },
  );

  // A stop signal that came while the process loaded (held by bin/early-signals.js): sent again, now
  // that close-with-grace listens, so it ends the start as one that comes later does.
  const early = releaseEarlySignals();
  if (early) {
    logger.info({ signal: early }, "a stop signal came while the process loaded: stopping");
    process.kill(process.pid, early);
  }

  const start = async () => {
    const step = () => shutdown.signal.throwIfAborted();
    database = await openDatabase(cfg, logger, { applicationName: `assay-${mode}` });
    step();
    // Not the API: it listens whatever the database does (its /readyz says 503 meanwhile), as before —
    // unless it is to make a dev token, which needs the database. Nor a database this process has just
    // started and migrated: it answered.
    if (
      database.migrations === undefined &&
      (mode !== "api" || (values as { "dev-token"?: boolean })["dev-token"])
    )
      await waitForDatabase(database.url, `assay-${mode}`, logger, shutdown.signal);
    // The schema, where start-up needs the database (the worker, a dev token): one this release's code
    // cannot use fails the start, saying to run `assay migrate`. The API alone listens whatever the
    // database does (its /readyz says 503 until it is migrated) and says so in its log (below).
    const needsDatabase = mode !== "api" || (values as { "dev-token"?: boolean })["dev-token"] === true;
    if (needsDatabase) heedSchema(await schemaState(database.sql), logger);
    // Opens the pool's first connection (TCP, authentication) while the rest of the process loads,
    // not on the first request; a failure here is the first request's to report.
    database.sql`select 1`.catch(() => {});
    const storage = await openStore(cfg);
    if (storage instanceof LocalStore) {
      const swept = await removeStalePartialUploads(storage, databaseNow(database.sql));
      if (swept !== undefined && swept > 0)
        logger.info({ swept }, "removed partial uploads left by an earlier process");
    }
    await waitForStore(storage, logger, shutdown.signal);

    // `assay worker` without ASSAY_METRICS_PORT has no /metrics, so it keeps no metrics (and does not
    // load prom-client: ~20 MiB of its idle RSS and ~50 ms of its start, bench/startup.ts).
    const metrics =
      mode === "worker" && cfg.metricsPort === 0
        ? undefined
        : (await import("../metrics/registry.ts")).processRegistry();
    // Imported only where needed: a worker without the HTTP stack is smaller, and the cost of every
    // spawn (a fork) grows with the parent's resident memory.
    if (mode !== "worker" && metrics !== undefined) {
      const { buildServer } = await import("../http/server.ts");
      // Its caches open the LISTEN connection, which a shutdown's end of the pool cannot end if it does
      // not exist yet: after a signal it would wait for a database that does not answer.
      step();
      server = await buildServer(
        { config: cfg, database, storage, expectedMigrations: expectedMigrationCount(), metrics },
        logger,
      );
    }
    step();
    // Listening comes before the worker starts: a port that is taken fails the start before anything is
    // claimed. (After, a worker whose port was taken ran the runs it had claimed for its shutdown
    // grace, then gave them back — over and over under a supervisor that restarts it.)
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
      throw listenProblem(
        err,
        cfg.host,
        server ? ["PORT", cfg.port] : ["ASSAY_METRICS_PORT", cfg.metricsPort],
      );
    }
    listening = server !== undefined;
    if (mode === "api" && database) {
      // (After a signal during the listen, the shutdown's close has run: nothing is started then.)
      step();
      silentSweep = new SilentSweep({ database, logger });
      silentSweep.start();
    }
    if (!needsDatabase && server) {
      // Not awaited: a database that does not answer yet is /readyz's to report, not start-up's.
      schemaState(database.sql).then(
        (state) => {
          if (state.kind === "older")
            logger.error(`${schemaTooOld(state).message}; /readyz answers 503 until then`);
          else heedSchema(state, logger);
        },
        () => {},
      );
    }
    step();
    if (mode !== "api") {
      // A signal meanwhile: the worker is not started, or stopped by the shutdown before anything else.
      worker = await startWorkerRuntime(
        cfg,
        database,
        storage,
        logger,
        concurrency,
        metrics,
        shutdown.signal,
      );
      step();
    }
    // A user named dev that is not an admin is someone's account (the flag pointed at a database in
    // use): not made an admin, with every token of theirs (tokenCreate sets the role; a security
    // trial), and no token is printed.
    const devToken = (values as { "dev-token"?: boolean })["dev-token"] && server;
    const [devUser] = devToken
      ? await database.sql<{ role: string }[]>`select role from users where name = 'dev'`
      : [];
    if (devToken && devUser && devUser.role !== "admin")
      console.log(
        "\n--dev-token: a user named dev exists and is not an admin; it is not made one, and no development token was made (create one of your own: assay token create --user <name> --role admin)\n",
      );
    else if (devToken && server) {
      // A token per start, each good for DEV_TOKEN_DAYS: a development database restarted daily
      // collected an admin token a day that worked for ever.
      const { token } = await tokenCreate(database.sql, "dev", "admin", DEV_TOKEN_DAYS * 86_400);
      const address = `http://${linkHost(cfg.host)}:${(server.server.address() as { port: number }).port}`;
      const sample = sampleCsv();
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
          // The client commands' default server (DEFAULT_URL in client-common.ts, not imported: the
          // server loads none of the client); any other must be named.
          ...(address === "http://127.0.0.1:3000" ? [] : [`  export ASSAY_URL=${address}`]),
          "Try:",
          `  npx assay submit --type summary ${sample} --follow`,
          `  curl -s -H "Authorization: Bearer $ASSAY_TOKEN" -F file=@${sample} ${address}/api/files`,
          "",
        ].join("\n"),
      );
    }
  };
  // The signal also ends a wait for another start of the embedded database (its start lock).
  startup = startSignal.run(shutdown.signal, start);
  try {
    await startup;
  } catch (err) {
    // A signal's shutdown is under way: it closes what was opened and exits.
    if (shutdown.signal.aborted) return new Promise<number>(() => {});
    // Anything still open (the pool's connections, the group guard, an embedded database) would keep
    // the process alive, failed, forever: close it, and let the caller report the cause and exit 1.
    failure = { err };
    logger.error({ err }, "start-up failed; closing what was opened");
    try {
      await closeOpened();
    } catch (closeErr) {
      logger.warn({ err: closeErr }, "could not close everything start-up opened");
    }
    // Last: until now a signal still closed in order; after this, the process simply exits.
    if (!shutdown.signal.aborted) {
      closer.uninstall();
      // With close-with-grace's listener gone, it would pass rejections on to nobody: Node's own
      // handling (a crash) is back.
      process.off("unhandledRejection", onRejection);
    }
    throw explained(err);
  }
  // Keeps running until a signal; close-with-grace exits the process when shutdown is done.
  return new Promise<number>(() => {});
}
