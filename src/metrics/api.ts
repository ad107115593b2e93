// Prometheus metrics of an API process (GET /metrics): HTTP request durations, SSE subscribers, and
// queue gauges read from PostgreSQL at scrape time (so every API instance reports the same queue).
import type { FastifyInstance } from "fastify";
import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import type { Sql } from "../db/client.ts";
import type { EventHub } from "../events/hub.ts";

/** Registers the collectors in `registry` and the hooks; `/metrics` itself is a route in http/app.ts. */
export function apiMetrics(app: FastifyInstance, sql: Sql, hub: EventHub, registry: Registry): void {
  const duration = new Histogram({
    name: "assay_http_request_duration_seconds",
    help: "HTTP request durations by route, method and status code",
    labelNames: ["method", "route", "status_code"],
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers: [registry],
  });
  app.addHook("onResponse", async (request, reply) => {
    const route = request.routeOptions.url ?? "unmatched";
    if (route === "/metrics") return;
    duration.observe(
      { method: request.method, route, status_code: String(reply.statusCode) },
      reply.elapsedTime / 1000,
    );
  });
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
  const scrapeErrors = new Counter({
    name: "assay_metrics_scrape_errors_total",
    help: "Scrapes whose database queries failed",
    registers: [registry],
  });
  // The queue gauges are read from PostgreSQL once per scrape: every one of them awaits the same read
  // (the registry collects metrics concurrently). The partial indexes on runs serve both run queries.
  let reading: Promise<void> | undefined;
  const refresh = () => {
    reading ??= read().finally(() => {
      reading = undefined;
    });
    return reading;
  };
  const queueGauge = (name: string, help: string, labelNames: string[]) =>
    new Gauge({ name, help, labelNames, registers: [registry], collect: () => refresh() });
  const depth = queueGauge("assay_queue_depth", "Queued runs by analysis type (due now or later)", [
    "analysis_type",
  ]);
  const oldest = queueGauge(
    "assay_queue_oldest_age_seconds",
    "Age of the oldest queued run by analysis type",
    ["analysis_type"],
  );
  const live = queueGauge("assay_runs_live", "Runs with a live attempt, by analysis type and status", [
    "analysis_type",
    "status",
  ]);
  const outcomes = queueGauge(
    "assay_runs_finished",
    "Finished runs by analysis type and outcome (from the task counters)",
    ["analysis_type", "status"],
  );

  async function read(): Promise<void> {
    try {
      const queued = await sql<{ type: string; n: number; age: number }[]>`
        select analysis_type as type, count(*)::int as n,
               coalesce(extract(epoch from now() - min(created_at)), 0)::float8 as age
        from runs where status = 'queued' group by analysis_type`;
      const running = await sql<{ type: string; status: string; n: number }[]>`
        select analysis_type as type, status, count(*)::int as n
        from runs where status in ('starting', 'running', 'cancelling') group by 1, 2`;
      const finished = await sql<{ type: string; s: number; f: number; t: number; c: number }[]>`
        select analysis_type as type, sum(succeeded_count)::int as s, sum(failed_count)::int as f,
               sum(timed_out_count)::int as t, sum(cancelled_count)::int as c
        from tasks group by analysis_type`;
      depth.reset();
      oldest.reset();
      live.reset();
      outcomes.reset();
      for (const q of queued) {
        depth.set({ analysis_type: q.type }, q.n);
        oldest.set({ analysis_type: q.type }, q.age);
      }
      for (const r of running) live.set({ analysis_type: r.type, status: r.status }, r.n);
      for (const f of finished) {
        outcomes.set({ analysis_type: f.type, status: "succeeded" }, f.s);
        outcomes.set({ analysis_type: f.type, status: "failed" }, f.f);
        outcomes.set({ analysis_type: f.type, status: "timed_out" }, f.t);
        outcomes.set({ analysis_type: f.type, status: "cancelled" }, f.c);
      }
    } catch {
      scrapeErrors.inc();
    }
  }
}
