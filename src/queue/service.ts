// A background loop as a service (River style): start/stop, and a runOnce() that tests call directly.
// Passes run on a jittered interval, one at a time; stop() waits for the pass in progress.
import type { Logger } from "../log.ts";
import { jitter } from "./backoff.ts";

export abstract class IntervalService<T> {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<unknown> | undefined;
  private started = false;
  /** Set by stop(): a long pass may check it between batches. */
  protected stopping = false;

  private readonly name: string;
  private readonly intervalMs: number;
  protected readonly logger: Logger;

  protected constructor(name: string, intervalMs: number, logger: Logger) {
    this.name = name;
    this.intervalMs = intervalMs;
    this.logger = logger;
  }

  /** One full pass. */
  abstract runOnce(): Promise<T>;

  start(): void {
    this.started = true;
    this.stopping = false;
    this.schedule();
  }

  private schedule(): void {
    if (!this.started || this.stopping) return;
    this.timer = setTimeout(() => {
      this.running = this.runOnce()
        .catch((err) => this.logger.warn({ err }, `${this.name} pass failed`))
        .finally(() => this.schedule());
    }, jitter(this.intervalMs));
  }

  async stop(): Promise<void> {
    this.stopping = true;
    clearTimeout(this.timer);
    await this.running;
  }
}
