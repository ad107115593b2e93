// A background loop as a service (River style): start/stop, and a runOnce() that tests call directly.
// Passes run on a jittered interval, one at a time; stop() waits for the pass in progress.
import type { Logger } from "../log.ts";
import { timerDelay } from "../timers.ts";
import { jitter } from "./backoff.ts";

/**
 * The longest a service with a long interval (retention, the store sweep: an hour by default) waits
 * for its first pass after start. Waiting a jittered interval instead, a process that lives less than
 * that (a worker restarted often, one started for a batch) never ran the pass at all.
 */
export const FIRST_PASS_WITHIN_MS = 60_000;

/** Failures a pass logged itself, with more to say (the prefix, the task) than the service could. */
const logged = new WeakSet<object>();

/**
 * Marks `err` as logged by the pass that throws it: the service does not log it again as the pass's
 * failure (each failure of the store sweep and of retention was logged twice).
 */
export function loggedFailure(err: unknown): unknown {
  if (typeof err === "object" && err !== null) logged.add(err);
  return err;
}

export abstract class IntervalService<T> {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<unknown> | undefined;
  private started = false;
  /** Counts start()s: a pass schedules the next only within its own (see start()). */
  private chain = 0;
  /** Set by stop(): a long pass may check it between batches. */
  protected stopping = false;

  private readonly name: string;
  private readonly intervalMs: number;
  private readonly firstPassWithinMs: number | undefined;
  protected readonly logger: Logger;

  /**
   * With `firstPassWithinMs`, the first pass after start() comes at a random moment within that long
   * (so a fleet started together does not run it in lockstep), at most the interval; without it, a
   * jittered interval after start(), like every later pass.
   */
  protected constructor(name: string, intervalMs: number, logger: Logger, firstPassWithinMs?: number) {
    this.name = name;
    this.intervalMs = intervalMs;
    this.firstPassWithinMs =
      firstPassWithinMs === undefined ? undefined : Math.max(0, Math.min(intervalMs, firstPassWithinMs));
    this.logger = logger;
  }

  /** One full pass. */
  abstract runOnce(): Promise<T>;

  /**
   * Starts the passes; a service already started is left as it is. A start after stop() (awaited or
   * not) begins a new chain of passes: a pass of the old chain still running schedules nothing after
   * it (`chain`), or two chains would run side by side.
   */
  start(): void {
    if (this.started && !this.stopping) return;
    this.started = true;
    this.stopping = false;
    this.chain++;
    this.schedule(
      this.firstPassWithinMs === undefined
        ? jitter(this.intervalMs)
        : timerDelay(Math.round(Math.random() * this.firstPassWithinMs)),
    );
  }

  private schedule(delayMs = jitter(this.intervalMs), chain = this.chain): void {
    if (!this.started || this.stopping || chain !== this.chain) return;
    this.timer = setTimeout(() => {
      // After a restart the old chain's last pass may still run: one pass at a time all the same.
      this.running = Promise.resolve(this.running)
        .then(() => this.runOnce())
        .catch((err) => {
          if (!(typeof err === "object" && err !== null && logged.has(err)))
            this.logger.warn({ err }, `${this.name} pass failed`);
        })
        .finally(() => this.schedule(undefined, chain));
    }, delayMs);
  }

  async stop(): Promise<void> {
    this.stopping = true;
    clearTimeout(this.timer);
    await this.running;
  }
}
