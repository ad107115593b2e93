// A database whose connections are closed before it says a word (a proxy or port forward with nothing
// behind it): postgres.js (3.4.9) makes such a connection again at once, without its backoff, while a
// query waits — over a thousand connections a second from one process, for as long as it lasted. The
// pool's connections are paced after such closes (pacedSocket, src/db/client.ts), and come back when
// the database does.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { createDatabase, endPool } from "../../src/db/client.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { type DbRelay, relayTo, throughRelay } from "../helpers/db-relay.ts";
import { waitFor } from "../helpers/queue.ts";

let db: TestDatabase;
const closers: (() => Promise<void> | void)[] = [];

before(async () => {
  db = await createTestDatabase();
});

after(async () => {
  for (const close of closers.reverse()) await close();
  await db.drop();
});

async function relay(options: { tls?: boolean } = {}): Promise<DbRelay> {
  const r = await relayTo(db.url, "close", options);
  closers.push(() => r.close());
  return r;
}

test("connections closed before a word are made again paced, and the waiting queries run when the database is back", async () => {
  const r = await relay();
  const database = createDatabase(throughRelay(db.url, r), { max: 3 });
  closers.push(() => database.close());
  // Three queries wait, one per connection of the pool.
  const waiting = [1, 2, 3].map((n) => database.sql<{ n: number }[]>`select ${n}::int as n`);
  for (const q of waiting) q.catch(() => {});
  const started = performance.now();
  // The first ten connections: without pacing they come within ~10 ms; paced, the pauses after the
  // first closes (25, 50, 100 … ms, each at least half that, across the pool) add up to well over 0.5 s.
  await waitFor(async () => r.accepted >= 10, 20_000);
  const ms = performance.now() - started;
  assert.ok(ms > 500, `10 connections in ${Math.round(ms)} ms`);
  // Back: the waiting queries run on connections made within the longest pause (2 s).
  r.set("forward");
  const back = performance.now();
  assert.deepEqual(
    (await Promise.all(waiting)).map((rows) => rows[0]?.n),
    [1, 2, 3],
  );
  assert.ok(performance.now() - back < 5_000, "the queries ran within 5 s of the database coming back");
});

test("a connection that answers ends the pause: silent closes later start pacing from the first pause", async () => {
  const r = await relay();
  const database = createDatabase(throughRelay(db.url, r), { max: 1 });
  closers.push(() => database.close());
  // Seven silent closes in a row: the next pause would be at least 0.8 s.
  const first = database.sql<{ n: number }[]>`select 1::int as n`;
  first.catch(() => {});
  await waitFor(async () => r.accepted >= 7, 20_000);
  r.set("forward");
  assert.equal((await first)[0]?.n, 1);
  // The connection answered: the next silent closes are paced from 25 ms again, so three connections
  // come within a few tens of milliseconds (still paced, they would take over 1.8 s).
  r.set("close");
  const accepted = r.accepted;
  const started = performance.now();
  // A query sent before the pool noticed the cut fails (CONNECTION_CLOSED): it is asked again, and
  // waits for a connection from then on.
  const ask = (): Promise<{ n: number }[]> =>
    database.sql<{ n: number }[]>`select 2::int as n`.catch((err: { code?: string }) => {
      if (err.code !== "CONNECTION_CLOSED") throw err;
      return ask();
    });
  const second = ask();
  second.catch(() => {});
  await waitFor(async () => r.accepted >= accepted + 3, 20_000);
  const ms = performance.now() - started;
  assert.ok(ms < 700, `three connections in ${Math.round(ms)} ms`);
  r.set("forward");
  assert.equal((await second)[0]?.n, 2);
});

test("over TLS too: once a connection answers, new connections are made without a pause", async () => {
  // postgres.js drops every listener of the plain socket when it wraps it in TLS: a listener that was
  // to end the pause never heard of the answer, and every later connection waited 1–2 s.
  const r = await relay({ tls: true });
  const database = createDatabase(`${throughRelay(db.url, r)}?sslmode=require`, { max: 1 });
  closers.push(() => database.close());
  const first = database.sql<{ ssl: boolean }[]>`select ssl from pg_stat_ssl where pid = pg_backend_pid()`;
  first.catch(() => {});
  await waitFor(async () => r.accepted >= 8, 20_000);
  r.set("forward");
  // Through the relay the server's side is plain; TLS ended at the relay.
  assert.equal((await first).length, 1);
  for (let i = 0; i < 3; i++) {
    // A restart cuts the connection; the next query makes a new one.
    r.set("forward");
    const started = performance.now();
    const ask = (): Promise<unknown> =>
      database.sql`select 1`.catch((err: { code?: string }) => {
        if (err.code !== "CONNECTION_CLOSED") throw err;
        return ask();
      });
    await ask();
    const ms = performance.now() - started;
    assert.ok(ms < 500, `a new TLS connection took ${Math.round(ms)} ms`);
  }
});

test("a pool ended during a pause makes no connection afterwards", async () => {
  const r = await relay();
  const database = createDatabase(throughRelay(db.url, r), { max: 1 });
  const q = database.sql`select 1`;
  q.catch(() => {});
  // Nine silent closes: the pause in progress is 1–2 s.
  await waitFor(async () => r.accepted >= 9, 20_000);
  await endPool(database.sql, 0);
  r.set("forward");
  const accepted = r.accepted;
  await assert.rejects(q);
  // The longest pause, and some: a connection made by a pause that outlived the pool would be here by
  // then. (A fixed wait: what is asserted is that nothing happens.)
  await new Promise((resolve) => setTimeout(resolve, 2_500));
  assert.equal(r.accepted, accepted, "no connection after the end");
});

test("an address the network cannot reach: the query fails with the system's error, the process goes on", async () => {
  // net.connect reports ENETUNREACH at once, emitted on the next tick: from a factory called in
  // postgres.js's timer, before postgres.js listened, it was an unhandled 'error' that ended the process.
  const database = createDatabase("postgres://assay:x@255.255.255.255:5432/assay", { max: 1 });
  closers.push(() => database.close());
  await assert.rejects(database.sql`select 1`, (err: { code?: string }) => {
    assert.match(String(err.code), /^E[A-Z]+$/);
    return true;
  });
});
