// The worker (DESIGN §4): claims runs of the types it can execute, runs them through handlers,
// heartbeats its leases, and completes finished attempts in batches. A service: start/stop, and a
// runOnce() (one claim cycle) that tests call directly.

import { randomBytes } from "node:crypto";
import os from "node:os";
import type { Sql } from "../db/client.ts";
import { listenAll } from "../db/listen.ts";
import type { Logger } from "../log.ts";
import { timerDelay } from "../timers.ts";
import { jitter, sleep } from "./backoff.ts";
import { type AttemptOutcome, NO_OBSERVER, type QueueObserver } from "./observer.ts";
import {
  type AbortReason,
  decide,
  type Ending,
  effectiveReason,
  type Handler,
  type HandlerContext,
  type HandlerOutcome,
  unrecordable,
  unrecordableRetry,
} from "./outcomes.ts";
import {
  CANCEL_CHANNEL,
  CLAIM_QUANTUM,
  type ClaimedRun,
  type ClaimOptions,
  type CompletionResult,
  type CreatedTask,
  claimQuantum,
  type Lease,
  type Outcome,
  queueOwnersPruneIdle,
  type RetriesRecorded,
  type Retry,
  type RetryResult,
  runClaim,
  runClaimNewcomer,
  runClaimOrphans,
  runClaimSole,
  runClaimTurn,
  runComplete,
  runEndingsRecorded,
  runHeartbeat,
  runProgress,
  runRetriesRecorded,
  runRetry,
  runWake,
  runWakeOwnersTypes,
  TASK_CREATED_CHANNEL,
  type TypeUnavailable,
  WAKEUP_CHANNEL,
  workerDelete,
  workerHeartbeat,
  workerRegister,
} from "./sql.ts";

export type { AbortReason, ClaimedRun, Handler, HandlerContext, HandlerOutcome };

export interface TypeOptions {
  handler: Handler;
  /** Global limit on live runs of the type across all workers; 0 or absent = none. */
  globalLimit?: number;
  /** Wall-clock limit of one attempt; the handler's signal is aborted with "timeout". */
  timeoutMs?: number;
}

export interface WorkerOptions {
  sql: Sql;
  logger: Logger;
  types: Record<string, TypeOptions>;
  /** Handlers running at once in this process. */
  concurrency: number;
  leaseTtlMs: number;
  pollIntervalMs: number;
  retryBaseMs: number;
  /** Runs claimed ahead of free slots, whatever the runs' length (ASSAY_PREFETCH). */
  prefetch?: number;
  /**
   * While a type's attempts are short, claim ahead as many runs as keep the slots busy for this long
   * (autoPrefetch; ASSAY_PREFETCH_WINDOW_MS); 0 or absent: only the fixed prefetch.
   */
  prefetchWindowMs?: number;
  /**
   * How long a finished attempt's outcome may wait to be recorded with others in one completion
   * statement (ASSAY_COMPLETION_DELAY_MS); 0 or absent: recorded at once. See queueOutcome for
   * when a batch is recorded before the delay is over.
   */
  completionDelayMs?: number;
  /** Most live runs of one owner across all workers (ASSAY_USER_CONCURRENCY); 0 or absent = none. */
  userLimit?: number;
  /** Progress flush interval and the age an attempt must reach before its first write (PROGRESS_FLUSH_MS). */
  progressFlushMs?: number;
  /** Called for an attempt whose outcome was fenced off or abandoned (its output must go). */
  onDiscard?: (run: ClaimedRun) => Promise<void>;
  /**
   * Called once an attempt's terminal outcome is recorded (no other attempt of the run can win now),
   * with the output key it recorded (a success's), so leftovers of earlier attempts can go.
   */
  onRecorded?: (run: ClaimedRun, outputKey: string | null) => Promise<void>;
  /** Told about claims, attempts and lost leases (metrics). */
  observer?: QueueObserver;
  /** Types this worker cannot run and why, stored with its registration (GET /api/analysis-types). */
  unavailable?: TypeUnavailable[];
  id?: string;
  /**
   * How long the worker claims nothing after an attempt found its disk full (ANALYSIS_STORAGE_FULL),
   * doubled at each such attempt in a row up to STORAGE_FULL_HOLD_MAX_MS; default STORAGE_FULL_HOLD_MS.
   */
  storageFullHoldMs?: number;
  /**
   * How long the worker claims nothing after an attempt found the object store unusable
   * (ANALYSIS_STORAGE_UNAVAILABLE), doubled at each such attempt in a row up to STORE_DOWN_HOLD_MAX_MS;
   * default STORE_DOWN_HOLD_MS.
   */
  storeDownHoldMs?: number;
}

/**
 * A worker whose attempt found its disk full (ANALYSIS_STORAGE_FULL: its scratch space, or a local
 * store) claims nothing for this long, then twice as long at each such attempt in a row, up to
 * STORAGE_FULL_HOLD_MAX_MS; an attempt that succeeds ends the doubling. Without it, a worker whose disk
 * stayed full went on claiming runs and used up each one's attempts within seconds (retries 1 s, 2 s
 * apart), the queue's whole backlog failing ANALYSIS_STORAGE_FULL, though other workers had room. Its
 * runs already claimed (buffered or running) go on as they are.
 */
export const STORAGE_FULL_HOLD_MS = 5_000;
export const STORAGE_FULL_HOLD_MAX_MS = 120_000;

/**
 * The same for an object store that could not be used (ANALYSIS_STORAGE_UNAVAILABLE: an input's fetch
 * or an output's put failed and the store's own check failed too): shorter, so that work resumes
 * within STORE_DOWN_HOLD_MAX_MS of the store's return. The runs are put back with their attempts
 * refunded, so a hold that ends while the store is still down costs one try per slot, nothing more.
 */
export const STORE_DOWN_HOLD_MS = 1_000;
export const STORE_DOWN_HOLD_MAX_MS = 15_000;

interface Attempt {
  run: ClaimedRun;
  controller: AbortController;
  done: Promise<void>;
  /** performance.now() when the handler was started. */
  began: number;
}

/**
 * An ending waiting to be written; `seconds` is the attempt's run time (null: it never started),
 * `endedAt` when it ended (performance.now()).
 */
interface Pending<T> {
  run: ClaimedRun;
  seconds: number | null;
  value: T;
  endedAt: number;
  /**
   * How many statements refused a batch holding it for an integrity constraint (SQLSTATE class 23;
   * writeBatch): the second such refusal blames the batch. Refusals for anything else are not
   * counted, or an outage's would make the first constraint refusal after it look like a second.
   */
  refusals?: number;
  /** `value` is the fixed stand-in for what the database refused (unrecordable()). */
  standIn?: boolean;
  /**
   * A statement carrying it failed without telling what it did: it may have committed, its answer
   * lost (the connection dropped after the commit). If a later one does not match it, the worker
   * looks whether that earlier one recorded it (runEndingsRecorded, runRetriesRecorded).
   */
  sent?: boolean;
}

/** What writing a batch did: the runs whose ending was recorded, and the errors that left work to retry. */
interface Written {
  released: ClaimedRun[];
  errors: unknown[];
}

/** How one kind of batch (completions, retries) is written, settled, put back and stood in for. */
interface BatchWriter<T, R> {
  kind: "completion" | "retry";
  write(batch: Pending<T>[]): Promise<R>;
  /** Logs and reports what the statement did; returns the runs that ended. */
  settle(batch: Pending<T>[], result: R): Promise<ClaimedRun[]>;
  /** Back into the worker's queue of this kind, for the next flush. */
  putBack(batch: Pending<T>[]): void;
  /** What to write instead of a value the database refused on its own. */
  standIn(p: Pending<T>): T;
}

/**
 * Progress and running-marks are written at most this often, and an attempt's first write waits
 * until it has been going this long: an attempt shorter than that is recorded by its completion alone
 * (`starting` → its ending), which spares PostgreSQL a statement per few runs when runs are short.
 */
export const PROGRESS_FLUSH_MS = 250;
/** A failing progress write is logged at most this often. */
const PROGRESS_WARN_MS = 10_000;
/**
 * After a claim that found several owners waiting at a type, how long the worker's claims skip the
 * sole owner's claim (runClaimSole); also how long after a prune of the type's idle rotation rows that
 * removed nothing the next one waits (see Worker.pruneIdle), and how long another type's claim or
 * wait keeps a type from being prefetched automatically (see Worker.autoPrefetch).
 */
export const SOLE_RECHECK_MS = 1000;
/**
 * A completion batch of as many outcomes as the worker has slots, and at least this many, is recorded
 * at once, without waiting out the completion delay (queueOutcome). With two slots and runs of
 * ~50 ms, batches of 8 halved the completions' share of PostgreSQL's CPU again; with ten slots of
 * no-op runs, larger batches than the slots gained nothing (docs/architecture.md).
 */
export const COMPLETION_BATCH_MIN = 8;
/**
 * Attempts shorter than this on average (in-process handlers; a program's process takes longer to
 * start) are prefetched automatically only while no task of their type has been created for
 * ARRIVAL_QUIET_MS (autoPrefetch): the claim loop is their bottleneck, so claiming ahead lifts a
 * drain by about half, and keeps both cores busy while doing so — a newcomer's create and claim
 * beside such a drain waited for a core (docs/architecture.md).
 */
export const AUTO_PREFETCH_MIN_MS = 1;
/**
 * How long after a task of a type was created (its create's wake-up, WAKEUP_CHANNEL) runs shorter
 * than AUTO_PREFETCH_MIN_MS are not prefetched: while users arrive, the claims of the free slots
 * only; while one backlog drains, ahead.
 */
export const ARRIVAL_QUIET_MS = 1000;
/** The automatic prefetch claims at most this many runs per slot ahead (autoPrefetch). */
export const AUTO_PREFETCH_PER_SLOT = 4;
/**
 * The cap per slot for runs under AUTO_PREFETCH_MIN_MS (in-process handlers: no analysis program
 * starts that fast). Their claim loop is the drain's bottleneck, and claims twice as large cut
 * PostgreSQL's CPU per run by a seventh and lifted the no-op drain from 10,900–11,600 to
 * 13,300–13,400 runs/s (bench/queue.ts, three alternating pairs, 2026-12-06). Longer runs keep
 * AUTO_PREFETCH_PER_SLOT: a larger buffer of 10–30 ms runs outlasted the window in which a newcomer's
 * run may overtake it (docs/architecture.md).
 */
export const AUTO_PREFETCH_PER_SLOT_INSTANT = 8;
/**
 * The least size of a claim after a wake-up with runs claimed ahead (Worker.runOnce): a
 * newcomer starts at the back of the rotation, and with two owners waiting the claim gives the one
 * in turn at least CLAIM_QUANTUM (an even share, at least that), so one more reaches the newcomer.
 */
export const NEWCOMER_CLAIM = CLAIM_QUANTUM + 1;
/** Runs of a new task go ahead of buffered runs younger than the prefetch window, or this (Worker.place). */
export const OVERTAKE_MIN_MS = 200;
/**
 * A run claimed ahead of the slots that has waited in the buffer this many windows (and at least
 * STALE_BUFFER_MIN_MS) is given back, with its type's other runs claimed ahead (giveBackStale()):
 * the type's mean said its runs were short, and they are not. A worker of 2 slots that had learned
 * python-stats short on small files took all 6 runs of a task of 5 s runs, 4 of them waiting out of
 * other workers' reach until a slot freed.
 */
export const STALE_BUFFER_WINDOWS = 5;
/** See STALE_BUFFER_WINDOWS. */
export const STALE_BUFFER_MIN_MS = 1000;
/**
 * Runs a worker claims ahead of its free slots automatically (ASSAY_PREFETCH_WINDOW_MS): while a
 * type's attempts are short, as many runs as keep the slots busy for the window, from the type's
 * running mean of successful attempts, at most AUTO_PREFETCH_PER_SLOT per slot (under
 * AUTO_PREFETCH_MIN_MS, AUTO_PREFETCH_PER_SLOT_INSTANT). With two slots and
 * runs of ~50 ms a claim then takes three or more runs instead of one, and PostgreSQL's CPU per run
 * fell by more than half (bench/e2e.ts; docs/architecture.md). None before the type has a mean,
 * for runs as long as the window or longer (a buffered run would wait that long for a slot while
 * another worker may be idle), and for runs shorter than AUTO_PREFETCH_MIN_MS while tasks of the type
 * are arriving (`arriving`; see ARRIVAL_QUIET_MS).
 */
export function autoPrefetchRuns(
  meanAttemptSeconds: number | undefined,
  windowMs: number,
  concurrency: number,
  arriving = false,
): number {
  if (meanAttemptSeconds === undefined || windowMs <= 0) return 0;
  const meanMs = meanAttemptSeconds * 1000;
  if (meanMs >= windowMs || (meanMs < AUTO_PREFETCH_MIN_MS && arriving)) return 0;
  const perSlot = meanMs < AUTO_PREFETCH_MIN_MS ? AUTO_PREFETCH_PER_SLOT_INSTANT : AUTO_PREFETCH_PER_SLOT;
  return Math.min(Math.floor((concurrency * windowMs) / meanMs), perSlot * concurrency);
}
/** Delay before retrying a failed completion write (e.g. the database is down). */
const FLUSH_RETRY_MS = 1000;
/**
 * After a failed claim, the worker looks for runs it may have taken again and again, at most this
 * often (a quarter of the lease when that is shorter), until a lease has passed (adoptOrphans()).
 */
export const ORPHAN_RELOOK_MS = 1000;
const DEFAULT_TIMEOUT_MS = 600_000;
/** Each successful attempt's weight in its type's running mean of durations (Worker.attemptSeconds). */
const ATTEMPT_MEAN_WEIGHT = 0.2;

/**
 * Heartbeats the timer lets run at once, beyond the pool's connections: one more than the pool holds.
 * A beat stuck on a connection that went silent (until TCP gives up on it, ~15 min with a query out)
 * must not stop the next one, over another connection, from keeping the leases — and a network fault
 * silences every connection open at the time, so a small fixed number was not enough (a review: two
 * stuck beats, a third connection working, the leases expired). A database that does not answer at
 * all still piles up no more than that.
 */
const BEATS_OVER_POOL = 1;

export class Worker {
  readonly id: string;
  private readonly o: WorkerOptions;
  private readonly observer: QueueObserver;
  private readonly typeNames: string[];
  private readonly active = new Map<number, Attempt>();
  /** Active attempts whose process has ended (see HandlerContext.releaseSlot): they hold no slot. */
  private readonly released = new Set<number>();
  /** Active attempts whose process reported its result (HandlerContext.finishing), not yet released. */
  private readonly finishing = new Set<number>();
  private buffer: ClaimedRun[] = [];
  /** Runs given back by giveBackStale() whose retry is not written yet, and their types. */
  private readonly givingBack = new Map<number, string>();
  /** When each buffered run was claimed (performance.now(); see place()). */
  private readonly bufferedAt = new Map<number, number>();
  /**
   * Per type, when it last showed it needs this worker's slots: runs of it claimed, or it found other
   * types' runs claimed ahead filling the buffer (see runOnce() and autoPrefetch()).
   */
  private readonly neededAt = new Map<string, number>();
  /** Types to look at for that even without a wake-up: every type, every poll interval. */
  private readonly recheck = new Set<string>();
  private outcomes: Pending<Outcome>[] = [];
  private retries: Pending<Retry>[] = [];
  private readonly progress = new Map<
    number,
    { token: string; progress: number | null; message: string | null }
  >();
  private flushing: Promise<void> | undefined;
  /** The pending flush of a completion batch that is still filling (see queueOutcome). */
  private flushTimer: NodeJS.Timeout | undefined;
  private loop: Promise<void> | undefined;
  private wakeUp: (() => void) | undefined;
  /** Ends the claim loop's backoff after a failed claim (see claimLoop()). */
  private endBackoff: (() => void) | undefined;
  /** The LISTEN connection came back while no backoff was on: a claim failing now takes none. */
  private reconnected = false;
  private woken = false;
  private stopping = false;
  private rotation = 0;
  /** Each type's running mean of successful attempts' durations, in seconds (claimQuantum). */
  private readonly attemptSeconds = new Map<string, number>();
  /** Per type, until when claims skip runClaimSole (see claim()). */
  private readonly soleRecheckAt = new Map<string, number>();
  /** Per type, until when rows of owners with nothing queued are not pruned again (see pruneIdle()). */
  private readonly pruneAt = new Map<string, number>();
  /** Per type, the prune in flight (see pruneIdle()). */
  private readonly pruning = new Map<string, Promise<void>>();
  /** The fair-share upkeep after a claim (queueOwnersTidy) running in the background, per type. */
  private readonly tidying = new Map<string, Promise<void>>();
  /** Per type, until when the next owner's claim (runClaimTurn) is not tried (see claim()). */
  private readonly turnRecheckAt = new Map<string, number>();
  /** Types with a wake-up since their last claim: that claim is the fair one (see claim()). */
  private readonly notified = new Set<string>();
  /**
   * Types whose last claim found nothing to claim (not under a limit: see runOnce()), and when. For a
   * poll interval from then, a slot that frees does not claim the type; a wake-up of the type does
   * (`notified`), and the mark goes when this worker's retry comes due, the LISTEN connection
   * reconnects or the loop's poll fires (clearDrained()). It expires by itself after the interval:
   * the loop's poll never fires while runs of another type keep ending (each wakes the loop), and
   * work that comes without a wake-up (a run the reaper or another worker put back) would wait for
   * them all. Nothing wakes the loop at the expiry: a loop that went to sleep just before it claims
   * at its next poll, so such work may wait up to about 2.2 poll intervals (the poll is jittered by
   * ±20%). runOnce() called without start() gets no wake-ups: after an empty claim it skips the
   * type for a poll interval, even right after a task of it is created.
   */
  private readonly drained = new Map<string, number>();
  /** Counts clearDrained() calls: a claim in flight across one does not mark its type. */
  private drainEpoch = 0;
  private timers: NodeJS.Timeout[] = [];
  /** Claims are held until then (performance.now()): an attempt found the disk full (STORAGE_FULL_HOLD_MS). */
  private claimsHeldUntil = 0;
  /** The last hold's length; 0 once an attempt has succeeded since. */
  private storageHoldMs = 0;
  private storageHoldTimer: NodeJS.Timeout | undefined;
  /** When this worker's own retries that are not due yet become due, in order. */
  private retriesDue: number[] = [];
  /** One wake-up, for the earliest of them. */
  private retryWake: { at: number; timer: NodeJS.Timeout } | undefined;
  private unlisten: (() => Promise<void>) | undefined;
  /**
   * A claim of this worker's failed: it may have committed with its answer lost, leaving runs leased
   * here that the worker does not know of. Set until adoptOrphans() has looked (see there).
   */
  private orphanCheck = false;
  /**
   * Until when (performance.now()) the looks go on after the last failed claim: a claim whose
   * connection broke while the server still ran it (waiting on a lock, say) commits after the first
   * look, whenever it ends; its runs' lease runs out a lease after it was sent (see adoptOrphans()).
   */
  private orphanWatchUntil = 0;
  private orphanLookedAt = 0;
  /** A look is in flight: no newcomer's claim starts (its runs would look like orphans). */
  private orphanLooking = false;
  /** The runs of the completion and retry statements in flight (flushAll): leases held all the same. */
  private writing: ClaimedRun[] = [];
  /** Lease tokens of attempts whose ending could not be written at all (refused): left to the reaper. */
  private readonly abandoned = new Set<string>();

  constructor(options: WorkerOptions) {
    if (!Number.isInteger(options.concurrency) || options.concurrency < 1) {
      throw new Error("worker concurrency must be a positive integer");
    }
    if (Object.keys(options.types).length === 0) throw new Error("a worker needs at least one analysis type");
    this.o = options;
    this.observer = options.observer ?? NO_OBSERVER;
    this.typeNames = Object.keys(options.types).sort();
    this.id = options.id ?? `${os.hostname()}:${process.pid}:${randomBytes(4).toString("hex")}`;
  }

  private info() {
    return {
      id: this.id,
      host: os.hostname(),
      pid: process.pid,
      analysisTypes: this.typeNames,
      concurrency: this.o.concurrency,
      unavailable: this.o.unavailable ?? [],
    };
  }

  /** Registers, listens for wake-ups, and starts the claim loop, heartbeats and progress flushes. */
  async start(): Promise<void> {
    await workerRegister(this.o.sql, this.info());
    const listening = listenAll(this.o.sql, [
      // (Re)connected: wake-ups may have been missed meanwhile, so look for work.
      {
        channel: WAKEUP_CHANNEL,
        onNotify: (type) => {
          if (!this.o.types[type]) return;
          // New work (a task created, a slot of a limited type freed) may be another owner's: the
          // next claim of the type is the fair one (see claim()). Also an arrival (ARRIVAL_QUIET_MS):
          // every version of the create statement sends this, not only the created notification
          // (a slot freed is only ever told of a limited type, which is never prefetched anyway).
          this.notified.add(type);
          this.createdAt.set(type, performance.now());
          this.wake();
        },
        // Not an arrival: at start-up it would hold a drain's prefetch back for its first second
        // (bench/queue.ts's whole drain), and arrivals lost in a reconnect's gap only leave the
        // prefetch on until the next one's notification.
        onListen: () => {
          this.clearDrained();
          if (this.endBackoff) this.endBackoff();
          else this.reconnected = true;
          this.wake();
        },
      },
      // Sent just before the create's wake-up: a newcomer's first run may be claimed at once.
      { channel: TASK_CREATED_CHANNEL, onNotify: (payload) => this.claimNewcomer(payload) },
      // A missed cancel is caught by the next heartbeat, which returns the run as cancelling.
      { channel: CANCEL_CHANNEL, onNotify: (taskId) => this.cancelTask(Number(taskId)) },
    ]);
    this.unlisten = await listening.catch(async (err: unknown) => {
      // Registered but not listening (its LISTEN connection refused, say): a row left behind would
      // count as a live worker (GET /api/analysis-types) until the reaper found it stale. Best effort:
      // the pool may be what failed.
      await workerDelete(this.o.sql, this.id).catch((e: unknown) =>
        this.o.logger.warn({ err: e, workerId: this.id }, "could not deregister after a failed start"),
      );
      throw err;
    });
    const heartbeatEvery = Math.max(100, Math.floor(this.o.leaseTtlMs / 3));
    const maxBeats = ((this.o.sql.options as { max?: number }).max ?? 10) + BEATS_OVER_POOL;
    this.timers.push(
      setInterval(() => {
        // At most maxBeats: a database that does not answer piled up one per tick for as long as it
        // lasted, all sent at once when it came back.
        if (this.beating.size < maxBeats) void this.heartbeat();
      }, heartbeatEvery),
    );
    this.timers.push(setInterval(() => void this.progressOnce(), this.progressFlushMs()));
    this.timers.push(
      setInterval(() => {
        for (const type of this.typeNames) this.recheck.add(type);
      }, this.o.pollIntervalMs),
    );
    this.loop = this.claimLoop();
    this.o.logger.info(
      { workerId: this.id, types: this.typeNames, concurrency: this.o.concurrency },
      "worker started",
    );
  }

  /** The progress flush in flight (progressOnce): flushes never overlap. */
  private progressFlight: Promise<void> | undefined;
  private progressWarnedAt = Number.NEGATIVE_INFINITY;
  /** The newcomer's claim in flight (claimNewcomer) and its type: at most one at a time. */
  private newcomerFlight: Promise<void> | undefined;
  private newcomerType: string | undefined;
  /** Runs the claim loop's claim in flight asked for (see roomForNewcomer()). */
  private claiming = 0;
  /** Per type, when a task of it was last created (its notification; see ARRIVAL_QUIET_MS). */
  private readonly createdAt = new Map<string, number>();

  /**
   * A task was created (TASK_CREATED_CHANNEL): when its owner is due a turn anyway (runClaimNewcomer
   * says when), its first run is claimed now, beside the claim loop's claim in flight, and goes ahead
   * of the runs claimed ahead (place()). Otherwise its run waits for its turn in the rotation, claimed
   * by the loop after the create's wake-up, as always. Only with room for it (roomForNewcomer()), so
   * it never waits here for a long run to end while another worker is idle; never under a global or
   * per-user limit (that claim is serialised); at most one at a time (a burst of creates must not
   * take the pool from the completions; the rest go the rotation's way). The loop's next claim of
   * the type waits for it (claim()). Must not throw: a failure only costs the newcomer the shortcut.
   */
  private claimNewcomer(payload: string): void {
    // Not while runs a failed claim may have taken are to be looked for (adoptOrphans()), nor while
    // the disk was full a moment ago (holdClaims()).
    if (this.stopping || this.newcomerFlight || this.orphanCheck || this.orphanLooking) return;
    if (performance.now() < this.claimsHeldUntil) return;
    const task = parseCreated(payload);
    if (!task) return;
    const type = task.type;
    if (!this.o.types[type] || this.limited(type) || !this.roomForNewcomer(type)) return;
    this.newcomerType = type;
    this.newcomerFlight = (async () => {
      const began = performance.now();
      let runs: ClaimedRun[] = [];
      try {
        runs = await runClaimNewcomer(this.o.sql, this.claimOptions(type, 1, 1), task);
        this.observer.claimed(
          type,
          (performance.now() - began) / 1000,
          runs.map((r) => r.waitedSeconds),
        );
      } catch (err) {
        // It may have committed (adoptOrphans(), before the loop's next claim: wake() below).
        this.suspectOrphans();
        this.o.logger.warn(
          { err, workerId: this.id, analysisType: type },
          "a newcomer's claim failed (its run waits for its turn)",
        );
      }
      // Over before its run is placed: a claim cycle from here on counts the run where it is.
      this.newcomerFlight = undefined;
      this.newcomerType = undefined;
      if (runs.length > 0) {
        this.neededAt.set(type, performance.now());
        // While stopping, it stays in the buffer: stop() hands the buffer back.
        this.place(runs);
        this.drainBuffer();
      }
      // The loop's claim cycle may have left a slot to this claim (runOnce's `base`): with nothing
      // taken (another worker's, the owner not due, a failure) the rest of the task must not wait
      // for the next poll.
      this.wake();
    })();
  }

  /** Under a global limit for `type` or the per-user limit: claims are serialised, nothing claimed ahead. */
  private limited(type: string): boolean {
    return (this.o.types[type]?.globalLimit ?? 0) > 0 || (this.o.userLimit ?? 0) > 0;
  }

  /**
   * Whether the worker's slots turn over with `type`'s runs alone: every live attempt is of it and
   * younger than `windowMs`, and nothing of another type is buffered (which would hold the slots
   * that free, perhaps for minutes; place() never moves a run past it).
   */
  private slotsTurnOverWith(type: string, windowMs: number): boolean {
    const now = performance.now();
    for (const a of this.active.values())
      if (a.run.analysisType !== type || now - a.began >= windowMs) return false;
    return !this.buffer.some((r) => r.analysisType !== type);
  }

  /** Until a newcomer's claim of `type` in flight is over (see claim()). */
  private async newcomerSettled(type: string): Promise<void> {
    if (this.newcomerFlight && this.newcomerType === type) await this.newcomerFlight;
  }

  /**
   * Whether a newcomer's run of `type` would start soon here: a slot is free that neither a buffered
   * run nor the loop's claim in flight will take; or the type's runs are shorter than the prefetch
   * window (its running mean) and no live attempt is older than that, so a slot frees within about
   * a window whatever is claimed (no-op handlers, short programs). Otherwise — runs of minutes, or a
   * type not run here yet — the run would wait in the buffer, its lease held, while another worker
   * may have a slot free (a review: one run more than the slots, with runs of minutes).
   */
  private roomForNewcomer(type: string): boolean {
    if (this.freeSlots() - this.buffer.length - this.claiming > 0) return true;
    const windowMs = this.o.prefetchWindowMs ?? 0;
    const mean = this.attemptSeconds.get(type);
    if (mean === undefined || mean * 1000 >= windowMs) return false;
    return this.slotsTurnOverWith(type, windowMs);
  }

  /** Work may have come without a wake-up of its type: every type is claimed again (see drained). */
  private clearDrained(): void {
    this.drained.clear();
    this.drainEpoch++;
  }

  /** Wakes the claim loop (a NOTIFY arrived, a slot freed, a retry is due). */
  wake(): void {
    this.woken = true;
    this.wakeUp?.();
  }

  /** A task was cancelled: its runs here are cancelling (the NOTIFY is sent after that commit). */
  private cancelTask(taskId: number): void {
    const mine = [...[...this.active.values()].map((a) => a.run), ...this.buffer].filter(
      (r) => r.taskId === taskId,
    );
    if (mine.length === 0) return;
    this.applyStatuses(
      new Map(mine.map((r) => [r.id, "cancelling"])),
      mine.map((r) => ({ id: r.id, token: r.leaseToken })),
    );
  }

  /** Slots where a run can start now. */
  private freeSlots(): number {
    return this.o.concurrency - this.active.size + this.released.size;
  }

  /** Slots to claim for: the free ones, and those whose process is about to exit. */
  private claimableSlots(): number {
    return this.freeSlots() + this.finishing.size;
  }

  /**
   * One claim cycle: starts buffered runs, claims for free slots (plus each type's prefetch, when the
   * buffer is down to its refill point) rotating over the types, and starts what it claimed. Returns
   * runs claimed.
   */
  async runOnce(): Promise<number> {
    if (this.orphanLookDue()) await this.adoptOrphans();
    this.drainBuffer();
    this.giveBackStale();
    // The disk was full a moment ago (holdClaims()): runs claimed now would fail as that attempt did.
    if (performance.now() < this.claimsHeldUntil) return 0;
    // A newcomer's claim in flight takes a slot too (roomForNewcomer()).
    const base = this.claimableSlots() - this.buffer.length - (this.newcomerFlight ? 1 : 0);
    let claimed = 0;
    const start = this.rotation++;
    // A hold that begins during the pass (an attempt ends while a type's claim is in flight) ends it:
    // the other types' runs would only be claimed to be given back.
    for (
      let i = 0;
      i < this.typeNames.length && !this.stopping && performance.now() >= this.claimsHeldUntil;
      i++
    ) {
      const type = this.typeNames[(start + i) % this.typeNames.length] as string;
      // Its last claim found nothing less than a poll interval ago, and no wake-up of the type has
      // come since (see drained): a slot freed by one of its last runs would claim nothing but a
      // statement. Each run that ended after the queue had emptied used to claim in vain (41 of 141
      // claims in bench/e2e.ts's shape, ~15% of PostgreSQL's CPU per run there).
      const drainedAt = this.drained.get(type);
      if (
        drainedAt !== undefined &&
        !this.notified.has(type) &&
        performance.now() - drainedAt < this.o.pollIntervalMs
      )
        continue;
      const prefetch = this.prefetchFor(type);
      // A buffer above its refill point (below) waits: claims of a run or two each would cost a
      // statement apiece. Except after a wake-up: new work may be another owner's, who should not wait for the
      // runs claimed ahead. That claim is of NEWCOMER_CLAIM runs, enough to reach a newcomer behind
      // the owner in turn (with two owners waiting), and its runs go ahead of the buffer (place()).
      // It is not made when it could take the buffer past two quanta over the prefetch, or wake-ups
      // arriving faster than the buffer drains would grow it without end.
      const woken = this.notified.has(type);
      // Runs given back moments ago are still leased until their retry commits (giveBackStale()):
      // a claim now would take the task's later runs, which would start first. The retry's
      // wake-up claims again.
      if (this.givingBackType(type)) continue;
      // Runs of other types claimed ahead fill the buffer, and so every slot that frees: this type
      // would wait until they stop coming. After a wake-up (work) it says so, and no type is
      // prefetched automatically for a while (autoPrefetch()): the buffer drains within about a
      // window, and the types share the slots that free. Once a poll interval (perhaps work: a run
      // the reaper put back, another worker's retry come due) a claim of one run finds out; a run it
      // finds says so in turn, and waits behind the buffer (place()). Without the claim, every idle
      // type said so every poll interval, and a worker of several types hardly ever claimed ahead.
      const crowded =
        this.buffer.length > this.claimableSlots() &&
        this.buffer.some((r) => r.analysisType !== type) &&
        !this.buffer.some((r) => r.analysisType === type);
      if (crowded && woken) this.neededAt.set(type, performance.now());
      const probe = crowded && !woken && this.recheck.has(type) && !this.limited(type);
      this.recheck.delete(type);
      // The automatic prefetch refills at a quarter: its runs last milliseconds, not microseconds, so
      // a claim's round trip is over long before the last quarter has started, and its claims are
      // bigger (fewer statements per run); a fixed prefetch, for runs of any length, at half.
      const refillAt = prefetch > (this.o.prefetch ?? 0) ? prefetch / 4 : prefetch / 2;
      const full = prefetch > 0 && this.buffer.length > refillAt;
      // Not for a type whose runs are known to be long (its mean at the window or over, as a
      // give-back leaves it): its runs claimed so would wait here for slots, be given back, and the
      // give-back's wake-up would claim them again (a review: with a fixed prefetch, every second).
      const newcomerClaim = woken && prefetch > 0 && !this.runsLong(type);
      if (
        !probe &&
        full &&
        !(newcomerClaim && this.buffer.length + NEWCOMER_CLAIM <= prefetch + 2 * CLAIM_QUANTUM)
      )
        continue;
      // A claim after a wake-up takes at least NEWCOMER_CLAIM whatever the buffer holds, or with a few
      // runs buffered it would be the owner in turn's alone.
      const want = probe
        ? 1
        : newcomerClaim
          ? Math.max(full ? 0 : base + prefetch - claimed, NEWCOMER_CLAIM)
          : base + prefetch - claimed;
      if (want <= 0) continue;
      const began = performance.now();
      // With a prefetch, a claim after a wake-up spreads over owners (a quantum of CLAIM_QUANTUM each),
      // so it reaches the newcomer.
      const quantum = newcomerClaim ? CLAIM_QUANTUM : this.quantumFor(type, want);
      this.claiming = want;
      const epoch = this.drainEpoch;
      let runs: ClaimedRun[];
      try {
        runs = await this.claim(this.claimOptions(type, want, quantum));
      } catch (err) {
        // It may have committed, its answer lost: the next cycle looks first (adoptOrphans()).
        this.suspectOrphans();
        // The claim took the type's wake-up (claim() consumes `notified`): the claim after the
        // error's backoff must not skip the type for a mark of before.
        this.drained.delete(type);
        // Runs this cycle claimed of other types start now, not after the loop's backoff.
        this.drainBuffer();
        throw err;
      } finally {
        this.claiming = 0;
      }
      // Placed first: they are this worker's, whatever the observer does.
      this.place(runs);
      claimed += runs.length;
      this.observer.claimed(
        type,
        (performance.now() - began) / 1000,
        runs.map((r) => r.waitedSeconds),
      );
      if (runs.length > 0) this.neededAt.set(type, performance.now());
      // Nothing found: the type waits for a sign of work (see drained). Not under a limit, whose
      // claim finds nothing while the limit is full (a slot's release sends a wake-up anyway); nor
      // when a sign came while the claim was in flight (its snapshot may predate the work).
      if (runs.length > 0) this.drained.delete(type);
      else if (!this.limited(type) && epoch === this.drainEpoch) this.drained.set(type, performance.now());
    }
    this.drainBuffer();
    return claimed;
  }

  /** The options of a claim of `limit` runs of `type`, at most `quantum` per owner in turn. */
  private claimOptions(type: string, limit: number, quantum: number): ClaimOptions {
    return {
      workerId: this.id,
      analysisType: type,
      limit,
      globalLimit: this.o.types[type]?.globalLimit ?? 0,
      userLimit: this.o.userLimit ?? 0,
      leaseTtlMs: this.o.leaseTtlMs,
      quantum,
      onTidyError: (err) =>
        this.o.logger.warn(
          { err, workerId: this.id, analysisType: type },
          "fair-share upkeep after a claim failed (later claims and the reaper's prune redo it)",
        ),
      tidyAside: (upkeep) => this.tidyAside(type, upkeep),
    };
  }

  /**
   * Buffers claimed runs. Runs of a task with nothing buffered or running here (a newcomer's, most
   * likely; a task whose runs are running is not one, though its buffered runs have all started — a
   * newcomer's run placed alone by its own claim would otherwise be overtaken by that task's next
   * claim) go ahead of
   * the buffered runs of their type at the buffer's end that have waited less than the prefetch
   * window (at least OVERTAKE_MIN_MS); the rest queue behind. So a prefetch does not make a new task
   * wait for the runs claimed before it, a task's runs never overtake each other (the loop's claims
   * are made one at a time, each in file order, and wait for a newcomer's claim of their type, which
   * takes only a task's first run: so each task starts its runs in file order, but for one race — a
   * loop claim already executing when the task is created skips the first run the newcomer's claim
   * holds and takes the next; if its reply comes first, the first run is placed behind the buffer,
   * docs/architecture.md), no buffered run is overtaken once it has waited a window — unless by a
   * run of a better priority of its type, as the claim would serve that one first — and none by a run
   * of another type (which may be long). (Priority: a priority-0 run of a task already here, claimed
   * beside a newcomer's priority-5 runs, was placed behind them; a review found it.) A task's runs
   * share its priority, so they keep their order.
   */
  private place(runs: ClaimedRun[]): void {
    if (runs.length === 0) return;
    this.arrange(runs);
    this.prioritise();
  }

  /**
   * Orders each type's buffered runs by priority, stably, in the places that type's runs hold: runs
   * of one priority keep the order place() gave them, and every run of another type keeps its place
   * (none is put behind by another type's priority).
   */
  private prioritise(): void {
    const first = this.buffer[0]?.priority;
    if (this.buffer.every((r) => r.priority === first)) return;
    const places = new Map<string, number[]>();
    this.buffer.forEach((r, i) => {
      const at = places.get(r.analysisType);
      if (at) at.push(i);
      else places.set(r.analysisType, [i]);
    });
    for (const at of places.values()) {
      const runs = at.map((i) => this.buffer[i] as ClaimedRun);
      if (runs.every((r) => r.priority === runs[0]?.priority)) continue;
      runs.sort((a, b) => a.priority - b.priority);
      at.forEach((i, k) => {
        this.buffer[i] = runs[k] as ClaimedRun;
      });
    }
  }

  /** place() but for priority: a newcomer's runs ahead of the young runs of their type at the end. */
  private arrange(runs: ClaimedRun[]): void {
    const now = performance.now();
    for (const r of runs) this.bufferedAt.set(r.id, now);
    const here = new Set(this.buffer.map((r) => r.taskId));
    for (const a of this.active.values()) here.add(a.run.taskId);
    const ahead = runs.filter((r) => !here.has(r.taskId));
    if (ahead.length === 0) {
      this.buffer.push(...runs);
      return;
    }
    let at = this.buffer.length;
    const youngMs = Math.max(this.o.prefetchWindowMs ?? 0, OVERTAKE_MIN_MS);
    const lead = ahead[0] as ClaimedRun;
    for (;;) {
      const last = this.buffer[at - 1];
      if (!last || last.analysisType !== lead.analysisType) break;
      // A run of a worse priority is passed whatever its age: prioritise() puts it behind anyway.
      if (now - (this.bufferedAt.get(last.id) ?? 0) >= youngMs && last.priority <= lead.priority) break;
      at--;
    }
    this.buffer = [
      ...this.buffer.slice(0, at),
      ...ahead,
      ...this.buffer.slice(at),
      ...runs.filter((r) => here.has(r.taskId)),
    ];
  }

  /** Runs of `type` to claim ahead of free slots: the fixed prefetch, or the automatic one if more. */
  private prefetchFor(type: string): number {
    return Math.max(this.o.prefetch ?? 0, this.autoPrefetch(type));
  }

  /**
   * The automatic prefetch of `type` (autoPrefetchRuns), or none: under a global or per-user limit (a
   * buffered run's lease counts against it while nothing runs); while one of the type's live attempts
   * is older than the window (the mean is out of date); and while another type shares the worker's
   * slots (one of its attempts live or buffered, or claimed or kept waiting by the buffer within
   * SOLE_RECHECK_MS): the runs claimed ahead would wait behind its runs, and its runs behind them (the
   * buffer fills every slot that frees); and for runs under AUTO_PREFETCH_MIN_MS, within
   * ARRIVAL_QUIET_MS of a task of the type being created (told by its wake-up).
   */
  private autoPrefetch(type: string): number {
    const windowMs = this.o.prefetchWindowMs ?? 0;
    if (windowMs <= 0 || this.limited(type) || !this.slotsTurnOverWith(type, windowMs)) return 0;
    const now = performance.now();
    for (const [other, at] of this.neededAt) if (other !== type && now - at < SOLE_RECHECK_MS) return 0;
    const arriving = now - (this.createdAt.get(type) ?? Number.NEGATIVE_INFINITY) < ARRIVAL_QUIET_MS;
    return autoPrefetchRuns(this.attemptSeconds.get(type), windowMs, this.o.concurrency, arriving);
  }

  /**
   * One claim: runClaimSole while one owner alone waits at the type (no limits); the next owner's
   * claim (runClaimTurn) when more owners wait than the claim takes and a turn takes the whole claim;
   * the fair claim otherwise. The fair claim straight away after a wake-up: new work may be another
   * owner's, and a small claim in vain would sit on the path from a create to its first run; and
   * right after a sole owner's claim that found others waiting, for the same reason. After
   * a small claim found its case does not hold (others waiting; k or fewer owners; the next owner
   * short of due runs), it is not tried
   * for SOLE_RECHECK_MS: at most one statement in vain per type and kind that often. Rows of owners
   * whose queue has emptied, which the sole owner's claim reports, are pruned in the background.
   */
  private async claim(o: ClaimOptions): Promise<ClaimedRun[]> {
    // The upkeep of this worker's last claim of the type first (tidyAside).
    const upkeep = this.tidying.get(o.analysisType);
    if (upkeep) await upkeep;
    // And a newcomer's claim of the type (claimNewcomer): this claim could otherwise take the task's
    // second run while that one holds its first, and start it first. Again before a statement that
    // follows another (`fair`: one may have begun during the first's round trip); the statements
    // below that come first run before anything else can begin one.
    await this.newcomerSettled(o.analysisType);
    const fair = async (options: ClaimOptions) => {
      await this.newcomerSettled(o.analysisType);
      return runClaim(this.o.sql, options);
    };
    const woken = this.notified.delete(o.analysisType);
    if (this.limited(o.analysisType) || woken) return runClaim(this.o.sql, o);
    // Rows left by owners whose queue emptied are being pruned: the sole owner's claim would claim
    // nothing beside them.
    if (this.pruning.has(o.analysisType)) return runClaim(this.o.sql, o);
    const now = performance.now();
    if (now >= (this.soleRecheckAt.get(o.analysisType) ?? 0)) {
      const sole = await runClaimSole(this.o.sql, o);
      if (sole.runs.length > 0) return sole.runs;
      if (sole.owners < 2) {
        // Rows beyond the owner waiting (if any): their owner's queue has emptied. Pruned now, beside
        // this claim (pruneIdle), so a claim soon after is the sole owner's again; after a prune that
        // removed nothing, not for a recheck interval, and until then the claims skip the sole
        // owner's claim.
        if (sole.rows > sole.owners) {
          const at = this.pruneAt.get(o.analysisType) ?? 0;
          if (now >= at) this.pruneIdle(o);
          else this.soleRecheckAt.set(o.analysisType, at);
        }
        // An owner waiting beside such rows: this claim is the fair one, which counts the owner's
        // pass (the rows' owners, queueing again, are ordered against it). Alone with nothing due, or
        // nobody waiting: nothing to claim.
        return sole.owners === 1 && sole.rows > 1 ? fair(o) : [];
      }
      this.soleRecheckAt.set(o.analysisType, now + SOLE_RECHECK_MS);
      // A second owner has just arrived, most likely one (a newcomer whose create's wake-up this
      // claim beat): the next owner's claim would claim nothing with k or fewer owners waiting, a
      // second statement in vain between the newcomer's create and its first run. The fair claim
      // serves it now; the next owner's claim is tried from the next claim on.
      return fair(o);
    }
    if (
      Math.min(o.limit, o.quantum ?? CLAIM_QUANTUM) === o.limit &&
      now >= (this.turnRecheckAt.get(o.analysisType) ?? 0)
    ) {
      const turn = await runClaimTurn(this.o.sql, o);
      // Also when the owner next in turn was short of due runs: an owner whose runs all back off
      // stays first in turn, and every claim would try it in vain (a review: 20 of 20 claims).
      if (turn.owners <= o.limit || turn.runs.length < o.limit)
        this.turnRecheckAt.set(o.analysisType, now + SOLE_RECHECK_MS);
      if (turn.runs.length === o.limit) return turn.runs;
      // The owner next in turn had fewer due runs (or none), or k or fewer owners wait (then it
      // claimed none): the fair claim takes the rest, from where the rotation now stands (walking
      // past that owner when it had none).
      return this.andThen(turn.runs, () => fair({ ...o, limit: o.limit - turn.runs.length }));
    }
    return runClaim(this.o.sql, o);
  }

  /**
   * `claimed`, runs a committed claim took, and what `more` claims after it. The runs are this
   * worker's whatever `more` does: when it fails (a dropped connection, say) they are returned alone
   * and the failure is logged. Thrown on, they were lost: leased here, never started nor heartbeated,
   * until the reaper took them back after the lease with an attempt used up (a review: `failed
   * ANALYSIS_WORKER_UNAVAILABLE` at one attempt). With nothing claimed, the failure is thrown as usual.
   */
  private async andThen(claimed: ClaimedRun[], more: () => Promise<ClaimedRun[]>): Promise<ClaimedRun[]> {
    if (claimed.length === 0) return more();
    try {
      return [...claimed, ...(await more())];
    } catch (err) {
      this.suspectOrphans();
      this.o.logger.warn(
        { err, workerId: this.id, analysisType: claimed[0]?.analysisType, claimed: claimed.length },
        "a claim after a committed one failed (the runs claimed first start)",
      );
      return claimed;
    }
  }

  /** A claim of this worker's failed: it may have committed, now or later (see adoptOrphans()). */
  private suspectOrphans(): void {
    this.orphanCheck = true;
    this.orphanWatchUntil = performance.now() + this.o.leaseTtlMs;
  }

  /** How long after a look the next is due while the watch lasts. */
  private orphanRelookMs(): number {
    return Math.min(ORPHAN_RELOOK_MS, this.o.leaseTtlMs / 4);
  }

  /** A look is due: after a failed claim, then every orphanRelookMs() until the watch ends. */
  private orphanLookDue(): boolean {
    if (this.orphanCheck) return true;
    const now = performance.now();
    return now < this.orphanWatchUntil && now - this.orphanLookedAt >= this.orphanRelookMs();
  }

  /**
   * After a claim of this worker's failed (`orphanCheck`), before the next: a claim whose commit
   * succeeded but whose answer was lost (the connection dropped in between) left runs leased here
   * that nothing would start or heartbeat, until the reaper took them back after the lease with an
   * attempt used up — at one attempt, failed ANALYSIS_WORKER_UNAVAILABLE without ever running.
   * Every lease this worker holds in any form is known, and no claim of its own is in flight (the
   * loop's is over; a newcomer's is awaited, and none starts during a look): a run leased here beyond
   * those is such a run. Their leases are extended, tokens kept (runClaimOrphans), and they are placed
   * like any claim's; one a cancel reached meanwhile ends cancelled. One look is not enough: a claim
   * whose connection broke while the server still ran it (waiting on a lock a big create holds, say)
   * commits whenever it ends, after the first look has seen the old rows. So the claim loop looks
   * again every orphanRelookMs() for a lease after the last failed claim (orphanWatchUntil): the runs
   * of a claim sent before the failure are leased until at most a lease after it, and the reaper
   * takes what comes later. Throws when the statement fails (the flag stays: the loop's next cycle,
   * after its backoff, looks again).
   */
  private async adoptOrphans(): Promise<void> {
    this.orphanLooking = true;
    let found: Awaited<ReturnType<typeof runClaimOrphans>>;
    try {
      await this.newcomerFlight;
      const known: Lease[] = [
        ...this.heldLeases(),
        ...this.writing.map((r) => ({ id: r.id, token: r.leaseToken })),
        ...[...this.abandoned].map((token) => ({ id: 0, token })),
      ];
      found = await runClaimOrphans(this.o.sql, this.id, known, this.o.leaseTtlMs);
    } finally {
      this.orphanLooking = false;
    }
    this.orphanCheck = false;
    this.orphanLookedAt = performance.now();
    if (found.length === 0) {
      this.o.logger.debug({ workerId: this.id }, "looked for runs a failed claim had taken: none");
      return;
    }
    this.o.logger.warn(
      { workerId: this.id, runIds: found.map((r) => r.id) },
      "runs a failed claim had taken (its answer was lost) are this worker's: started here",
    );
    const runs = found.map(({ status: _, ...run }) => run);
    this.place(runs);
    for (const r of runs) this.neededAt.set(r.analysisType, performance.now());
    const cancelling = found.filter((r) => r.status === "cancelling");
    if (cancelling.length > 0)
      this.applyStatuses(
        new Map(cancelling.map((r) => [r.id, "cancelling"])),
        cancelling.map((r) => ({ id: r.id, token: r.leaseToken })),
      );
  }

  /**
   * Prunes the type's rows whose owner has nothing queued (queueOwnersPruneIdle), in the background:
   * housekeeping, kept off the claim's path (a transaction of four round trips). One at a time per
   * type; stop() waits for it. A prune that removed nothing (the rows locked by a create bringing their
   * owner back or by another prune, or it failed) holds the next off for SOLE_RECHECK_MS. Must not
   * throw or reject: a failure is the reaper's prune to redo.
   */
  private pruneIdle(o: ClaimOptions): void {
    const type = o.analysisType;
    if (this.pruning.has(type)) return;
    const done = queueOwnersPruneIdle(this.o.sql, type)
      .catch((err: unknown) => {
        this.o.logger.warn(
          { err, workerId: this.id, analysisType: type },
          "pruning the rotation's idle rows failed (the reaper's prune redoes it)",
        );
        return 0;
      })
      .then((pruned) => {
        if (pruned === 0) this.pruneAt.set(type, performance.now() + SOLE_RECHECK_MS);
      })
      .finally(() => this.pruning.delete(type));
    this.pruning.set(type, done);
  }

  /**
   * Runs a claim's fair-share upkeep (queueOwnersTidy) beside the start of the runs it claimed, which
   * no longer wait for its round trip (with two owners it followed every other claim). The worker's
   * next claim of the type waits for it (see claim()), so this worker walks the rotation only after
   * its own upkeep, as when it was awaited; only other workers' claims run beside it, as they always
   * could. stop() waits for it. The upkeep never rejects.
   */
  private tidyAside(type: string, upkeep: () => Promise<void>): void {
    const done = upkeep().finally(() => {
      if (this.tidying.get(type) === done) this.tidying.delete(type);
    });
    this.tidying.set(type, done);
  }

  /** The claim's quantum for `type` (claimQuantum), from its successful attempts and its live ones. */
  private quantumFor(type: string, want: number): number {
    const now = performance.now();
    let oldest = 0;
    for (const a of this.active.values())
      if (a.run.analysisType === type) oldest = Math.max(oldest, (now - a.began) / 1000);
    return claimQuantum(this.attemptSeconds.get(type), want, oldest);
  }

  /** Gives the runs claimed ahead back to the queue, their attempt refunded (a stop; a full disk). */
  private releaseBuffered(): void {
    if (this.buffer.length === 0) return;
    for (const run of this.buffer) this.giveBack(run);
    this.buffer = [];
    this.bufferedAt.clear();
    void this.flush();
  }

  /** Whether `type`'s mean says its runs are as long as the prefetch window or longer. */
  private runsLong(type: string): boolean {
    const windowMs = this.o.prefetchWindowMs ?? 0;
    const mean = this.attemptSeconds.get(type);
    return windowMs > 0 && mean !== undefined && mean * 1000 >= windowMs;
  }

  /** Whether runs of `type` given back (giveBackStale()) wait for their retry to be written. */
  private givingBackType(type: string): boolean {
    if (this.givingBack.size === 0) return false;
    for (const t of this.givingBack.values()) if (t === type) return true;
    return false;
  }

  /** How long a buffered run waits before it is given back (STALE_BUFFER_WINDOWS); none: never. */
  private staleAfterMs(): number {
    const windowMs = this.o.prefetchWindowMs ?? 0;
    if (windowMs <= 0) return Number.POSITIVE_INFINITY;
    return Math.max(STALE_BUFFER_WINDOWS * windowMs, STALE_BUFFER_MIN_MS);
  }

  /**
   * The buffered runs that may be given back: those behind the runs that start next (one per
   * claimable slot: a slot free, or one whose program has said its result and is exiting) and
   * behind a fixed prefetch's runs, which it holds whatever their length, as its setting says.
   */
  private aheadOfSlots(): ClaimedRun[] {
    return this.buffer.slice(this.claimableSlots() + (this.o.prefetch ?? 0));
  }

  /**
   * Gives back the runs claimed ahead (aheadOfSlots()) of a type one of which has waited
   * staleAfterMs(): claimed on a mean that the type's runs no longer keep to (slots busy for
   * seconds, not a hundred milliseconds), they would wait here while another worker may have a
   * slot free. All of that type's, so that a task's later runs do not start here before its earlier
   * ones, given back, are claimed again (each task starts its runs in file order). The attempts are
   * refunded, and the retry's wake-up tells the other workers. The type's mean becomes at least the
   * longest wait: nothing of it is claimed ahead again until short runs bring the mean back down — or
   * this claim loop's next claim (before the retry has even committed) would take the task's later
   * runs, and start them here first, and the given-back runs would come back to this buffer (a
   * review). When a give-back is due (staleDueInMs()) the claim loop looks.
   */
  private giveBackStale(): void {
    const afterMs = this.staleAfterMs();
    if (afterMs === Number.POSITIVE_INFINITY) return;
    const now = performance.now();
    // The first entry is the oldest (set when claimed, only deleted since): while it has not waited
    // that long, no buffered run has — the common case, on every claim cycle.
    const oldest = this.bufferedAt.values().next().value;
    if (oldest === undefined || now - oldest < afterMs) return;
    const candidates = this.aheadOfSlots();
    const stale = new Map<string, number>();
    for (const r of candidates) {
      const waited = now - (this.bufferedAt.get(r.id) ?? now);
      if (waited >= afterMs) stale.set(r.analysisType, Math.max(stale.get(r.analysisType) ?? 0, waited));
    }
    if (stale.size === 0) return;
    const back = candidates.filter((r) => stale.has(r.analysisType));
    const gone = new Set(back.map((r) => r.id));
    this.buffer = this.buffer.filter((r) => !gone.has(r.id));
    for (const [type, waited] of stale)
      this.attemptSeconds.set(type, Math.max(this.attemptSeconds.get(type) ?? 0, waited / 1000));
    this.o.logger.info(
      { workerId: this.id, analysisTypes: [...stale.keys()], runs: back.length },
      "runs claimed ahead waited too long for a slot; given back to the queue",
    );
    for (const run of back) {
      this.bufferedAt.delete(run.id);
      this.givingBack.set(run.id, run.analysisType);
      this.giveBack(run);
    }
    void this.flush();
  }

  /**
   * Queues a buffered run (never started) back, due at once, its attempt refunded; the caller flushes
   * once it has queued them all (one statement, not one for the first run and one for the rest).
   */
  private giveBack(run: ClaimedRun): void {
    const retry = {
      id: run.id,
      token: run.leaseToken,
      delayMs: 0,
      refund: true,
      errorCode: null,
      errorMessage: null,
    };
    this.queueRetry(run, null, retry, false);
  }

  /** Milliseconds until giveBackStale() has a run to give back; infinite when none will. */
  private staleDueInMs(): number {
    const afterMs = this.staleAfterMs();
    if (afterMs === Number.POSITIVE_INFINITY) return afterMs;
    let oldest = Number.POSITIVE_INFINITY;
    for (const r of this.aheadOfSlots()) oldest = Math.min(oldest, this.bufferedAt.get(r.id) ?? oldest);
    return Math.max(0, oldest + afterMs - performance.now());
  }

  private drainBuffer(): void {
    // The disk was full a moment ago (holdClaims()): they would fail as that attempt did; other
    // workers may have room. A claim in flight when the hold began brings its runs here too.
    if (this.buffer.length > 0 && performance.now() < this.claimsHeldUntil) this.releaseBuffered();
    while (this.buffer.length > 0 && this.freeSlots() > 0 && !this.stopping) {
      const run = this.buffer.shift() as ClaimedRun;
      this.bufferedAt.delete(run.id);
      this.startAttempt(run);
    }
  }

  private async claimLoop(): Promise<void> {
    let failures = 0;
    while (!this.stopping) {
      let claimed = 0;
      this.woken = false;
      this.reconnected = false;
      try {
        claimed = await this.runOnce();
        failures = 0;
      } catch (err) {
        failures++;
        this.o.logger.warn({ err, workerId: this.id }, "claim failed; retrying");
        // A stop or a reconnect that came while the claim was in flight: no backoff at all.
        if (this.stopping) break;
        if (this.reconnected) {
          this.reconnected = false;
          continue;
        }
        // Cut short by stop() (a signal must not wait out up to 10 s before the shutdown grace even
        // starts) and by the LISTEN connection's reconnect (the database is back: work waiting in the
        // queue is claimed now, not at the end of the backoff); not by other wake-ups, which would
        // send claims at a database that is still down.
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, Math.min(10_000, 200 * 2 ** failures));
          this.endBackoff = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        this.endBackoff = undefined;
        continue;
      }
      if (this.stopping) break;
      if (this.woken || (claimed > 0 && this.freeSlots() > 0)) continue;
      await new Promise<void>((resolve) => {
        // The poll: work that came without a wake-up (a run another worker or the reaper put back,
        // one whose backoff ran out) is found by claiming every type again. A look for runs a failed
        // claim took (adoptOrphans()) that is due sooner ends the wait without that, as does a
        // buffered run's give-back (giveBackStale()).
        const poll = jitter(this.o.pollIntervalMs);
        const look = Math.min(
          performance.now() < this.orphanWatchUntil
            ? Math.max(0, this.orphanLookedAt + this.orphanRelookMs() - performance.now())
            : Number.POSITIVE_INFINITY,
          this.staleDueInMs(),
        );
        const timer = setTimeout(
          () => {
            if (poll <= look) this.clearDrained();
            resolve();
          },
          Math.min(poll, look),
        );
        this.wakeUp = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.wakeUp = undefined;
    }
  }

  private startAttempt(run: ClaimedRun): void {
    const type = this.o.types[run.analysisType];
    if (!type) throw new Error(`claimed a run of an unknown type: ${run.analysisType}`);
    const controller = new AbortController();
    const began = performance.now();
    this.observer.attemptLive(run.analysisType, 1);
    const limitMs = type.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const timeout = setTimeout(() => controller.abort("timeout"), limitMs);
    this.o.logger.info(
      { ...this.fields(run), status: "starting", analysisType: run.analysisType },
      "run started",
    );
    this.progress.set(run.id, { token: run.leaseToken, progress: null, message: null });
    // The attempt's last progress message, which its outcome carries (a flush in flight when the
    // attempt ends may fail, or lose to the completion: the message would be lost).
    let lastMessage: string | null = null;
    const ctx: HandlerContext = {
      signal: controller.signal,
      reportProgress: (percent, message) => {
        if (controller.signal.aborted) return;
        const p = Math.max(0, Math.min(100, Math.round(percent)));
        this.progress.set(run.id, { token: run.leaseToken, progress: p, message: message ?? null });
        if (message) lastMessage = message;
      },
      releaseSlot: () => {
        if (this.released.has(run.id) || !this.active.has(run.id)) return;
        this.finishing.delete(run.id);
        this.released.add(run.id);
        this.drainBuffer();
        this.wake();
      },
      finishing: () => {
        if (this.released.has(run.id) || this.finishing.has(run.id) || !this.active.has(run.id)) return;
        this.finishing.add(run.id);
        this.wake();
      },
    };
    // Active before the handler runs: it may call releaseSlot()/finishing() before its first await.
    const attempt: Attempt = { run, controller, done: Promise.resolve(), began };
    this.active.set(run.id, attempt);
    attempt.done = (async () => {
      let outcome: Ending;
      try {
        outcome = await type.handler(run, ctx);
      } catch (error) {
        outcome = { status: "error", error };
      }
      clearTimeout(timeout);
      this.active.delete(run.id);
      this.released.delete(run.id);
      this.finishing.delete(run.id);
      this.progress.delete(run.id);
      this.observer.attemptLive(run.analysisType, -1);
      const seconds = (performance.now() - began) / 1000;
      // Only attempts that ran to a success say how long the type's runs take: a program failing at
      // once, or an attempt cut short, would make a type of minute-long runs look short (and free
      // its slots at the same moment, for one owner to take them all).
      if (outcome.status === "succeeded" && controller.signal.reason === undefined) {
        const mean = this.attemptSeconds.get(run.analysisType);
        this.attemptSeconds.set(
          run.analysisType,
          mean === undefined ? seconds : mean + (seconds - mean) * ATTEMPT_MEAN_WEIGHT,
        );
      }
      // Settled first: an attempt that found the disk full holds the claims (holdClaims()), and the
      // runs claimed ahead go back to the queue instead of starting on that disk.
      // Its last message goes with the outcome, written or not (settle(); the same twice is harmless).
      this.settle(run, seconds, controller.signal.reason as AbortReason | undefined, outcome, {
        lastMessage,
        limitMs,
      });
      // The slot is free: a run claimed ahead starts now, not when the claim loop is next free (it
      // may be waiting for a claim).
      this.drainBuffer();
      this.wake();
    })();
  }

  /** Turns a handler's ending into an outcome, a retry, or nothing (lost lease; see decide()). Must not throw. */
  private settle(
    run: ClaimedRun,
    seconds: number,
    reason: AbortReason | undefined,
    ending: Ending,
    /** The attempt's last progress message, and the time limit it ran under (named by a timeout). */
    { lastMessage, limitMs }: { lastMessage: string | null; limitMs: number },
  ): void {
    if (ending.status === "error")
      this.o.logger.error({ ...this.fields(run), err: ending.error }, "handler threw");
    const decision = decide(
      run,
      effectiveReason(reason, ending, this.stopping),
      ending,
      this.o.retryBaseMs,
      limitMs,
    );
    const code =
      decision.kind === "retry"
        ? decision.retry.errorCode
        : decision.kind === "complete"
          ? decision.outcome.errorCode
          : null;
    if (code === "ANALYSIS_STORAGE_FULL")
      this.holdClaims(
        this.o.storageFullHoldMs ?? STORAGE_FULL_HOLD_MS,
        STORAGE_FULL_HOLD_MAX_MS,
        "an attempt found this worker's disk full: claiming nothing for a while",
      );
    else if (code === "ANALYSIS_STORAGE_UNAVAILABLE")
      this.holdClaims(
        this.o.storeDownHoldMs ?? STORE_DOWN_HOLD_MS,
        STORE_DOWN_HOLD_MAX_MS,
        "an attempt found the object store unusable: claiming nothing for a while",
      );
    else if (decision.kind === "complete" && decision.outcome.status === "succeeded") this.storageHoldMs = 0;
    switch (decision.kind) {
      case "discard":
        this.o.logger.warn(this.fields(run), "run lease lost: attempt abandoned, nothing recorded");
        this.observer.attemptEnded(run.analysisType, "lost", seconds);
        void this.discard(run);
        return;
      case "retry":
        // The wake-up for it is armed once the retry is recorded (see retried()).
        this.queueRetry(run, seconds, decision.retry);
        return;
      case "complete":
        this.queueOutcome(
          run,
          seconds,
          lastMessage === null ? decision.outcome : { ...decision.outcome, message: lastMessage },
        );
        return;
    }
  }

  /**
   * An attempt found the disk full (STORAGE_FULL_HOLD_MS) or the object store unusable
   * (STORE_DOWN_HOLD_MS): no claims for `first` ms, twice as long at each hold in a row up to `max`,
   * then a wake-up. Logs `message`.
   */
  private holdClaims(first: number, max: number, message: string): void {
    const now = performance.now();
    // Attempts that were under way when the disk filled (the store went) end during the hold: the
    // same cause.
    if (this.stopping || now < this.claimsHeldUntil) return;
    // In a row: no success since the last hold, and that hold not long over (a full disk a day later
    // starts over, whatever failed in between).
    const inARow = this.storageHoldMs > 0 && now - this.claimsHeldUntil < max;
    this.storageHoldMs = inARow ? Math.min(Math.max(first, max), this.storageHoldMs * 2) : first;
    this.claimsHeldUntil = now + this.storageHoldMs;
    this.o.logger.warn({ workerId: this.id, holdMs: this.storageHoldMs }, message);
    this.releaseBuffered();
    clearTimeout(this.storageHoldTimer);
    this.storageHoldTimer = setTimeout(() => {
      this.storageHoldTimer = undefined;
      // The queue may hold work it skipped meanwhile.
      this.clearDrained();
      this.wake();
    }, this.storageHoldMs);
    // Like the retries' wake-up: it keeps no process alive (one used through runOnce() alone).
    this.storageHoldTimer.unref();
  }

  /**
   * Wakes the claim loop at `at` (performance.now(): a wall clock stepped back or forward while the
   * timer waits must not lose or hasten it; a retry of ours is due then). One timer, armed for the earliest due
   * time; when it fires it re-arms for the next one. The list holds only retries not yet due.
   */
  private wakeAt(at: number): void {
    if (this.stopping) return;
    const i = this.retriesDue.findIndex((t) => t > at);
    this.retriesDue.splice(i === -1 ? this.retriesDue.length : i, 0, at);
    if (this.retryWake && this.retryWake.at <= at) return;
    this.armRetryWake();
  }

  private armRetryWake(): void {
    if (this.retryWake) clearTimeout(this.retryWake.timer);
    this.retryWake = undefined;
    const at = this.retriesDue[0];
    if (at === undefined || this.stopping) return;
    const timer = setTimeout(
      () => {
        const now = performance.now();
        while ((this.retriesDue[0] ?? Number.POSITIVE_INFINITY) <= now) this.retriesDue.shift();
        // A run of this worker's is due again: the queue it found empty is not.
        this.clearDrained();
        this.wake();
        this.armRetryWake();
      },
      timerDelay(at - performance.now()),
    );
    timer.unref();
    this.retryWake = { at, timer };
  }

  /**
   * Queues an outcome for the next completion statement. With a completion delay, a batch waits up
   * to that long for more outcomes: a statement's fixed cost is most of what a completion costs
   * PostgreSQL, and with slots finishing one at a time every outcome was a statement of its own. The
   * slot is free already (the delay costs no throughput); the lease is heartbeated meanwhile
   * (heldLeases). Recorded at once instead: a full batch (the slots, at least COMPLETION_BATCH_MIN); when
   * no company is in sight (no attempt live and none buffered at that moment: a lone run); an outcome
   * whose lease holds a slot of a global or per-user limit (others may be waiting for it); and
   * during a shutdown.
   */
  private queueOutcome(run: ClaimedRun, seconds: number | null, outcome: Outcome): void {
    this.outcomes.push({ run, seconds, value: outcome, endedAt: performance.now() });
    const delay = this.o.completionDelayMs ?? 0;
    if (
      delay <= 0 ||
      this.stopping ||
      this.outcomes.length >= Math.max(this.o.concurrency, COMPLETION_BATCH_MIN) ||
      (this.active.size === 0 && this.buffer.length === 0) ||
      this.limited(run.analysisType)
    ) {
      this.flushNow();
      return;
    }
    this.flushTimer ??= setTimeout(() => this.flushNow(), delay);
  }

  private flushNow(): void {
    clearTimeout(this.flushTimer);
    this.flushTimer = undefined;
    void this.flush();
  }

  private queueRetry(run: ClaimedRun, seconds: number | null, retry: Retry, flushNow = true): void {
    this.retries.push({ run, seconds, value: retry, endedAt: performance.now() });
    if (flushNow) this.flush();
  }

  /** Tells the observer how a started attempt ended (runs that never started are not attempts). */
  private ended(p: Pending<unknown>, outcome: AttemptOutcome): void {
    if (p.seconds !== null) this.observer.attemptEnded(p.run.analysisType, outcome, p.seconds);
  }

  /** The fields every log line about a run carries. */
  private fields(run: ClaimedRun) {
    return { taskId: run.taskId, runId: run.id, attempt: run.attempt, workerId: this.id };
  }

  private fenced(p: Pending<unknown>): void {
    // Which of these happened is not known here (the statement matched no row): the words say all of
    // them, so that a run a reaper cancelled while this worker was stopped is not taken for one run twice.
    this.o.logger.warn(
      this.fields(p.run),
      "run completion fenced off: this attempt's lease was gone (reaped while this worker did not answer — then queued again, cancelled or failed —, or taken by another attempt); nothing recorded",
    );
    this.observer.leaseLost(p.run.analysisType, "fenced");
    this.ended(p, "lost");
    void this.discard(p.run);
  }

  private async discard(run: ClaimedRun): Promise<void> {
    try {
      await this.o.onDiscard?.(run);
    } catch (err) {
      this.o.logger.error({ err, runId: run.id }, "could not discard an abandoned attempt's output");
    }
  }

  private async recorded(run: ClaimedRun, outputKey: string | null): Promise<void> {
    try {
      await this.o.onRecorded?.(run, outputKey);
    } catch (err) {
      this.o.logger.warn({ err, runId: run.id }, "could not remove earlier attempts' outputs");
    }
  }

  /** Starts a flush unless one is running; the running one picks up everything queued meanwhile. */
  private flush(): Promise<void> {
    this.flushing ??= this.flushAll().finally(() => {
      this.flushing = undefined;
      // Queued after the loop's last look and before this ran (a flush asked for meanwhile got the
      // finishing one): written now, or it would wait for the next outcome. Returned, so whoever
      // awaits this flush (stop()) awaits that one too.
      if (this.outcomes.length > 0 || this.retries.length > 0) return this.flush();
    });
    return this.flushing;
  }

  // This must not throw and must not drop an outcome: on a database error it keeps what was not
  // written (whose leases the heartbeat keeps extending) and tries again. The two statements are
  // settled separately: a batch is put back only when its own statement failed, so a completion that
  // committed is never sent again because the retry beside it failed. A batch the database refuses for
  // what is in it is written in parts (writeBatch): one outcome it cannot take must not hold back the
  // others, nor every later one (they joined the failing batch, forever, and stop() hung on it).
  private async flushAll(): Promise<void> {
    while (this.outcomes.length > 0 || this.retries.length > 0) {
      const outcomes = this.outcomes;
      const retries = this.retries;
      this.outcomes = [];
      this.retries = [];
      this.writing = [...outcomes, ...retries].map((p) => p.run);
      // A retry that an earlier, failed statement may have committed (its answer lost) is looked up
      // by its run's row (retried()): written and settled first, before a completion of the run's
      // next attempt here changes that row. Otherwise both at once.
      const written = retries.some((p) => p.sent)
        ? [await this.writeBatch(retries, this.requeues), await this.writeBatch(outcomes, this.completions)]
        : await Promise.all([
            this.writeBatch(outcomes, this.completions),
            this.writeBatch(retries, this.requeues),
          ]);
      this.writing = [];
      const errors = written.flatMap((w) => w.errors);
      // Never throws: a failed wake-up is logged there and must not count as a failed write.
      await this.wakeOthers(written.flatMap((w) => w.released));
      if (errors.length > 0) {
        this.o.logger.warn({ err: errors[0], workerId: this.id }, "completion write failed; retrying");
        await sleep(FLUSH_RETRY_MS);
      }
    }
  }

  private readonly completions: BatchWriter<Outcome, CompletionResult> = {
    kind: "completion",
    write: (batch) =>
      runComplete(
        this.o.sql,
        batch.map((o) => ({ ...o.value, endedMsAgo: performance.now() - o.endedAt })),
      ),
    settle: (batch, result) => this.completed(batch, result),
    putBack: (batch) => this.outcomes.unshift(...batch),
    standIn: (p) => {
      // Its outputs will never be the run's.
      if (p.value.outputKey) void this.discard(p.run);
      return unrecordable(p.value);
    },
  };

  private readonly requeues: BatchWriter<Retry, RetryResult> = {
    kind: "retry",
    write: (batch) =>
      runRetry(
        this.o.sql,
        batch.map((r) => r.value),
      ),
    settle: (batch, result) => this.retried(batch, result),
    putBack: (batch) => this.retries.unshift(...batch),
    standIn: (p) => unrecordableRetry(p.value),
  };

  /**
   * Writes a batch in one statement. When the statement fails for anything but what the batch
   * carries (inputAtFault(): the connection, the server's state, a full NOTIFY queue...), the batch is
   * put back whole for the next try, as always. When the batch is at fault — a data error (SQLSTATE
   * class 22, e.g. a string jsonb refuses) at once, an integrity constraint's (23) the second time —
   * it is written in halves, each the same way, down to the outcome at fault; that one is written
   * again with a fixed stand-in (unrecordable(): failed, ANALYSIS_PROCESS_FAILED), and if even that
   * is refused for what it carries it is given up (logged; its lease, no longer heartbeated, is the
   * reaper's). Nothing else in the batch waits for it. Never throws.
   */
  private async writeBatch<T, R>(batch: Pending<T>[], w: BatchWriter<T, R>): Promise<Written> {
    if (batch.length === 0) return { released: [], errors: [] };
    let result: R;
    try {
      result = await w.write(batch);
    } catch (err) {
      return this.refused(batch, err, w);
    }
    try {
      return { released: await w.settle(batch, result), errors: [] };
    } catch (err) {
      return { released: [], errors: [err] };
    }
  }

  private async refused<T, R>(batch: Pending<T>[], err: unknown, w: BatchWriter<T, R>): Promise<Written> {
    if (sqlStateOf(err)?.startsWith("23")) for (const p of batch) p.refusals = (p.refusals ?? 0) + 1;
    if (!inputAtFault(err, batch)) {
      // The connection's, the server's, or nothing the batch could be blamed for: the whole batch
      // again at the next flush, for as long as it takes (its leases are heartbeated meanwhile). It
      // may have committed all the same, its answer lost: then the next try matches nothing.
      for (const p of batch) p.sent = true;
      w.putBack(batch);
      return { released: [], errors: [err] };
    }
    if (batch.length > 1) {
      this.o.logger.warn(
        { err, workerId: this.id, runs: batch.length },
        `${w.kind} batch refused; writing it in halves`,
      );
      const half = Math.ceil(batch.length / 2);
      const first = await this.writeBatch(batch.slice(0, half), w);
      if (first.errors.some((e) => !inputAtFault(e))) {
        // The first half was put back for the connection's sake, say: the other half waits too.
        w.putBack(batch.slice(half));
        return first;
      }
      const second = await this.writeBatch(batch.slice(half), w);
      return {
        released: [...first.released, ...second.released],
        errors: [...first.errors, ...second.errors],
      };
    }
    const p = batch[0] as Pending<T>;
    if (!p.standIn) {
      this.o.logger.error(
        { ...this.fields(p.run), err },
        w.kind === "completion"
          ? "the database refused this run's outcome: recording it as failed instead"
          : "the database refused this run's retry: re-queueing it without its error",
      );
      p.value = w.standIn(p);
      p.standIn = true;
      return this.writeBatch([p], w);
    }
    this.o.logger.error(
      { ...this.fields(p.run), err },
      `${w.kind} of this run could not be written at all: given up, the reaper takes it back after its lease`,
    );
    this.abandoned.add(p.run.leaseToken);
    // A give-back given up: its type may be claimed again (the reaper frees the run).
    this.givingBack.delete(p.run.id);
    this.ended(p, "lost");
    void this.discard(p.run);
    return { released: [], errors: [] };
  }

  /**
   * Logs and reports the outcomes a completion statement recorded; the others were fenced off and
   * are discarded — except those an earlier try of this worker's recorded: a completion that committed
   * but whose answer was lost (the connection dropped after the commit) matches nothing when sent
   * again, its lease token gone. So an outcome that does not match is looked up (runEndingsRecorded)
   * when an earlier statement carrying it failed (`sent`), and a success with outputs always (discarding
   * it would delete the run's outputs): one its run already records is logged and counted as recorded.
   * When that cannot be checked, those outcomes go back into the batch (and this throws): nothing is
   * discarded, and no attempt counted as lost, unless it is known not to be ours. Returns the runs
   * whose ending was recorded.
   */
  private async completed(outcomes: Pending<Outcome>[], completion: CompletionResult): Promise<ClaimedRun[]> {
    const done = new Set(completion.completed);
    const unsure = outcomes.filter((p) => !done.has(p.run.id) && (p.sent || p.value.outputKey));
    let earlier = new Set<number>();
    let lookup: unknown;
    if (unsure.length > 0) {
      try {
        earlier = new Set(
          await runEndingsRecorded(
            this.o.sql,
            unsure.map((p) => ({ ...p.value, attempt: p.run.attempt })),
          ),
        );
      } catch (err) {
        lookup = err;
      }
    }
    const recorded: ClaimedRun[] = [];
    for (const p of outcomes) {
      const { run, value: outcome } = p;
      if (done.has(run.id) || earlier.has(run.id)) {
        // Each transition is logged once, after it was recorded.
        this.o.logger.info(
          {
            ...this.fields(run),
            status: outcome.status,
            errorCode: outcome.errorCode ?? null,
            ...(done.has(run.id) ? {} : { answerLost: true }),
          },
          "run finished",
        );
        this.ended(p, outcome.status);
        void this.recorded(run, outcome.outputKey ?? null);
        recorded.push(run);
      } else if (lookup !== undefined && unsure.includes(p)) this.outcomes.push(p);
      else this.fenced(p);
    }
    for (const t of completion.finishedTasks) {
      this.o.logger.info({ taskId: t.taskId, status: t.status }, "task finished");
    }
    if (lookup !== undefined) throw lookup;
    return recorded;
  }

  /**
   * Logs and reports what a retry statement did. Returns the runs it took out of their live state —
   * queued again, or ended (cancelled) instead — whose room under a limit others may now take: a run
   * re-queued with a backoff frees its owner's and its type's room at once, and without a wake-up the
   * workers that found them at a limit waited for their poll. A retry that does not match after an
   * earlier statement carrying it failed (`sent`) is looked up first (runRetriesRecorded): that one
   * may have committed, its answer lost, and the run is then re-queued (or ended cancelled) by this
   * worker, not fenced off — and waits for this worker's wake-up, not for a poll. When that cannot be
   * checked, those retries go back into the batch (and this throws).
   */
  private async retried(retries: Pending<Retry>[], result: RetryResult): Promise<ClaimedRun[]> {
    const matched = new Set([...result.requeued, ...result.cancelled]);
    const unsure = retries.filter((p) => !matched.has(p.run.id) && p.sent);
    let earlier: RetriesRecorded = { requeued: [], dueInMs: [], cancelled: [] };
    let lookup: unknown;
    if (unsure.length > 0) {
      try {
        earlier = await runRetriesRecorded(
          this.o.sql,
          unsure.map((p) => ({ ...p.value, attempt: p.run.attempt })),
        );
      } catch (err) {
        lookup = err;
      }
    }
    const back = new Set([...result.requeued, ...earlier.requeued]);
    // Wake when each is due by the database's clock (a timer armed from the worker's own idea of the
    // delay fired before run_after whenever the statement took longer than the margin, and the run
    // then waited for the next poll).
    // A run already due when the statement ended (it outlasted the backoff) needs a claim now: the
    // wake-up after settle() fired while the statement still ran, and the NOTIFY the statement sends
    // for runs due at once (a shutdown's) is for the others as much as for this worker.
    // Its type's queue is not empty any more (see drained): the timer clears the marks when it fires.
    // (A run an earlier try re-queued and someone claimed again since has no due time: null.)
    for (const inMs of [...result.dueInMs, ...earlier.dueInMs]) {
      if (inMs === null) continue;
      if (inMs > 0) this.wakeAt(performance.now() + inMs + 2);
      else {
        this.clearDrained();
        this.wake();
      }
    }
    const cancelled = new Set([...result.cancelled, ...earlier.cancelled]);
    const lostAnswer = new Set([...earlier.requeued, ...earlier.cancelled]);
    const released: ClaimedRun[] = [];
    try {
      for (const p of retries) {
        const { run, value: retry } = p;
        const answerLost = lostAnswer.has(run.id) ? { answerLost: true } : {};
        if (cancelled.has(run.id)) {
          // Cancelled while it failed or was shut down: it ended, it is not retried.
          this.o.logger.info(
            {
              ...this.fields(run),
              status: "cancelled",
              errorCode: "ANALYSIS_PROCESS_CANCELLED",
              ...answerLost,
            },
            "run finished",
          );
          this.ended(p, "cancelled");
          void this.recorded(run, null);
          released.push(run);
        } else if (back.has(run.id)) {
          // (Until 2026-12-07 a store outage's refunded retries were counted as shutdown's.)
          this.ended(
            p,
            !retry.refund
              ? "retried"
              : retry.errorCode === "ANALYSIS_STORAGE_UNAVAILABLE"
                ? "storage"
                : "requeued",
          );
          released.push(run);
          this.o.logger.info(
            {
              ...this.fields(run),
              status: "queued",
              delayMs: retry.delayMs,
              refunded: retry.refund,
              errorCode: retry.errorCode,
              ...answerLost,
            },
            "run re-queued",
          );
        } else if (lookup !== undefined && unsure.includes(p)) this.retries.push(p);
        else this.fenced(p);
      }
    } finally {
      // The types of give-backs settled here may be claimed again (see givingBackType()), whatever
      // the loop above threw; one whose run went back into the queue of retries waits for it.
      let cleared = false;
      for (const p of retries)
        if (!this.retries.includes(p) && this.givingBack.delete(p.run.id)) cleared = true;
      if (cleared) this.wake();
    }
    for (const t of result.finishedTasks) {
      this.o.logger.info({ taskId: t.taskId, status: t.status }, "task finished");
    }
    if (lookup !== undefined) throw lookup;
    return released;
  }

  /**
   * Slots of globally limited types, or of users at their limit, were released: other workers may now
   * claim them.
   */
  private async wakeOthers(finished: ClaimedRun[]): Promise<void> {
    const perUser = (this.o.userLimit ?? 0) > 0;
    const limited = new Set(
      finished.map((r) => r.analysisType).filter((t) => perUser || (this.o.types[t]?.globalLimit ?? 0) > 0),
    );
    if (limited.size === 0) return;
    try {
      // Under a per-user limit the room a run frees is its owner's in every type: a worker of another
      // type whose claim found the owner at the limit would otherwise wait for its poll (a review).
      if (perUser)
        await runWakeOwnersTypes(this.o.sql, [...limited], [...new Set(finished.map((r) => r.taskId))]);
      else for (const type of limited) await runWake(this.o.sql, type);
    } catch (err) {
      // Never thrown: a lost wake-up costs the others their poll at worst, and must not hold this
      // flush's next outcomes back (flushAll waits a second after a failed write).
      this.o.logger.warn({ err, workerId: this.id }, "a wake-up after released slots failed (poll instead)");
    }
  }

  private heldLeases(): Lease[] {
    const runs = [
      ...[...this.active.values()].map((a) => a.run),
      ...this.buffer,
      ...this.outcomes.map((o) => o.run),
      ...this.retries.map((r) => r.run),
    ];
    return runs.map((r) => ({ id: r.id, token: r.leaseToken }));
  }

  /** Heartbeats in flight: stop() waits for them before it deletes the worker's row. */
  private readonly beating = new Set<Promise<void>>();

  /** Extends every held lease in one statement; aborts attempts that were lost or are being cancelled. */
  async heartbeat(): Promise<void> {
    const beat = this.beat();
    this.beating.add(beat);
    try {
      await beat;
    } finally {
      this.beating.delete(beat);
    }
  }

  private async beat(): Promise<void> {
    try {
      await workerHeartbeat(this.o.sql, this.info());
      const leases = this.heldLeases();
      const alive = new Map(
        (await runHeartbeat(this.o.sql, leases, this.o.leaseTtlMs)).map((r) => [r.id, r.status]),
      );
      this.applyStatuses(alive, leases);
    } catch (err) {
      // Leases outlive a short outage (they last a whole TTL); running attempts are not disturbed.
      this.o.logger.warn({ err, workerId: this.id }, "heartbeat failed");
    }
  }

  /**
   * Takes a run out of the buffer (lost or cancelled while it waited) if it is there with the lease
   * `token`; returns it.
   */
  private unbuffer(id: number, token: string): ClaimedRun | undefined {
    const i = this.buffer.findIndex((r) => r.id === id && r.leaseToken === token);
    if (i === -1) return undefined;
    const [run] = this.buffer.splice(i, 1);
    this.bufferedAt.delete(id);
    return run;
  }

  /**
   * Acts on what a statement answered about the leases it `asked` about (`alive`: the runs whose lease
   * it matched, and their status), for the attempt or buffered run holding that very lease only. The
   * answer may come late: meanwhile the run may have been retried and claimed again by this worker,
   * and the old lease's absence from the answer says nothing about the new attempt (matched by run id
   * alone, it was aborted as lost, or dropped from the buffer).
   */
  private applyStatuses(alive: Map<number, string>, asked: Lease[]): void {
    for (const { id, token } of asked) {
      const status = alive.get(id);
      const live = this.active.get(id);
      const attempt = live?.run.leaseToken === token ? live : undefined;
      if (status === undefined) {
        const lost = attempt?.run ?? this.unbuffer(id, token);
        if (lost) this.observer.leaseLost(lost.analysisType, "heartbeat");
        attempt?.controller.abort("lost");
      } else if (status === "cancelling") {
        attempt?.controller.abort("cancel");
        const buffered = this.unbuffer(id, token);
        if (buffered) {
          this.queueOutcome(buffered, null, {
            id,
            token: buffered.leaseToken,
            status: "cancelled",
            errorCode: "ANALYSIS_PROCESS_CANCELLED",
          });
        }
      }
    }
  }

  private progressFlushMs(): number {
    return this.o.progressFlushMs ?? PROGRESS_FLUSH_MS;
  }

  /**
   * One progress flush: writes the progress (and the `running` mark) of live attempts at least
   * progressFlushMs old, and aborts those found `cancelling`. Never throws.
   */
  progressOnce(): Promise<void> {
    // One at a time. A flush waiting for a run's row (a cancel of its task holds it) was overtaken by
    // the next tick's, whose snapshot still read the run `starting`, and both recorded run.running.
    // A tick while one is in flight is skipped: its reports wait for the next tick.
    if (this.progressFlight) return this.progressFlight;
    const flight = this.progressWrite().finally(() => {
      this.progressFlight = undefined;
    });
    this.progressFlight = flight;
    return flight;
  }

  private async progressWrite(): Promise<void> {
    if (this.progress.size === 0) return;
    // Younger attempts wait for a later flush (most short ones end first).
    const youngest = performance.now() - this.progressFlushMs();
    const updates: { id: number; token: string; progress: number | null; message: string | null }[] = [];
    for (const [id, p] of this.progress) {
      const attempt = this.active.get(id);
      if (!attempt) this.progress.delete(id);
      else if (attempt.began <= youngest) {
        updates.push({ id, token: p.token, progress: p.progress, message: p.message });
        this.progress.delete(id);
      }
    }
    if (updates.length === 0) return;
    try {
      const rows = await runProgress(this.o.sql, updates);
      // The lease each row matched: the attempt may have been replaced while the write waited.
      const asked = new Map(updates.map((u) => [u.id, u.token]));
      for (const r of rows) {
        const attempt = this.active.get(r.id);
        if (r.status === "cancelling" && attempt?.run.leaseToken === asked.get(r.id))
          attempt?.controller.abort("cancel");
      }
    } catch (err) {
      // Put each update back for the next flush — the run's `running` mark above all. Dropped, a run
      // whose program reported nothing more stayed `starting`, and its task `queued`, until it ended.
      // A report made meanwhile is newer and stays; an attempt that ended or was replaced has nothing
      // left to write. (A statement whose commit's answer was lost did write: the next flush writes
      // the same progress again, one more run.progress event, which is harmless.)
      for (const u of updates) {
        if (this.active.get(u.id)?.run.leaseToken === u.token && !this.progress.has(u.id))
          this.progress.set(u.id, { token: u.token, progress: u.progress, message: u.message });
      }
      // Once per PROGRESS_WARN_MS: in an outage every flush (4 a second) fails while runs are live.
      const now = performance.now();
      if (now - this.progressWarnedAt >= PROGRESS_WARN_MS) {
        this.progressWarnedAt = now;
        this.o.logger.warn({ err, workerId: this.id }, "progress write failed (retried at each flush)");
      }
    }
  }

  /**
   * Stops claiming, lets running attempts finish for `graceMs`, then aborts the rest (their runs go
   * back to the queue without using up an attempt), waits for every handler, writes every outcome,
   * and deregisters.
   */
  async stop(graceMs = 0): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    clearTimeout(this.storageHoldTimer);
    this.endBackoff?.();
    this.wake();
    await this.loop;
    await this.newcomerFlight;
    // Runs a failed claim may have taken: found, they go back below with the buffer, refunded. A
    // claim that commits after this look leaves its runs to the reaper.
    if (this.orphanCheck || performance.now() < this.orphanWatchUntil)
      await this.adoptOrphans().catch((err: unknown) =>
        this.o.logger.warn({ err, workerId: this.id }, "could not look for runs a failed claim had taken"),
      );
    // No statement of ours after stop(): the caller may close the pool next.
    await Promise.all(this.pruning.values());
    await Promise.all(this.tidying.values());
    this.releaseBuffered();
    const all = () => Promise.all([...this.active.values()].map((a) => a.done));
    if (this.active.size > 0 && graceMs > 0) {
      await Promise.race([all(), sleep(graceMs)]);
    }
    for (const a of this.active.values()) a.controller.abort("shutdown");
    await all();
    await this.progressFlight; // a flush in flight ends before the worker does
    await this.progressOnce();
    clearTimeout(this.flushTimer);
    this.flushTimer = undefined;
    await this.flush();
    for (const t of this.timers) clearTimeout(t);
    this.timers = [];
    clearTimeout(this.retryWake?.timer);
    this.retryWake = undefined;
    this.retriesDue = [];
    await this.unlisten?.().catch(() => {});
    // A heartbeat in flight would register the worker again after the delete (its upsert inserts a
    // missing row): a row of a worker that is gone, live to the API for up to WORKER_STALE_TTLS.
    if (this.beating.size > 0) {
      this.o.logger.debug({ workerId: this.id }, "waiting for the heartbeat in flight");
      await Promise.all(this.beating);
    }
    await workerDelete(this.o.sql, this.id).catch((err) =>
      this.o.logger.warn({ err, workerId: this.id }, "could not deregister"),
    );
    this.o.logger.info({ workerId: this.id }, "worker stopped");
  }
}

/** A TASK_CREATED_CHANNEL payload, or undefined when it is not one (a newer or older sender). */
function parseCreated(payload: string): (CreatedTask & { type: string }) | undefined {
  let v: unknown;
  try {
    v = JSON.parse(payload);
  } catch {
    return undefined;
  }
  if (typeof v !== "object" || v === null) return undefined;
  const { type, taskId, runId, ownerId, priority } = v as Record<string, unknown>;
  if (
    typeof type !== "string" ||
    !Number.isSafeInteger(taskId) ||
    !Number.isSafeInteger(runId) ||
    !Number.isSafeInteger(ownerId) ||
    !Number.isSafeInteger(priority)
  )
    return undefined;
  return {
    type,
    taskId: taskId as number,
    runId: runId as number,
    ownerId: ownerId as number,
    priority: priority as number,
  };
}

/**
 * Whether a refused batch is to blame for its refusal (Worker.writeBatch): a data exception (SQLSTATE
 * class 22: a value the statement carried was refused, 22P05 a NUL) at once, an integrity constraint
 * violation (class 23) when the batch, or an outcome in it, was refused for one before as well. Nothing else:
 * a connection's or a server's trouble (08, 53, 54 "too many notifications", 57, XX, a socket's, ...)
 * is waited out by retrying the whole batch, as it always was — blamed, a success would be recorded
 * as failed for a passing outage (a review). `batch` given: the constraint refusals counted so far.
 */
function inputAtFault(err: unknown, batch?: readonly { refusals?: number }[]): boolean {
  const code = sqlStateOf(err);
  if (code === undefined) return false;
  if (code.startsWith("22")) return true;
  return code.startsWith("23") && (batch?.some((p) => (p.refusals ?? 0) > 1) ?? true);
}

/** The SQLSTATE of an error PostgreSQL raised, or undefined (a socket's, the client's, ...). */
function sqlStateOf(err: unknown): string | undefined {
  if (!(err instanceof Error) || err.name !== "PostgresError") return undefined;
  const code = (err as { code?: unknown }).code;
  return typeof code === "string" ? code : undefined;
}
