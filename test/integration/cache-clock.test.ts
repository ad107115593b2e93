// The API's caches expire on a clock that never goes back. The token cache's expiry is the bound on how
// long a revoke whose notification was lost (the LISTEN connection down, say) leaves its token working,
// and the task cache's how long a change that sends no notification (a claim) stays unseen: both must
// hold whatever the wall clock does. A clock stepped back (an NTP correction, a VM resumed from a
// snapshot) once kept every cached entry, without a query, for as long as the step.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { TokenCache } from "../../src/auth/token-cache.ts";
import { hashToken, tokenAuthenticate, tokenCreate } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { TaskCache } from "../../src/tasks/task-cache.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { waitFor } from "../helpers/queue.ts";

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.drop());

test("a token revoked without a notification is refused once its entry expires, though the wall clock stepped back", {
  timeout: 30_000,
}, async () => {
  const ttlMs = 300;
  const cache = new TokenCache(ttlMs);
  await cache.start(db.sql, createLogger({ level: "silent" }));
  const wallClock = Date.now;
  try {
    // Past a digit boundary, with a name that is not ASCII.
    await db.sql`select setval('api_tokens_id_seq', 99999)`;
    const created = await tokenCreate(db.sql, "Zoë «ops» 𝔘");
    assert.equal(created.tokenId, 100000);
    assert.equal((await tokenAuthenticate(db.sql, created.token, cache))?.tokenId, created.tokenId);
    assert.ok(cache.get(hashToken(created.token)), "the token is cached");

    // The wall clock goes back an hour; the token is revoked and its notification lost (as with the
    // LISTEN connection down: nothing else tells the cache).
    Date.now = () => wallClock() - 3_600_000;
    await db.sql`update api_tokens set revoked_at = now() where id = ${created.tokenId}`;
    const revokedAt = performance.now();
    await waitFor(
      async () => (await tokenAuthenticate(db.sql, created.token, cache)) === undefined,
      ttlMs + 5_000,
      "the revoked token to be refused",
    );
    assert.ok(performance.now() - revokedAt < ttlMs + 2_000, "refused within the cache's expiry");
  } finally {
    Date.now = wallClock;
    await cache.stop();
  }
});

test("a task's cached answer expires on time, though the wall clock stepped back", async () => {
  const cache = new TaskCache(300);
  await cache.start(db.sql, createLogger({ level: "silent" }));
  const wallClock = Date.now;
  try {
    cache.set("100000000", 98, { status: "queued" }, cache.begin());
    cache.setPage("100000000", "limit=20", 98, { items: [] }, 0, cache.begin());
    assert.ok(cache.get("100000000"));
    Date.now = () => wallClock() - 3_600_000;
    const storedAt = performance.now();
    await waitFor(
      async () =>
        cache.get("100000000") === undefined && cache.getPage("100000000", "limit=20") === undefined,
      5_000,
      "the cached answers to expire",
    );
    assert.ok(performance.now() - storedAt < 2_000, "expired within the cache's TTL");
  } finally {
    Date.now = wallClock;
    await cache.stop();
  }
});

test("the token cache sweeps expired entries by itself, none read again", async () => {
  const cache = new TokenCache(300);
  await cache.start(db.sql, createLogger({ level: "silent" }));
  try {
    const principal = { userId: 100000, tokenId: 100001, name: "Zoë", role: "user" as const };
    // One clock reading for what follows: a stall on a loaded machine must not expire the fresh ones.
    const now = performance.now();
    for (let i = 0; i < 100; i++) cache.set(`hash-${i}`, principal, cache.begin(), now);
    // Stored a minute ago: expired since.
    cache.set("stale", principal, cache.begin(), now - 60_000);
    assert.equal(cache.size, 101);
    // A sweep keeps what is fresh and drops what expired.
    cache.sweep(now);
    assert.equal(cache.size, 100);
    assert.equal(cache.get("stale", now), undefined);
    assert.ok(cache.get("hash-0", now));
    cache.sweep(now + 301);
    assert.equal(cache.size, 0);
    // Started, it sweeps by itself: no lookup of these entries happens again.
    for (let i = 0; i < 100; i++) cache.set(`hash-${i}`, principal, cache.begin());
    await waitFor(async () => cache.size === 0, 5_000, "the expired entries to be swept");
  } finally {
    await cache.stop();
  }
});
