// The lease reaper (DESIGN §4.7): a service every worker runs on a jittered interval. Safe to run
// everywhere at once: each statement takes its rows with FOR UPDATE SKIP LOCKED.
import type { Sql } from "../db/client.ts";
import type { Logger } from "../log.ts";
import type { QueueObserver } from "./observer.ts";
import { IntervalService } from "./service.ts";
import {
  queueOwnersPrune,
  type ReapResult,
  runFailUnserved,
  runReapExpired,
  workerDeleteStale,
  workerStaleMs,
} from "./sql.ts";

export interface ReaperOptions {
  sql: Sql;
  logger: Logger;
  intervalMs: number;
  leaseTtlMs: number;
  retryBaseMs: number;
  workerWaitMs: number;
  /** Rows per statement; a pass repeats until a batch comes back short. */
  batchSize?: number;
  /** Told about every pass (metrics). */
  observer?: QueueObserver;
  /**
   * Takes its own start for the end of an outage (see `outage`): nothing is reaped until a lease TTL
   * after its first answer, no type judged unserved until ASSAY_WORKER_WAIT_MS after it. What a
   * reaper knows of an outage is its own memory, and one started during or just after an outage (a
   * worker restarted by its supervisor meanwhile) saw none: its first pass took back the live runs
   * of workers whose heartbeats had not yet resumed — attempts used, minutes of work thrown away (a
   * trial, 2026-12-07). Every worker runtime's does (`assay worker`, and `assay all`); other workers' reapers cover what a
   * crashed installation left meanwhile, and a lone worker restarted after its own crash recovers its
   * dead attempts one TTL later than before.
   */
  graceAtStart?: boolean;
}

export interface ReapPass extends ReapResult {
  staleWorkers: number;
}

const DEFAULT_BATCH = 500;

export class Reaper extends IntervalService<ReapPass> {
  private readonly o: ReaperOptions;

  /**
   * Set when a pass found the database unreachable (it failed before any statement answered): no
   * worker could heartbeat its leases or advertise its types meanwhile either, so what expired then
   * says nothing about them. `since`: when a later pass reached it again (performance.now()). Until a
   * lease TTL after that, no lease is taken back nor worker row deleted; until ASSAY_WORKER_WAIT_MS
   * after it, no type is judged unserved. (The first pass after an outage longer than a lease took
   * back every live run, ahead of the heartbeats that would have renewed them.)
   */
  private outage: { since?: number } | undefined;

  constructor(o: ReaperOptions) {
    super("reaper", o.intervalMs, o.logger);
    this.o = o;
    if (o.graceAtStart) this.outage = {};
  }

  /** One full pass: expired leases, unserved types, stale workers. */
  async runOnce(): Promise<ReapPass> {
    const batchSize = this.o.batchSize ?? DEFAULT_BATCH;
    const options = { batchSize, retryBaseMs: this.o.retryBaseMs, workerWaitMs: this.o.workerWaitMs };
    const total: ReapPass = { requeued: 0, failed: 0, cancelled: 0, finishedTasks: 0, staleWorkers: 0 };
    let answered = false;
    const add = (r: ReapResult) => {
      answered = true;
      total.requeued += r.requeued;
      total.failed += r.failed;
      total.cancelled += r.cancelled;
      total.finishedTasks += r.finishedTasks;
      return r.requeued + r.failed + r.cancelled;
    };
    try {
      if (this.outage) {
        await this.o.sql`select 1`;
        answered = true;
        this.outage.since ??= performance.now();
      }
      const up =
        this.outage?.since === undefined ? Number.POSITIVE_INFINITY : performance.now() - this.outage.since;
      if (up >= Math.max(this.o.leaseTtlMs, this.o.workerWaitMs)) this.outage = undefined;
      if (up >= this.o.leaseTtlMs) {
        while (add(await runReapExpired(this.o.sql, options)) >= batchSize) {}
      }
      if (up >= this.o.workerWaitMs) {
        while (add(await runFailUnserved(this.o.sql, options)) >= batchSize) {}
      }
      if (up >= this.o.leaseTtlMs) {
        total.staleWorkers = await workerDeleteStale(this.o.sql, workerStaleMs(this.o.leaseTtlMs));
      }
      // Owners with nothing queued leave the claim's rotation (they rejoin with their next run).
      await queueOwnersPrune(this.o.sql);
    } catch (err) {
      if (!answered && unreachable(err)) this.outage = {};
      throw err;
    } finally {
      // Also when a later statement failed: what the earlier ones recovered has committed.
      this.o.observer?.reaped(total);
      if (total.requeued + total.failed + total.cancelled + total.staleWorkers > 0) {
        this.o.logger.info(total, "reaper recovered runs");
      }
    }
    return total;
  }
}

/**
 * Whether a failed statement says the workers could not have heartbeated either: no answer, a
 * connection lost, a FATAL error (a server starting or shutting down, no connection slot), or an
 * ERROR of the classes that stop every write — 08 connection, 25 (a read-only server in a failover),
 * 53 resources (disk full, out of memory), 57 operator intervention (a statement timeout under
 * overload), 58 system (I/O). Not an ERROR that blames the statement itself (a missing table, a bug):
 * that started the outage grace and held the reaping off for nothing.
 */
function unreachable(err: unknown): boolean {
  if (!(err instanceof Error) || err.name !== "PostgresError") return true;
  const { severity, code } = err as { severity?: unknown; code?: unknown };
  if (severity !== "ERROR") return true;
  return typeof code === "string" && ["08", "25", "53", "57", "58"].includes(code.slice(0, 2));
}
