// The watch on a token that authorised something still going (token-watch.ts): it ends that on the
// token's revoke, on a role change, at the token's expiry however far off, and on a revoke announced
// between the token's check and the watch's start, which it did not hear.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { TOKENS_CHANNEL, TokenCache } from "../../src/auth/token-cache.ts";
import { atDeadline, type TokenEnd, watchToken } from "../../src/auth/token-watch.ts";
import { tokenAuthenticate, tokenCreate, tokenRevoke } from "../../src/auth/tokens.ts";
import { createDatabase } from "../../src/db/client.ts";
import { createLogger } from "../../src/log.ts";
import { MAX_TIMER_MS } from "../../src/timers.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { waitFor } from "../helpers/queue.ts";

let db: TestDatabase;
let cache: TokenCache;
before(async () => {
  db = await createTestDatabase();
  await db.sql`select setval('api_tokens_id_seq', 9999999)`;
  cache = new TokenCache();
  await cache.start(db.sql, createLogger({ level: "silent" }));
});
after(async () => {
  await cache.stop();
  await db.drop();
});

test("a revoke announced after the token's check and before the watch started ends what it watches", async () => {
  const created = await tokenCreate(db.sql, "Þóra «watch»");
  const ticket = cache.begin();
  const principal = await tokenAuthenticate(db.sql, created.token, cache);
  assert.ok(principal);
  // Revoked, and announced, before the watch starts: its listener never hears it.
  assert.equal(await tokenRevoke(db.sql, created.tokenId), true);
  await waitFor(async () => cache.begin() !== ticket, 5_000, "the revoke's notification");
  const ends: TokenEnd[] = [];
  const stop = watchToken(db.sql, cache, { ...principal, ticket }, (why) => ends.push(why));
  await waitFor(async () => ends.length > 0, 5_000, "the watch to end it");
  assert.deepEqual(ends, ["revoked"]);
  assert.equal(cache.revokeListenerCount, 0, "the watch's listener is gone");
  stop();
});

test("a watch ends once, on its token's revoke, not another's; stop() ends the watch without a call", async () => {
  const mine = await tokenCreate(db.sql, "Þóra «watch»");
  const other = await tokenCreate(db.sql, "Þóra «watch»");
  const ends: TokenEnd[] = [];
  watchToken(db.sql, cache, { tokenId: mine.tokenId, role: "user", ticket: cache.begin() }, (why) =>
    ends.push(why),
  );
  const quiet: TokenEnd[] = [];
  const stopQuiet = watchToken(db.sql, cache, { tokenId: other.tokenId, role: "user" }, (why) =>
    quiet.push(why),
  );
  assert.equal(cache.revokeListenerCount, 2);
  assert.equal(await tokenRevoke(db.sql, mine.tokenId), true);
  await waitFor(async () => ends.length > 0, 5_000, "the watch to end it");
  stopQuiet();
  assert.equal(cache.revokeListenerCount, 0);
  assert.equal(await tokenRevoke(db.sql, other.tokenId), true);
  await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual([ends, quiet], [["revoked"], []]);
});

test("a deadline past the longest timer does not fire early; one near fires on time", async () => {
  let far = false;
  const cancelFar = atDeadline(performance.now() + MAX_TIMER_MS * 3, () => {
    far = true;
  });
  const start = performance.now();
  await new Promise<void>((resolve) => atDeadline(start + 200, resolve));
  assert.ok(performance.now() - start >= 195);
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(far, false, "a deadline months away has not fired");
  cancelFar();
});

/**
 * A connection that cannot read the tokens: every check fails, as on a database unsure a moment after
 * its LISTEN connection came back — until mend() grants it what it reads.
 */
async function unsureDatabase() {
  const role = `watch_${process.pid}_${Date.now()}_${Math.random().toString(36).slice(2, 6)}`;
  await db.sql`create role ${db.sql(role)} login password 'watch'`;
  const u = new URL(db.url);
  u.username = role;
  u.password = "watch";
  const unsure = createDatabase(u.toString(), { max: 1 });
  return {
    sql: unsure.sql,
    mend: async () => {
      await db.sql`grant select on api_tokens, users to ${db.sql(role)}`;
    },
    close: async () => {
      await unsure.close();
      await db.sql`drop owned by ${db.sql(role)}`;
      await db.sql`drop role ${db.sql(role)}`;
    },
  };
}

test("a check that fails after a notification for every token is made again, not taken for a revoke", async () => {
  const created = await tokenCreate(db.sql, "Þóra «watch»");
  const unsure = await unsureDatabase();
  const ends: TokenEnd[] = [];
  let failures = 0;
  const stop = watchToken(
    unsure.sql,
    cache,
    { tokenId: created.tokenId, role: "user" },
    (why) => ends.push(why),
    { recheckMs: 50, onCheckFailed: () => failures++ },
  );
  try {
    // Revoked with its notification lost: only a check can find it.
    await db.sql`update api_tokens set revoked_at = now() where id = ${created.tokenId}`;
    await db.sql`select pg_notify(${TOKENS_CHANNEL}, '*')`;
    await waitFor(async () => failures >= 3, 10_000, "three failed checks");
    assert.deepEqual(ends, [], "a failed check cut it off");
    await unsure.mend();
    await waitFor(async () => ends.length > 0, 10_000, "a check that answers");
    assert.deepEqual(ends, ["revoked"]);
    assert.equal(cache.revokeListenerCount, 0);
  } finally {
    stop();
    await unsure.close();
  }
});

test("a check that fails for many downloads at once is reported once a round, not once per download", async () => {
  const created = await tokenCreate(db.sql, "Þóra «watch»");
  const unsure = await unsureDatabase();
  const reported: unknown[] = [];
  const stops = Array.from({ length: 25 }, () =>
    watchToken(unsure.sql, cache, { tokenId: created.tokenId, role: "user" }, () => {}, {
      recheckMs: 50,
      onCheckFailed: (err) => reported.push(err),
    }),
  );
  try {
    await db.sql`select pg_notify(${TOKENS_CHANNEL}, '*')`;
    await waitFor(async () => reported.length >= 3, 10_000, "three failed rounds");
    assert.equal(new Set(reported).size, reported.length, "each failed check reported once");
  } finally {
    for (const stop of stops) stop();
    await unsure.close();
  }
});

test("what started before the token cache first listened is told to check again when it does", async () => {
  // A LISTEN that failed at start-up comes up later: a revoke meanwhile was announced to nobody.
  const late = new TokenCache();
  const heard: string[] = [];
  const unsubscribe = late.onRevoke((tokenId) => heard.push(tokenId));
  try {
    await late.start(db.sql, createLogger({ level: "silent" }));
    await waitFor(async () => heard.length > 0, 5_000, "a check of every token");
    assert.deepEqual(heard, ["*"]);
  } finally {
    unsubscribe();
    await late.stop();
  }
});
