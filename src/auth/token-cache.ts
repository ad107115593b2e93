// A short-lived cache of authenticated tokens, so a request does not pay a database round trip for its
// token: the API's hot reads (a task, a page of runs, an upload) are one statement each instead of two.
// A revoke or a role change notifies TOKENS_CHANNEL and every API process empties its cache at once;
// should that notification be lost (the listener reconnecting), an entry still lives at most
// TOKEN_CACHE_TTL_MS. An entry never outlives its token's expiry, which needs no notification. Keys are
// the tokens' SHA-256 (what the database stores), never the tokens.
import { DB_ANSWER_MS, type Sql } from "../db/client.ts";
import { listenUntilStopped } from "../db/listen.ts";
import type { Logger } from "../log.ts";
import type { Authenticated } from "./tokens.ts";

/** Revokes and role changes are announced here (payload: the token id, or "*" for every token). */
export const TOKENS_CHANNEL = "assay_tokens";
/** The longest a cached token is trusted without asking the database. */
export const TOKEN_CACHE_TTL_MS = 5_000;
/** Entries kept; the oldest go first. */
const MAX_ENTRIES = 10_000;

export class TokenCache {
  private readonly entries = new Map<string, { principal: Authenticated; expires: number }>();
  private unlisten: (() => Promise<void>) | undefined;
  /** Aborted by stop(): the listener's callbacks, a failed one's included, do nothing after it. */
  private stopped = new AbortController();
  /** False until the listener is up: until then nothing is cached (a revoke could not reach it). */
  private listening = false;
  /**
   * Moves on every clear(). A lookup takes it before asking the database and stores its answer only
   * if it has not moved: a revoke that committed, and emptied the cache, while the lookup was in
   * flight must not see the lookup's older answer stored after it.
   */
  private generation = 0;
  /** Sweeps expired entries from start() to stop() (see sweep()). */
  private sweeper: NodeJS.Timeout | undefined;
  readonly ttlMs: number;

  constructor(ttlMs = TOKEN_CACHE_TTL_MS) {
    this.ttlMs = ttlMs;
  }

  /**
   * `now` and expiries are on the monotonic clock (performance.now()): on the wall clock, a step back
   * (an NTP correction, a VM resumed) kept every entry trusted without a query for as long as the
   * step, a revoke whose notification was lost included.
   */
  get(hash: string, now = performance.now()): Authenticated | undefined {
    const entry = this.entries.get(hash);
    if (!entry) return undefined;
    if (entry.expires <= now) {
      this.entries.delete(hash);
      return undefined;
    }
    return entry.principal;
  }

  /** The ticket a lookup takes before it asks the database (see set). */
  begin(): number {
    return this.generation;
  }

  /**
   * Stores a lookup's answer, unless the cache was emptied since the lookup's `ticket` (begin()), until
   * the cache's expiry or the token's own (`principal.deadline`), whichever comes first.
   */
  set(hash: string, principal: Authenticated, ticket: number, now = performance.now()): void {
    if (!this.listening || this.ttlMs <= 0 || ticket !== this.generation) return;
    const expires = Math.min(now + this.ttlMs, principal.deadline ?? Number.POSITIVE_INFINITY);
    if (expires <= now) return;
    if (this.entries.size >= MAX_ENTRIES) {
      const oldest = this.entries.keys().next().value;
      if (oldest !== undefined) this.entries.delete(oldest);
    }
    this.entries.set(hash, { principal, expires });
  }

  clear(): void {
    this.generation++;
    this.entries.clear();
  }

  /**
   * Drops every expired entry. Expiry is otherwise seen only by a lookup of the same token, so tokens
   * used once (a burst of short-lived clients) stayed until newer entries pushed them out. Run every
   * TOKEN_CACHE_TTL_MS (at least a second) from start() to stop().
   */
  sweep(now = performance.now()): void {
    for (const [hash, entry] of this.entries) if (entry.expires <= now) this.entries.delete(hash);
  }

  get size(): number {
    return this.entries.size;
  }

  private readonly revokeListeners = new Set<(tokenId: string) => void>();

  /**
   * Tells `listener` of every revoke (the token's id) and role change ("*": any token's principal
   * may have changed) as its notification arrives, and of every reconnect of the listener ("*": a
   * notification may have been missed): what a request checked once, at its start, such as a live
   * event stream's right to its task, must be checked again. Returns the unsubscribe.
   */
  onRevoke(listener: (tokenId: string) => void): () => void {
    this.revokeListeners.add(listener);
    return () => this.revokeListeners.delete(listener);
  }

  /** How many onRevoke listeners are subscribed (each live stream or response under way has one). */
  get revokeListenerCount(): number {
    return this.revokeListeners.size;
  }

  /**
   * Listens for revokes (on postgres.js's LISTEN connection, shared with the event hub). A reconnect
   * empties the cache: notifications may have been missed meanwhile.
   */
  async start(sql: Sql, logger: Logger): Promise<void> {
    this.stopped = new AbortController();
    clearInterval(this.sweeper);
    this.sweeper = setInterval(() => this.sweep(), Math.max(this.ttlMs, 1_000));
    this.sweeper.unref();
    try {
      const { unlisten } = await listenUntilStopped(
        sql,
        TOKENS_CHANNEL,
        (payload) => {
          this.clear();
          for (const listener of this.revokeListeners) listener(payload);
        },
        () => {
          this.clear();
          // Listening, the first time or again: revokes and role changes may have been missed — during
          // a reconnect, or, the first time, by what started while nothing listened (a LISTEN that
          // failed at start-up and came up later: downloads and streams are served meanwhile).
          for (const listener of this.revokeListeners) listener("*");
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
      logger.warn({ err }, "token cache off until it can listen for revokes");
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
