// Tokens that expire (`token create --expires-in`): refused from their expiry on, as an unknown token is,
// however recently the API cached them and with no notification; their view and download links stop
// working with them, and the live event streams they opened end.
import assert from "node:assert/strict";
import type net from "node:net";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { TokenCache } from "../../src/auth/token-cache.ts";
import { hashToken, tokenAuthenticate, tokenCreate } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { bearer } from "../helpers/app.ts";
import { createTask, waitFor, waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";
import { openSse } from "../helpers/sse.ts";

let env: RunnerEnv;
let app: FastifyInstance;
let base: string;
const USER = "Œdipe «exp» 李";
let done: string;
let runId: string;

/** Resolves once the database's clock has passed `iso`. */
async function until(iso: string | null): Promise<void> {
  assert.ok(iso, "the token has an expiry");
  await waitFor(
    async () => (await env.db.sql`select now() > ${iso}::timestamptz as past`)[0]?.past === true,
    30_000,
    `the database's clock to pass ${iso}`,
  );
}

before(async () => {
  env = await runnerEnv();
  app = await env.app();
  // Ids past a digit boundary.
  await env.db.sql`select setval('api_tokens_id_seq', 999999)`;
  const w = env.worker([fixtureProgram("exp-ok")]);
  await w.start();
  done = await env.task("exp-ok", [await env.file("a,b\n1,2\n")], { mode: "ok" });
  await waitForTerminal(env.db.sql, done);
  await w.stop();
  const owner = await tokenCreate(env.db.sql, USER);
  await env.db.sql`update tasks set owner_id = ${owner.userId}`;
  await env.db.sql`update files set owner_id = ${owner.userId}`;
  const [run] = await env.db.sql<{ id: string }[]>`select id::text from runs where task_id = ${done}`;
  runId = run?.id as string;
  await app.listen({ port: 0, host: "127.0.0.1" });
  base = `http://127.0.0.1:${(app.server.address() as net.AddressInfo).port}`;
  await waitFor(async () => (await app.inject({ url: "/readyz" })).statusCode === 200, 10_000, "ready");
});
after(() => env.close());

test("an expired token gets the 401 an unknown one gets, at once, though the API cached it and nothing was notified", {
  timeout: 60_000,
}, async () => {
  const tokens = app.services.tokens as TokenCache;
  const created = await tokenCreate(env.db.sql, USER, undefined, 2);
  assert.ok(created.tokenId >= 1_000_000);
  assert.equal((await app.inject({ url: "/api/me", headers: bearer(created.token) })).statusCode, 200);
  const generation = tokens.begin();
  assert.ok(tokens.get(hashToken(created.token)), "the token is cached");
  await until(created.expiresAt);
  const refused = await app.inject({ url: "/api/me", headers: bearer(created.token) });
  const unknown = await app.inject({ url: "/api/me", headers: bearer(`assay_${"x".repeat(43)}`) });
  assert.equal(tokens.begin(), generation, "no notification emptied the cache");
  assert.equal(refused.statusCode, 401);
  assert.deepEqual(refused.json(), unknown.json());
  assert.equal(refused.headers["www-authenticate"], unknown.headers["www-authenticate"]);

  // Its expiry moved into the past in the database: refused by the database's check too.
  const later = await tokenCreate(env.db.sql, USER, undefined, 3600);
  await env.db
    .sql`update api_tokens set expires_at = now() - interval '1 second' where id = ${later.tokenId}`;
  assert.equal(await tokenAuthenticate(env.db.sql, later.token), undefined);
  // A token made without an expiry has none.
  const forever = await tokenCreate(env.db.sql, USER);
  assert.equal(forever.expiresAt, null);
  assert.equal((await tokenAuthenticate(env.db.sql, forever.token))?.deadline, undefined);
});

test("the token cache never keeps an entry past its token's expiry, whatever its own TTL", {
  timeout: 30_000,
}, async () => {
  const cache = new TokenCache(600_000);
  await cache.start(env.db.sql, createLogger({ level: "silent" }));
  try {
    const created = await tokenCreate(env.db.sql, USER, undefined, 1);
    const hash = hashToken(created.token);
    const principal = await tokenAuthenticate(env.db.sql, created.token, cache);
    assert.ok(principal?.deadline !== undefined && cache.get(hash));
    // Kept until the token's deadline, not the cache's: no query, no notification.
    assert.ok(cache.get(hash, principal.deadline - 1));
    assert.equal(cache.get(hash, principal.deadline), undefined);
    // A deadline already past is not cached at all.
    cache.set(hash, { ...principal, deadline: performance.now() - 1 }, cache.begin());
    assert.equal(cache.get(hash), undefined);
  } finally {
    await cache.stop();
  }
});

test("view and download links stop working when the token that made them expires, and expire with it", {
  timeout: 60_000,
}, async () => {
  const created = await tokenCreate(env.db.sql, USER, undefined, 120);
  const make = async (url: string) => {
    const res = await app.inject({ method: "POST", url, headers: bearer(created.token) });
    assert.equal(res.statusCode, 200, res.body);
    return res.json().data as { url: string; expiresAt: string };
  };
  const links = [
    await make(`/api/analysis-tasks/${done}/runs/${runId}/outputs/out.json/link`),
    await make(`/api/analysis-tasks/${done}/download/link`),
    await make(`/api/analysis-tasks/${done}/results.csv/link`),
  ];
  for (const link of links) {
    // Never later than the token's own expiry (a view link is made for ten minutes, a download link five).
    assert.ok(Date.parse(link.expiresAt) <= Date.parse(created.expiresAt as string), link.expiresAt);
    assert.equal((await app.inject({ url: link.url })).statusCode, 200, link.url);
  }
  await env.db
    .sql`update api_tokens set expires_at = now() - interval '1 second' where id = ${created.tokenId}`;
  for (const link of links) {
    const res = await app.inject({ url: link.url });
    assert.equal(res.statusCode, 404, link.url);
    assert.equal(res.json().code, "OUTPUT_NOT_FOUND");
  }
});

test("a live event stream opened with an expiring token ends at its expiry; the reconnect is refused", {
  timeout: 60_000,
}, async () => {
  const owner = await tokenCreate(env.db.sql, USER);
  // A type no worker takes: the task stays open, its stream live.
  const open = await createTask(
    env.db.sql,
    { userId: owner.userId, name: USER, role: "user" },
    "exp-never",
    1,
  );
  const created = await tokenCreate(env.db.sql, USER, undefined, 3);
  const url = `${base}/api/analysis-tasks/${open}/events`;
  const stream = await openSse(url, created.token);
  const kept = await openSse(url, owner.token);
  try {
    assert.equal(stream.status, 200);
    await stream.waitFor((events) => events.length >= 1, 10_000);
    const ended = await Promise.race([
      stream.ended.then(() => true),
      new Promise<boolean>((r) => setTimeout(() => r(false), 15_000).unref()),
    ]);
    assert.equal(ended, true, "the stream ended");
    const [past] = await env.db
      .sql`select now() >= ${created.expiresAt}::timestamptz - interval '1 second' as past`;
    assert.equal(past?.past, true, "not before the expiry");
    const again = await openSse(url, created.token);
    assert.equal(again.status, 401);
    // A token without an expiry keeps its stream.
    const stillOpen = await Promise.race([
      kept.ended.then(() => false),
      new Promise<boolean>((r) => setImmediate(() => r(true))),
    ]);
    assert.equal(stillOpen, true);
  } finally {
    stream.close();
    kept.close();
  }
});
