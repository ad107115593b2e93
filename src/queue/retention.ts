// Retention (maintenance): deletes terminal tasks finished more than ASSAY_RETENTION_DAYS ago — their
// runs and events go with them (the trigger tasks_delete_children) — and then their output objects, a few tasks per
// statement, so the queue tables stay small. A service with start/stop/runOnce; safe to run in every
// worker at once (SKIP LOCKED). Uploaded input files are not touched. The first pass comes within a
// minute of start (FIRST_PASS_WITHIN_MS), not an interval (an hour by default) later: a worker that
// lives less than an interval still runs it.
import type { Sql } from "../db/client.ts";
import type { Logger } from "../log.ts";
import { type ObjectStore, taskOutputsPrefix } from "../storage/store.ts";
import { FIRST_PASS_WITHIN_MS, IntervalService, loggedFailure } from "./service.ts";
import { taskDeleteExpired } from "./sql.ts";

export interface RetentionOptions {
  sql: Sql;
  logger: Logger;
  store: ObjectStore;
  retentionDays: number;
  intervalMs: number;
  /** Tasks per statement. */
  batchSize?: number;
  /** Runs per statement: tasks are taken, oldest first, while their runs fit (always one). */
  runBudget?: number;
  /** The first pass comes at a random moment within this long of start() (at most intervalMs). */
  firstPassWithinMs?: number;
}

const DEFAULT_BATCH = 20;
/**
 * Runs deleted per statement, with their events (a finished run has ~3–5): a 100,000-run task goes
 * alone, in ~1–2 s, and small tasks still go twenty at a time.
 */
const DEFAULT_RUN_BUDGET = 10_000;

export class Retention extends IntervalService<number> {
  private readonly o: RetentionOptions;

  constructor(o: RetentionOptions) {
    super("retention", o.intervalMs, o.logger, o.firstPassWithinMs ?? FIRST_PASS_WITHIN_MS);
    this.o = o;
  }

  /** Deletes everything due, batch by batch; returns how many tasks went. */
  async runOnce(): Promise<number> {
    const batch = this.o.batchSize ?? DEFAULT_BATCH;
    const runBudget = this.o.runBudget ?? DEFAULT_RUN_BUDGET;
    let total = 0;
    try {
      for (;;) {
        const deleted = await taskDeleteExpired(this.o.sql, this.o.retentionDays, batch, runBudget);
        total += deleted.length;
        // After the commit: a crash here leaves objects of deleted tasks (the store sweep removes
        // them), never rows without outputs. A store that fails one task's deletion (a 503 from a
        // bucket) does not stop the others': their rows are gone, and nothing but the sweep, once its
        // walk reaches their keys (weeks later in a big store), would find their objects again.
        let failure: { err: unknown } | undefined;
        for (const id of deleted) {
          try {
            await this.o.store.deletePrefix(taskOutputsPrefix(id));
          } catch (err) {
            this.o.logger.warn({ err, taskId: id }, "retention could not delete a task's outputs");
            failure ??= { err };
            // stop() waits for this pass: a store that hangs must not hold it for every task.
            if (this.stopping) break;
          }
        }
        // The pass ends at a failure (the store may be down): the tasks still due wait for the next.
        if (failure) throw loggedFailure(failure.err);
        if (deleted.length === 0 || this.stopping) break;
      }
    } finally {
      if (total > 0) this.o.logger.info({ tasks: total }, "retention removed finished tasks");
    }
    return total;
  }
}
