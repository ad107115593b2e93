// LISTEN on several channels through postgres.js's dedicated listener connection (outside the pool;
// it reconnects and re-listens by itself, calling `onListen` again each time).
import { setTimeout as delay } from "node:timers/promises";
import type { Sql } from "./client.ts";

export interface Subscription {
  channel: string;
  onNotify(payload: string): void;
  /** After the first LISTEN and after every reconnect: notifications may have been missed. */
  onListen?(): void;
}

/**
 * `sql.listen`, whose callbacks are never called again once its `unlisten` has been called, or the
 * LISTEN failed, or `o.until` aborted. postgres.js re-listens after a reconnect under new
 * registrations of the callbacks, which the `unlisten` it returned no longer finds (it drops its own
 * registration only), and it keeps and re-listens the callbacks of a LISTEN that failed: either way
 * they went on being called for good — a stopped token cache re-enabled itself at the next reconnect.
 * Those registrations stay with postgres.js (it has nothing to drop them with), holding only this
 * function's empty closure. With `o.until`, a failed LISTEN's callbacks stay live instead, until it
 * aborts: postgres.js listens with them once it has reconnected, and a cache started during an
 * outage comes back then (a caller that retries its start itself, as the event hub does, must not
 * pass it, or every retry adds a live registration). With `o.withinMs`, a LISTEN not made within that
 * long fails as one that failed (postgres.js may make it later).
 */
export async function listenUntilStopped(
  sql: Sql,
  channel: string,
  onNotify: (payload: string) => void,
  onListen?: () => void,
  o: { until?: AbortSignal; withinMs?: number } = {},
): Promise<{ state: unknown; unlisten(): Promise<void> }> {
  let callbacks: { onNotify: (payload: string) => void; onListen?: (() => void) | undefined } | undefined = {
    onNotify,
    onListen,
  };
  const live = () => (o.until?.aborted ? undefined : callbacks);
  try {
    const listening = sql.listen(
      channel,
      (payload) => live()?.onNotify(payload),
      () => live()?.onListen?.(),
    );
    const { state, unlisten } = await withinMs(listening, o.withinMs, channel, o.until);
    return {
      state,
      unlisten: async () => {
        callbacks = undefined;
        await withinUnlistenWait(unlisten());
      },
    };
  } catch (err) {
    if (!o.until) callbacks = undefined;
    throw err;
  }
}

/**
 * `listening`, or a failure after `ms` (none without): postgres.js makes a LISTEN connection that a
 * peer closes before the database answers (a proxy with nothing behind it) again at once, for ever,
 * with the LISTEN waiting (3.4.9), and a start-up that awaited it never listened. A LISTEN that ends
 * later is the caller's failed one: its callbacks live on only with `until` (see above), and it is
 * unlistened once `until` aborts.
 */
async function withinMs<T extends { unlisten(): Promise<void> }>(
  listening: Promise<T>,
  ms: number | undefined,
  channel: string,
  until: AbortSignal | undefined,
): Promise<T> {
  if (ms === undefined) return listening;
  let timer: NodeJS.Timeout | undefined;
  let late = false;
  listening.then(
    ({ unlisten }) => {
      if (!late) return;
      const drop = () => void unlisten().catch(() => {});
      if (!until || until.aborted) drop();
      else until.addEventListener("abort", drop, { once: true });
    },
    () => {},
  );
  try {
    return await Promise.race([
      listening,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          late = true;
          reject(new Error(`no LISTEN on ${channel} within ${ms / 1000} s`));
        }, ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * How long a stop waits for its UNLISTEN: on a LISTEN connection that went silent without closing (a
 * failover that left it open) the UNLISTEN is never answered, and a worker's or API's shutdown waited
 * for it for good. The callbacks are muted before it is sent; an UNLISTEN not made in time is made by
 * the connection's end (the pool's, at shutdown).
 */
export const UNLISTEN_WAIT_MS = 2_000;

async function withinUnlistenWait(unlistening: Promise<void>): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  unlistening.catch(() => {});
  try {
    await Promise.race([
      unlistening,
      new Promise<void>((resolve) => {
        timer = setTimeout(resolve, UNLISTEN_WAIT_MS);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** Listens on every channel; retries a few times, as the shared connection may be reconnecting. */
export async function listenAll(
  sql: Sql,
  subscriptions: Subscription[],
  attempts = 5,
): Promise<() => Promise<void>> {
  for (let attempt = 1; ; attempt++) {
    const done: { unlisten(): Promise<void> }[] = [];
    try {
      for (const s of subscriptions)
        done.push(await listenUntilStopped(sql, s.channel, s.onNotify, s.onListen));
      return async () => {
        await Promise.all(done.map((d) => d.unlisten()));
      };
    } catch (err) {
      for (const d of done) await d.unlisten().catch(() => {});
      if (attempt >= attempts) throw err;
      await delay(100 * attempt);
    }
  }
}
