// The production worker of `assay worker` / `assay all`: the programs this machine can run, their
// process handlers, the queue worker, the reaper and the other background passes.

import { spawnSync } from "node:child_process";
import type { Registry } from "prom-client";
import type { AnalysisType } from "../analyses/names.ts";
import { findPrograms, resolveExecutable } from "../analyses/programs.ts";
import { type Config, typeSettings } from "../config.ts";
import type { Database } from "../db/client.ts";
import { SilentSweep } from "../db/silent.ts";
import type { Logger } from "../log.ts";
import { NO_OBSERVER } from "../queue/observer.ts";
import { Reaper } from "../queue/reaper.ts";
import { Retention } from "../queue/retention.ts";
import { StoreSweep } from "../queue/store-sweep.ts";
import { type TypeOptions, Worker } from "../queue/worker.ts";
import { GroupGuard } from "../runner/group-guard.ts";
import { discardAttempt, processHandler, removeLeftovers } from "../runner/handler.ts";
import type { ChildMemory } from "../runner/run-process.ts";
import { openWorkDir } from "../runner/workdir.ts";
import type { ObjectStore } from "../storage/store.ts";

export interface WorkerRuntime {
  worker: Worker;
  reaper: Reaper;
  /** Stops claiming, lets analyses finish for the grace period, then aborts and re-queues the rest. */
  stop(): Promise<void>;
}

export async function startWorkerRuntime(
  config: Config,
  database: Database,
  store: ObjectStore,
  logger: Logger,
  concurrency: number,
  /** Where the worker's metrics go; undefined when nobody can read them (no /metrics to serve). */
  metrics: Registry | undefined,
  /** A shutdown that began while this was starting: the worker is not started (nothing is claimed). */
  signal?: AbortSignal,
): Promise<WorkerRuntime> {
  const sql = database.sql;
  const found = findPrograms({
    ...(config.python ? { python: config.python } : {}),
    ...(config.rscript ? { rscript: config.rscript } : {}),
  });
  for (const m of found.missing) {
    logger.warn({ analysisType: m.type, reason: m.reason }, "this worker will not claim this analysis type");
  }
  const memory = childMemoryLimit(config, logger);
  const work = await openWorkDir(config.dataDir);
  let guard: GroupGuard;
  try {
    guard = GroupGuard.start(() =>
      logger.error(
        "the group guard process ended: analyses of this worker will outlive it if it is killed outright",
      ),
    );
  } catch (err) {
    // spawn() throws some errors (ENOMEM) instead of emitting them: the scratch folder goes too.
    await work.close();
    throw err;
  }
  try {
    const types: Record<string, TypeOptions> = {};
    for (const program of found.available) {
      const settings = typeSettings(config, program.type as AnalysisType);
      types[program.type] = {
        handler: processHandler(program, {
          store,
          workDir: work.dir,
          killGraceMs: config.killGraceMs,
          guard,
          nice: config.childNice,
          ...(memory ? { memory } : {}),
        }),
        globalLimit: settings.concurrency,
        timeoutMs: settings.timeoutMs,
      };
      logger.info({ analysisType: program.type, executable: program.executable }, "analysis type available");
    }
    // prom-client is loaded only when its metrics can be read: it is ~20 MiB of a worker's idle RSS.
    const observer = metrics
      ? (await import("../metrics/worker.ts")).workerMetrics(metrics, Object.keys(types))
      : NO_OBSERVER;
    const worker = new Worker({
      sql,
      logger,
      types,
      concurrency,
      leaseTtlMs: config.leaseTtlMs,
      pollIntervalMs: config.pollIntervalMs,
      retryBaseMs: config.retryBaseMs,
      prefetch: config.prefetch,
      prefetchWindowMs: config.prefetchWindowMs,
      completionDelayMs: config.completionDelayMs,
      userLimit: config.userConcurrency,
      onDiscard: discardAttempt(store),
      onRecorded: removeLeftovers(store),
      observer,
      unavailable: found.missing,
    });
    const reaper = new Reaper({
      sql,
      logger,
      intervalMs: config.reapIntervalMs,
      leaseTtlMs: config.leaseTtlMs,
      retryBaseMs: config.retryBaseMs,
      workerWaitMs: config.workerWaitMs,
      observer,
      // It cannot know whether the database was away just before it started (see graceAtStart).
      graceAtStart: true,
    });
    const retention = new Retention({
      sql,
      logger,
      store,
      retentionDays: config.retentionDays,
      intervalMs: config.retentionIntervalMs,
    });
    // Objects no row references (a crash between storing and recording): as often as retention runs.
    const sweep = new StoreSweep({ sql, logger, store, intervalMs: config.retentionIntervalMs });
    // Pool connections that stop answering without closing (a failover): closed when the database
    // says it is not working on them, or claims, heartbeats and completions wait ~15 minutes on them.
    const silent = new SilentSweep({ database, logger });
    // Opening the scratch folder can take a while (it removes what dead workers left there).
    signal?.throwIfAborted();
    await worker.start();
    reaper.start();
    retention.start();
    sweep.start();
    silent.start();
    return {
      worker,
      reaper,
      stop: async () => {
        // Claiming stops at once (worker.stop sets its flag before it awaits anything), not after a
        // background pass in progress ends: a retention pass deleting a big task's outputs can take
        // minutes, and a run claimed meanwhile would be started only to be aborted.
        await Promise.all([
          worker.stop(config.shutdownGraceMs),
          reaper.stop(),
          retention.stop(),
          sweep.stop(),
          silent.stop(),
        ]);
        await guard.close();
        await work.close();
      },
    };
  } catch (err) {
    // Start-up failed (an unmigrated database, say): the helper process and the scratch folder would
    // outlive it, and the helper keeps this process alive.
    await guard.close();
    await work.close();
    throw err;
  }
}

/**
 * The analyses' memory limit (ASSAY_CHILD_MEMORY_MB) and the prlimit that sets it, as the worker's
 * handlers get it; undefined (said once in the log) when it is 0, or prlimit (util-linux) is missing
 * (not Linux, a minimal image), or cannot set it: a limit above this process's own hard limit would
 * fail every run at its start ("failed to set the DATA resource limit"), so it is tried once here, on
 * `true`. bench/e2e.ts takes it from here too.
 */
export function childMemoryLimit(
  config: Pick<Config, "childMemoryMb">,
  logger: Logger,
): ChildMemory | undefined {
  if (config.childMemoryMb <= 0) return undefined;
  const prlimit = resolveExecutable("prlimit");
  if (!prlimit) {
    logger.warn(
      { childMemoryMb: config.childMemoryMb },
      "ASSAY_CHILD_MEMORY_MB is not enforced: prlimit (util-linux) is not on PATH",
    );
    return undefined;
  }
  const memory = { bytes: config.childMemoryMb * 2 ** 20, prlimit };
  const tryOn = resolveExecutable("true");
  if (tryOn) {
    const tried = spawnSync(prlimit, [`--data=${memory.bytes}`, "--", tryOn], { encoding: "utf8" });
    if (tried.status !== 0) {
      logger.warn(
        { childMemoryMb: config.childMemoryMb, err: tried.error, stderr: tried.stderr?.trim() },
        "ASSAY_CHILD_MEMORY_MB is not enforced: prlimit cannot set it (above this process's hard limit?)",
      );
      return undefined;
    }
  }
  return memory;
}
