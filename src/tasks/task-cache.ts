// A short-lived cache of what GET /api/analysis-tasks/:id and a task's runs pages answer, one per API
// process, so a task polled by many clients costs one statement per TASK_CACHE_TTL_MS and page instead
// of one per request.
//
// - Every notification on EVENTS_CHANNEL for a task (a state change, progress, a cancel, a finish)
//   drops that task's answers, before the event hub delivers the notification to SSE streams (this
//   listener is registered first): a client that reads after an event reads what the event announced.
//   A cancel through this process drops them when its statement returns.
// - A read that began before an invalidation of its task is not stored (a generation check), so a
//   notification that arrives while a statement is in flight cannot be overwritten by its older answer.
// - Nothing is cached until the listener is up, and a (re)connect empties the cache: notifications
//   may have been missed meanwhile. Changes that send no notification show within TASK_CACHE_TTL_MS:
//   a claim (a run `queued` → `starting`, and a retried run given its earlier progress back),
//   retention deleting a task; and any change for the few milliseconds its notification takes to
//   arrive (a read right after a worker's statement may still get the answer from before it).
// - Queued tasks' views are not cached (the route's rule): their queue estimate depends on other
//   users' runs.
// - Visibility is checked on every request against the cached owner (an admin sees all, a user their
//   own), exactly as the statement's WHERE clause does.
import type { Principal } from "../auth/tokens.ts";
import { DB_ANSWER_MS, type Sql } from "../db/client.ts";
import { listenUntilStopped } from "../db/listen.ts";
import type { Logger } from "../log.ts";
import { EVENTS_CHANNEL } from "../queue/sql.ts";

/** The longest a cached answer is served without asking the database. */
export const TASK_CACHE_TTL_MS = 1_000;
/** Tasks kept; the oldest go first. */
const MAX_TASKS = 10_000;
/** Runs pages kept, over all tasks (a page is up to 100 runs); the oldest task's go first. */
const MAX_PAGES = 1_000;
/**
 * Runs in the pages kept, over all tasks; the oldest task's go first. A run's view with metrics of
 * usual size is ~450 bytes of heap, so this keeps the pages near 10 MiB (a program may write metrics of
 * up to a 64 KiB line, so runs are not bytes): bounded by pages alone, a client paging through a
 * 100,000-run task 100 at a time left 1,000 pages (~45 MiB) in the heap.
 */
const MAX_PAGE_RUNS = 20_000;
/** Invalidations remembered for in-flight reads; past this the record is dropped as a whole. */
const MAX_INVALIDATIONS = 10_000;

/** Returned by begin(): what set() needs to know whether the read is still current. */
export type ReadTicket = number;

interface Answer {
  ownerId: number;
  value: unknown;
  expires: number;
  /** A page's runs (counted against MAX_PAGE_RUNS); 0 for a task's view. */
  runs: number;
}

/** The task id a notification on EVENTS_CHANNEL is about (`{"taskId" : "12", ...}`), if readable. */
export function taskIdOf(payload: string): string | undefined {
  const m = /^\{\s*"taskId"\s*:\s*"(\d+)"/.exec(payload);
  if (m) return m[1];
  try {
    const taskId = (JSON.parse(payload) as { taskId?: unknown }).taskId;
    return typeof taskId === "string" ? taskId : undefined;
  } catch {
    return undefined;
  }
}

export class TaskCache {
  /** Per task, its view. */
  private readonly tasks = new Map<string, Answer>();
  /** Per task, its runs pages by query (see pageKey). */
  private readonly pages = new Map<string, Map<string, Answer>>();
  private pageCount = 0;
  /** Runs in the pages kept. */
  private pageRuns = 0;
  /** Sweeps expired answers while the listener is up (see sweep()). */
  private sweeper: NodeJS.Timeout | undefined;
  /** Per task, the generation of its latest invalidation (pruned: see MAX_INVALIDATIONS). */
  private readonly invalidated = new Map<string, number>();
  private generation = 0;
  /** Reads that began before this generation are never stored (set by clear()). */
  private floor = 0;
  private unlisten: (() => Promise<void>) | undefined;
  /** Aborted by stop(): the listener's callbacks, a failed one's included, do nothing after it. */
  private stopped = new AbortController();
  /** False until the listener is up: until then nothing is cached (an event could not reach it). */
  private listening = false;
  readonly ttlMs: number;

  constructor(ttlMs = TASK_CACHE_TTL_MS) {
    this.ttlMs = ttlMs;
  }

  /**
   * A task's fresh view, with its owner: the caller checks visibility (visibleTo) before using it.
   * `now` and expiries are on the monotonic clock (performance.now()), as the token cache's: on the
   * wall clock a step back kept answers for as long as the step.
   */
  get<T>(taskId: string, now = performance.now()): { value: T; ownerId: number } | undefined {
    const answer = this.tasks.get(taskId);
    if (!answer) return undefined;
    if (answer.expires <= now) {
      this.tasks.delete(taskId);
      return undefined;
    }
    return { value: answer.value as T, ownerId: answer.ownerId };
  }

  /** A fresh runs page of a task (`key`: pageKey()), with its owner; the caller checks visibility. */
  getPage<T>(
    taskId: string,
    key: string,
    now = performance.now(),
  ): { value: T; ownerId: number } | undefined {
    const answer = this.pages.get(taskId)?.get(key);
    if (!answer) return undefined;
    if (answer.expires <= now) {
      this.dropPage(taskId, key, answer);
      return undefined;
    }
    return { value: answer.value as T, ownerId: answer.ownerId };
  }

  /**
   * Stores a runs page (of `runs` runs) a read begun at `ticket` found, unless its task was
   * invalidated since.
   */
  setPage(
    taskId: string,
    key: string,
    ownerId: number,
    value: unknown,
    runs: number,
    ticket: ReadTicket,
    now = performance.now(),
  ) {
    if (!this.storable(taskId, ticket)) return;
    // A page stored again under its key replaces the one there (and its count).
    const replaced = this.pages.get(taskId)?.get(key);
    if (replaced) this.dropPage(taskId, key, replaced);
    while (this.pageCount >= MAX_PAGES || (this.pageCount > 0 && this.pageRuns + runs > MAX_PAGE_RUNS)) {
      const oldest = this.pages.keys().next().value;
      if (oldest === undefined) break;
      this.dropPages(oldest);
    }
    // The oldest task dropped may have been this one: its map is gone from the cache, and a page
    // stored in it would be counted and never found (the count then drifted up until nothing was
    // cached at all).
    let pages = this.pages.get(taskId);
    if (!pages) {
      pages = new Map();
      this.pages.set(taskId, pages);
    }
    pages.set(key, { ownerId, value, expires: now + this.ttlMs, runs });
    this.pageCount++;
    this.pageRuns += runs;
  }

  private dropPages(taskId: string): void {
    const pages = this.pages.get(taskId);
    if (!pages) return;
    for (const answer of pages.values()) this.pageRuns -= answer.runs;
    this.pageCount -= pages.size;
    this.pages.delete(taskId);
  }

  private dropPage(taskId: string, key: string, answer: Answer): void {
    const pages = this.pages.get(taskId);
    if (!pages?.delete(key)) return;
    this.pageCount--;
    this.pageRuns -= answer.runs;
    if (pages.size === 0) this.pages.delete(taskId);
  }

  /**
   * Drops every expired answer. Expiry is otherwise seen only by a read of the same answer, so a burst
   * of reads nobody repeats (a client paging through a large task once) stayed in the heap until
   * other answers pushed it out. Run every TASK_CACHE_TTL_MS (at least a second) from start() to stop().
   */
  sweep(now = performance.now()): void {
    for (const [taskId, answer] of this.tasks) if (answer.expires <= now) this.tasks.delete(taskId);
    for (const [taskId, pages] of this.pages) {
      for (const [key, answer] of pages) if (answer.expires <= now) this.dropPage(taskId, key, answer);
    }
  }

  private storable(taskId: string, ticket: ReadTicket): boolean {
    if (!this.listening || this.ttlMs <= 0) return false;
    return ticket >= this.floor && (this.invalidated.get(taskId) ?? -1) < ticket;
  }

  /** Call before reading from the database; pass the ticket to set(). */
  begin(): ReadTicket {
    return this.generation;
  }

  /** Stores what a read begun at `ticket` found, unless its task was invalidated since. */
  set(taskId: string, ownerId: number, value: unknown, ticket: ReadTicket, now = performance.now()) {
    if (!this.storable(taskId, ticket)) return;
    if (!this.tasks.has(taskId) && this.tasks.size >= MAX_TASKS) {
      const oldest = this.tasks.keys().next().value;
      if (oldest !== undefined) this.tasks.delete(oldest);
    }
    this.tasks.set(taskId, { ownerId, value, expires: now + this.ttlMs, runs: 0 });
  }

  /** Drops a task's answers, and those of reads of it still in flight. */
  invalidate(taskId: string): void {
    this.tasks.delete(taskId);
    this.dropPages(taskId);
    if (this.invalidated.size >= MAX_INVALIDATIONS) {
      this.invalidated.clear();
      this.floor = this.generation + 1;
    }
    this.invalidated.set(taskId, this.generation++);
  }

  /** Drops everything, and the answers of every read in flight. */
  clear(): void {
    this.tasks.clear();
    this.pages.clear();
    this.pageCount = 0;
    this.pageRuns = 0;
    this.invalidated.clear();
    this.floor = ++this.generation;
  }

  /** Task views kept. */
  get size(): number {
    return this.tasks.size;
  }

  /** Runs pages kept. */
  get pagesSize(): number {
    return this.pageCount;
  }

  /** Runs in the pages kept. */
  get pageRunsSize(): number {
    return this.pageRuns;
  }

  /**
   * Listens for task events (postgres.js's LISTEN connection, shared with the token cache and the
   * event hub). Start it before the hub, so answers are gone before a stream delivers the event.
   */
  async start(sql: Sql, logger: Logger): Promise<void> {
    this.stopped = new AbortController();
    clearInterval(this.sweeper);
    this.sweeper = setInterval(() => this.sweep(), Math.max(this.ttlMs, 1_000));
    this.sweeper.unref();
    try {
      const { unlisten } = await listenUntilStopped(
        sql,
        EVENTS_CHANNEL,
        (payload) => {
          const taskId = taskIdOf(payload);
          if (taskId === undefined) this.clear();
          else this.invalidate(taskId);
        },
        () => {
          this.clear();
          this.listening = true;
        },
        // A failed LISTEN stays registered, and postgres.js listens with it once it has reconnected:
        // the cache comes back then (until stop()).
        // Bounded: the API listens (its /readyz says 503) whatever the database does at start.
        { until: this.stopped.signal, withinMs: DB_ANSWER_MS },
      );
      this.unlisten = unlisten;
    } catch (err) {
      // Until the listener is up (postgres.js retries it after a reconnect) the cache stays empty:
      // every request asks the database.
      logger.warn({ err }, "task cache off until it can listen for task events");
    }
  }

  async stop(): Promise<void> {
    this.stopped.abort();
    clearInterval(this.sweeper);
    this.sweeper = undefined;
    this.listening = false;
    this.clear();
    await this.unlisten?.().catch(() => {});
    this.unlisten = undefined;
  }
}

/** The visibility rule of read.ts's `visible`, for a task whose owner is known. */
export function visibleTo(p: Principal, ownerId: number): boolean {
  return p.role === "admin" || p.userId === ownerId;
}

/** The cache key of a runs page: its query. */
export function pageKey(q: {
  status?: string | undefined;
  cursor?: string | undefined;
  limit: number;
}): string {
  return `${q.status ?? ""}|${q.cursor ?? ""}|${q.limit}`;
}
