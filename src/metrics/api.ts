// Prometheus metrics of an API process (GET /metrics): HTTP request durations, SSE subscribers, and
// queue gauges read from PostgreSQL at scrape time (so every API instance reports the same queue).
import type { FastifyInstance } from "fastify";
import type { TransactionSql } from "postgres";
import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import { ANALYSIS_TYPES } from "../analyses/names.ts";
import type { Sql } from "../db/client.ts";
import type { EventHub } from "../events/hub.ts";

/**
 * How long a scrape waits for the queue read from PostgreSQL. Below Prometheus's default scrape timeout
 * (10 s), so that a database that does not answer costs a scrape its queue gauges, not everything.
 */
export const QUEUE_READ_TIMEOUT_MS = 5000;
/**
 * How long PostgreSQL lets each statement of that read run before it cancels it (statement_timeout,
 * set for the read's transaction). A read held up for good (a lock that is never released) held a
 * pool connection until TCP keepalive ended it, which for a lock is never. Well above
 * QUEUE_READ_TIMEOUT_MS: a read held up for a while is still shared by the scrapes that follow.
 */
export const QUEUE_READ_CANCEL_MS = 30_000;
/** A read of the finished totals that took longer than this is reused for a while (see readIn()). */
const FINISHED_CHEAP_MS = 20;
/** ...until this many times its duration has passed, or FINISHED_MAX_AGE_MS, whichever comes first. */
const FINISHED_SPACING = 100;
/** A read slowed by a moment's load must not freeze the totals for long. */
const FINISHED_MAX_AGE_MS = 60_000;

interface FinishedRow {
  type: string;
  s: number;
  f: number;
  t: number;
  c: number;
}

interface QueueRead {
  queued: { type: string; n: number; age: number }[];
  running: { type: string; status: string; expired: boolean; n: number }[];
  finished: FinishedRow[];
}

declare module "fastify" {
  interface FastifyInstance {
    /**
     * Counts in assay_http_request_duration_seconds an answer that no `onResponse` hook sees, under the
     * route label of a request no route matched (UNMATCHED): the router's own refusals (a URL it cannot
     * decode, answered by http/server.ts's frameworkError) and Node's 417 for an unknown `Expect`. Set
     * by apiMetrics; absent without it.
     */
    observeUnrouted?: (method: string, statusCode: number, seconds: number) => void;
  }
}

/**
 * The route label of a request no route matched (a 404, a 405, a URL the router refused): one value,
 * never the path, which is the client's to vary without bound (and a /view/ link's is a capability).
 */
export const UNMATCHED = "unmatched";

/** Registers the collectors in `registry` and the hooks; `/metrics` itself is a route in http/app.ts. */
export function apiMetrics(
  app: FastifyInstance,
  sql: Sql,
  hub: EventHub,
  registry: Registry,
  /** The bounds of the queue read (tests shorten them). */
  bounds = { waitMs: QUEUE_READ_TIMEOUT_MS, cancelMs: QUEUE_READ_CANCEL_MS },
): void {
  const duration = new Histogram({
    name: "assay_http_request_duration_seconds",
    help: "HTTP request durations by route, method and status code",
    labelNames: ["method", "route", "status_code"],
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers: [registry],
  });
  // The method is as the request gave it: Node's parser takes only the methods it knows (a few dozen),
  // so the label stays bounded as the route's does.
  const observe = (method: string, route: string, statusCode: number, seconds: number) =>
    duration.observe({ method, route, status_code: String(statusCode) }, seconds);
  app.addHook("onResponse", async (request, reply) => {
    const route = request.routeOptions.url ?? UNMATCHED;
    if (route === "/metrics") return;
    observe(request.method, route, reply.statusCode, reply.elapsedTime / 1000);
  });
  // A request whose client left before its response was complete (an event stream the client closed,
  // an upload or download cut off) gets no onResponse: counted here, not timed. Until 2026-12-07 such
  // requests were not counted at all — most event streams end so.
  const aborted = new Counter({
    name: "assay_http_requests_aborted_total",
    help: "HTTP requests whose connection closed before the response was complete (the client left, or the server cut off a stalled event stream), by route and method",
    labelNames: ["method", "route"],
    registers: [registry],
  });
  app.addHook("onRequestAbort", async (request) => {
    const route = request.routeOptions.url ?? UNMATCHED;
    if (route !== "/metrics") aborted.inc({ method: request.method, route });
  });
  app.decorate("observeUnrouted", (method: string, statusCode: number, seconds: number) =>
    observe(method, UNMATCHED, statusCode, seconds),
  );
  new Gauge({
    name: "assay_sse_subscribers",
    help: "Server-Sent Events streams attached to this process",
    registers: [registry],
    collect() {
      this.set(hub.size);
    },
  });
  new Counter({
    name: "assay_event_notifications_total",
    help: "Event notifications received by this process's listener, by kind: events (carried in the payload) or doorbell (too large to carry: read from the table)",
    labelNames: ["kind"],
    registers: [registry],
    collect() {
      this.reset();
      this.inc({ kind: "events" }, hub.received.notifications - hub.received.doorbells);
      this.inc({ kind: "doorbell" }, hub.received.doorbells);
    },
  });
  // The queue gauges are read from PostgreSQL at scrape time: every one of them (and the error counter,
  // so that a failure is counted in the scrape it spoiled) awaits the same read — the registry collects
  // metrics concurrently. A scrape waits at most QUEUE_READ_TIMEOUT_MS for it: a database that does not
  // answer (down, unreachable, the pool busy) must not cost the scrape its other metrics, which
  // Prometheus would drop whole at its scrape timeout. A read that failed or did not answer in time
  // leaves the queue gauges out of that scrape — never last scrape's values passed off as now's — and
  // counts an error. A read still running is awaited by the next scrape rather than started again, so
  // a slow database gets one read at a time. The partial indexes on runs serve both run queries.
  const scrapeErrors = new Counter({
    name: "assay_metrics_scrape_errors_total",
    help: "Scrapes whose queue read failed or did not answer in time (the queue gauges are left out of them)",
    registers: [registry],
    collect: () => refresh(),
  });
  let scrape: Promise<void> | undefined;
  const refresh = () => {
    scrape ??= update().finally(() => {
      scrape = undefined;
    });
    return scrape;
  };
  const queueGauge = (name: string, help: string, labelNames: string[]) =>
    new Gauge({ name, help, labelNames, registers: [registry], collect: () => refresh() });
  // Read from the database, so every API instance reports the same whole-queue values: aggregate
  // them across instances with max(), never sum().
  const whole = " (the whole queue: the same on every API instance)";
  const depth = queueGauge("assay_queue_depth", `Queued runs by analysis type, due now or later${whole}`, [
    "analysis_type",
  ]);
  const oldest = queueGauge(
    "assay_queue_oldest_age_seconds",
    `Age of the oldest queued run by analysis type, 0 when none is queued${whole}`,
    ["analysis_type"],
  );
  const live = queueGauge(
    "assay_runs_live",
    `Runs with a live attempt (a lease not yet expired), by analysis type and status${whole}`,
    ["analysis_type", "status"],
  );
  const leaseExpired = queueGauge(
    "assay_runs_lease_expired",
    `Runs whose worker stopped renewing their lease (gone): starting, running or cancelling in the table, run by nobody until a worker's reaper takes them back${whole}`,
    ["analysis_type"],
  );
  const outcomes = queueGauge(
    "assay_runs_finished",
    `Finished runs by analysis type and outcome, from the task counters (falls as retention deletes tasks)${whole}`,
    ["analysis_type", "status"],
  );
  const gauges = [depth, oldest, live, leaseExpired, outcomes];
  const LIVE = ["starting", "running", "cancelling"] as const;
  const OUTCOMES = ["succeeded", "failed", "timed_out", "cancelled"] as const;

  let reading: Promise<QueueRead> | undefined;
  let finished: { rows: FinishedRow[]; at: number; tookMs: number } | undefined;

  async function update(): Promise<void> {
    reading ??= read().finally(() => {
      reading = undefined;
    });
    let timer: NodeJS.Timeout | undefined;
    try {
      const r = await Promise.race([
        reading,
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new Error(`the queue read did not answer within ${bounds.waitMs} ms`)),
            bounds.waitMs,
          );
        }),
      ]);
      for (const g of gauges) g.reset();
      // Every analysis type Assay knows is reported, at zero when it has nothing: a series that
      // vanished when its queue drained read as "no data" (a sum() over none is empty, not 0).
      for (const analysis_type of ANALYSIS_TYPES) {
        depth.set({ analysis_type }, 0);
        oldest.set({ analysis_type }, 0);
        leaseExpired.set({ analysis_type }, 0);
        for (const status of LIVE) live.set({ analysis_type, status }, 0);
        for (const status of OUTCOMES) outcomes.set({ analysis_type, status }, 0);
      }
      for (const q of r.queued) {
        depth.set({ analysis_type: q.type }, q.n);
        oldest.set({ analysis_type: q.type }, q.age);
      }
      for (const x of r.running) {
        if (x.expired) leaseExpired.inc({ analysis_type: x.type }, x.n);
        else live.inc({ analysis_type: x.type, status: x.status }, x.n);
      }
      for (const f of r.finished) {
        outcomes.set({ analysis_type: f.type, status: "succeeded" }, f.s);
        outcomes.set({ analysis_type: f.type, status: "failed" }, f.f);
        outcomes.set({ analysis_type: f.type, status: "timed_out" }, f.t);
        outcomes.set({ analysis_type: f.type, status: "cancelled" }, f.c);
      }
    } catch (err) {
      for (const g of gauges) g.reset();
      scrapeErrors.inc();
      app.log.warn({ err }, "metrics: the queue read failed; the queue gauges are left out of this scrape");
    } finally {
      clearTimeout(timer);
    }
  }

  // In a transaction of its own, for a statement_timeout of its own (QUEUE_READ_CANCEL_MS): local to
  // the transaction, so it never stays on the pool's connection (nor on a transaction pooler's).
  function read(): Promise<QueueRead> {
    return sql.begin(async (tx) => {
      await tx`select set_config('statement_timeout', ${String(bounds.cancelMs)}, true)`;
      return readIn(tx);
    });
  }

  // Counts and sums leave PostgreSQL as float8: a bigint would come back as text, and a cast to int
  // fails the whole read once a type's total passes 2^31 (a month of retention at 830 runs/s).
  async function readIn(sql: TransactionSql): Promise<QueueRead> {
    const queued = await sql<{ type: string; n: number; age: number }[]>`
      select analysis_type as type, count(*)::float8 as n,
             coalesce(extract(epoch from now() - min(created_at)), 0)::float8 as age
      from runs where status = 'queued' group by analysis_type`;
    // A run whose lease has expired is run by nobody: its worker is gone (killed, its machine lost)
    // and only a worker's reaper takes it back, so with every worker gone it stays `running` for
    // good. It was counted live all that time; it is counted apart now, expired by the reaper's own
    // test. runs_live_idx holds both columns.
    const running = await sql<{ type: string; status: string; expired: boolean; n: number }[]>`
      select analysis_type as type, status, coalesce(lease_expires_at < now(), false) as expired,
             count(*)::float8 as n
      from runs where status in ('starting', 'running', 'cancelling') group by 1, 2, 3`;
    // The totals sum the counters of every task, a scan of the whole table (~0.3 s of PostgreSQL's
    // time at a million tasks): a read that took over FINISHED_CHEAP_MS is reused until
    // FINISHED_SPACING times as long has passed (at most a minute), so an API instance spends ~1% of
    // the database's time on it at most however often it is scraped (past 0.6 s a read, one read a
    // minute). A small table is read afresh on every scrape.
    const now = performance.now();
    if (
      finished === undefined ||
      finished.tookMs <= FINISHED_CHEAP_MS ||
      now - finished.at >= Math.min(FINISHED_SPACING * finished.tookMs, FINISHED_MAX_AGE_MS)
    ) {
      const rows = await sql<FinishedRow[]>`
        select analysis_type as type, sum(succeeded_count)::float8 as s, sum(failed_count)::float8 as f,
               sum(timed_out_count)::float8 as t, sum(cancelled_count)::float8 as c
        from tasks group by analysis_type`;
      const at = performance.now();
      finished = { rows, at, tookMs: at - now };
    }
    return { queued, running, finished: finished.rows };
  }
}
