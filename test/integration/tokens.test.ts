import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { TokenCache } from "../../src/auth/token-cache.ts";
import { hashToken, tokenAuthenticate, tokenCreate, tokenList, tokenRevoke } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { waitFor } from "../helpers/queue.ts";

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.drop());

test("tokens are random, URL-safe, ≥ 32 bytes, and stored only as their SHA-256", async () => {
  const a = await tokenCreate(db.sql, "dora");
  const b = await tokenCreate(db.sql, "dora");
  assert.notEqual(a.token, b.token);
  assert.match(a.token, /^assay_[A-Za-z0-9_-]{43}$/);
  assert.ok(Buffer.from(a.token.slice(6), "base64url").length >= 32);
  const rows = await db.sql`select token_hash from api_tokens`;
  const stored = JSON.stringify(rows);
  assert.ok(!stored.includes(a.token) && !stored.includes(a.token.slice(6)));
  assert.ok(rows.some((r) => r.token_hash === hashToken(a.token)));
  assert.equal(a.userId, b.userId, "the user is created once");
});

test("role defaults to user, --role sets it, and a later create without --role keeps it", async () => {
  assert.equal((await tokenCreate(db.sql, "erin")).role, "user");
  assert.equal((await tokenCreate(db.sql, "erin", "admin")).role, "admin");
  const again = await tokenCreate(db.sql, "erin");
  assert.equal(again.role, "admin");
  assert.deepEqual(await tokenAuthenticate(db.sql, again.token), {
    userId: again.userId,
    name: "erin",
    role: "admin",
    tokenId: again.tokenId,
  });
});

test("authenticate: unknown and revoked tokens are refused; list shows no secrets", async () => {
  const created = await tokenCreate(db.sql, "finn");
  assert.equal(await tokenAuthenticate(db.sql, `${created.token.slice(0, -1)}x`), undefined);
  assert.equal(await tokenAuthenticate(db.sql, "short"), undefined);
  assert.equal(await tokenRevoke(db.sql, created.tokenId), true);
  assert.equal(await tokenRevoke(db.sql, created.tokenId), false, "revoking twice reports no live token");
  assert.equal(await tokenAuthenticate(db.sql, created.token), undefined);
  const list = await tokenList(db.sql);
  const entry = list.find((t) => t.id === created.tokenId);
  assert.ok(entry?.revokedAt);
  assert.equal(entry?.user, "finn");
  assert.ok(!JSON.stringify(list).includes(created.token));
});

test("a revoke that lands while a lookup is in flight is not undone by the lookup's answer being cached", async () => {
  const cache = new TokenCache();
  await cache.start(db.sql, createLogger({ level: "silent" }));
  try {
    const created = await tokenCreate(db.sql, "gale");
    const hash = hashToken(created.token);
    // The lookup reads the token while it is still valid; before its answer comes back, the token is
    // revoked and the revoke's notification has emptied the cache.
    const racing = new Proxy(db.sql, {
      apply(target, self, args: unknown[]) {
        const [strings] = args as [TemplateStringsArray];
        const result = Reflect.apply(target, self, args);
        if (!strings.join("?").includes("from api_tokens t join users u")) return result;
        return (async () => {
          const ticket = cache.begin();
          const rows = await result;
          assert.equal(await tokenRevoke(db.sql, created.tokenId), true);
          await waitFor(async () => cache.begin() !== ticket, 5_000, "the revoke's notification");
          return rows;
        })();
      },
    });
    const answer = await tokenAuthenticate(racing, created.token, cache);
    assert.equal(answer?.tokenId, created.tokenId, "the lookup itself read the token before the revoke");
    assert.equal(cache.get(hash), undefined, "the answer read before the revoke is not cached");
    assert.equal(await tokenAuthenticate(db.sql, created.token, cache), undefined);
  } finally {
    await cache.stop();
  }
});
