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

/** Listens on every channel; retries a few times, as the shared connection may be reconnecting. */
export async function listenAll(
  sql: Sql,
  subscriptions: Subscription[],
  attempts = 5,
): Promise<() => Promise<void>> {
  for (let attempt = 1; ; attempt++) {
    const done: { unlisten(): Promise<void> }[] = [];
    try {
      for (const s of subscriptions) done.push(await sql.listen(s.channel, s.onNotify, s.onListen));
      return async () => {
        for (const d of done) await d.unlisten();
      };
    } catch (err) {
      for (const d of done) await d.unlisten().catch(() => {});
      if (attempt >= attempts) throw err;
      await delay(100 * attempt);
    }
  }
}
