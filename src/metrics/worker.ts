// Prometheus metrics of a worker process: claims, live attempts, attempt durations by outcome, lost
// leases, retries and reaped runs. Implements the queue's observer, so the queue knows nothing of
// prom-client. `assay worker` serves them on ASSAY_METRICS_PORT; `assay all` on the API's /metrics.
import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import type { QueueObserver } from "../queue/observer.ts";

const SECONDS_FAST = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1];
const SECONDS_WAIT = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800];
const SECONDS_RUN = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600];

/** Registers the worker's metrics in `registry`; `types` are the analysis types it executes. */
export function workerMetrics(registry: Registry, types: readonly string[]): QueueObserver {
  const registers = [registry];
  const claimDuration = new Histogram({
    name: "assay_claim_duration_seconds",
    help: "Round trip of one claim statement, by analysis type",
    labelNames: ["analysis_type"],
    buckets: SECONDS_FAST,
    registers,
  });
  const claimLatency = new Histogram({
    name: "assay_claim_latency_seconds",
    help: "How long a run waited between becoming due (created or retry time reached) and being claimed",
    labelNames: ["analysis_type"],
    buckets: SECONDS_WAIT,
    registers,
  });
  const live = new Gauge({
    name: "assay_worker_attempts_live",
    help: "Attempts (analysis processes) running in this worker, by analysis type",
    labelNames: ["analysis_type"],
    registers,
  });
  const duration = new Histogram({
    name: "assay_run_duration_seconds",
    help: "Attempt durations by analysis type and outcome (succeeded, failed, timed_out, cancelled, retried, requeued, storage, lost)",
    labelNames: ["analysis_type", "outcome"],
    buckets: SECONDS_RUN,
    registers,
  });
  const leaseLosses = new Counter({
    name: "assay_lease_losses_total",
    help: "Leases this worker found gone: by a heartbeat, or when its completion was fenced off",
    labelNames: ["analysis_type", "how"],
    registers,
  });
  const retries = new Counter({
    name: "assay_run_retries_total",
    help: "Runs sent back to the queue by this worker: transient failures (with backoff), shutdown and object store outages (attempt refunded)",
    labelNames: ["analysis_type", "reason"],
    registers,
  });
  const reaped = new Counter({
    name: "assay_reaped_runs_total",
    help: "Runs recovered by this worker's reaper, by what became of them",
    labelNames: ["outcome"],
    registers,
  });
  const reapedWorkers = new Counter({
    name: "assay_reaped_workers_total",
    help: "Worker registrations with stale heartbeats deleted by this worker's reaper",
    registers,
  });
  // Zeroes, so every series exists from the first scrape (rate() needs a starting point).
  for (const type of types) {
    live.set({ analysis_type: type }, 0);
    for (const reason of ["transient", "shutdown", "storage"])
      retries.inc({ analysis_type: type, reason }, 0);
    for (const how of ["heartbeat", "fenced"]) leaseLosses.inc({ analysis_type: type, how }, 0);
  }
  for (const outcome of ["requeued", "failed", "cancelled"]) reaped.inc({ outcome }, 0);

  return {
    claimed(type, seconds, waited) {
      claimDuration.observe({ analysis_type: type }, seconds);
      for (const w of waited) claimLatency.observe({ analysis_type: type }, Math.max(0, w));
    },
    attemptLive(type, delta) {
      live.inc({ analysis_type: type }, delta);
    },
    attemptEnded(type, outcome, seconds) {
      duration.observe({ analysis_type: type, outcome }, seconds);
      if (outcome === "retried") retries.inc({ analysis_type: type, reason: "transient" });
      if (outcome === "requeued") retries.inc({ analysis_type: type, reason: "shutdown" });
      if (outcome === "storage") retries.inc({ analysis_type: type, reason: "storage" });
    },
    leaseLost(type, how) {
      leaseLosses.inc({ analysis_type: type, how });
    },
    reaped(pass) {
      reaped.inc({ outcome: "requeued" }, pass.requeued);
      reaped.inc({ outcome: "failed" }, pass.failed);
      reaped.inc({ outcome: "cancelled" }, pass.cancelled);
      reapedWorkers.inc(pass.staleWorkers);
    },
  };
}
