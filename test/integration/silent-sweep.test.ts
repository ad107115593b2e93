// The worker's sweep of silent pool connections (src/db/silent.ts): connections that stop answering
// without closing — a failover that left the old primary's connections open — are closed once the
// database says it is not working on them, so the worker's claims go to new connections instead of
// waiting until TCP gives up. The worker reaches the real PostgreSQL through a relay this file strands.
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";
import { createDatabase, type Database } from "../../src/db/client.ts";
import { pacerOf, SilentSweep } from "../../src/db/silent.ts";
import { createLogger } from "../../src/log.ts";
import { Worker } from "../../src/queue/worker.ts";
import { within } from "../helpers/client.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { type DbRelay, relayTo, throughRelay } from "../helpers/db-relay.ts";
import { createTask, deferred, seedUser, waitFor, waitForTerminal } from "../helpers/queue.ts";

let db: TestDatabase;
const closers: (() => Promise<void> | void)[] = [];
const logger = createLogger({ level: "silent" });

before(async () => {
  db = await createTestDatabase();
});

after(async () => {
  for (const close of closers.reverse()) await close();
  await db.drop();
});

async function poolThroughRelay(max: number): Promise<{ relay: DbRelay; database: Database }> {
  const relay = await relayTo(db.url, "forward");
  const database = createDatabase(throughRelay(db.url, relay), { max });
  closers.push(
    () => relay.close(),
    () => database.close(),
  );
  return { relay, database };
}

/** `work`, or a failure naming `what` when it takes over 10 s (a hang says where it is). */
const bounded = <T>(work: Promise<T>, what: string): Promise<T> => within(work, 10_000, what);

const sweepOf = (database: Database) =>
  new SilentSweep({ database, logger, intervalMs: 100, silentAfterMs: 300, lookupMs: 1_000, stuckMs: 800 });

test("a worker whose pool connections go silent claims on new ones: a task created then runs within seconds", async () => {
  const { relay, database } = await poolThroughRelay(2);
  const owner = await seedUser(db.sql, "silent-worker");
  const worker = new Worker({
    sql: database.sql,
    logger,
    types: { "silent-noop": { handler: async () => ({ status: "succeeded" }) } },
    concurrency: 1,
    leaseTtlMs: 60_000,
    // Its LISTEN connection is stranded too: the poll is what claims.
    pollIntervalMs: 200,
    retryBaseMs: 10,
  });
  await bounded(worker.start(), "the worker's start");
  closers.push(() => worker.stop(0));
  const warm = await createTask(db.sql, owner, "silent-noop", 2);
  assert.equal((await waitForTerminal(db.sql, warm, 20_000)).status, "succeeded");

  // The worker's tidy of the owner's queue row (a transaction) done first: stranded inside it, its
  // connection is closed only after the stuck bound, and the create below would wait on the row.
  await waitFor(
    async () => {
      const [r] = await db.sql<{ n: number }[]>`
        select count(*)::int as n from queue_owners where owner_id = ${owner.userId}`;
      return r?.n === 0;
    },
    10_000,
    "the worker's tidy of the drained queue",
  );
  relay.strand();
  // The sweep's passes run from now on, as the service's would: a statement of the worker's may have
  // been stranded inside a transaction (its backend idle in transaction, holding its locks), and the
  // create below waits for those locks until the sweep closes that connection.
  const sweep = sweepOf(database);
  let sweeping = true;
  let closed = 0;
  const passes = (async () => {
    while (sweeping) {
      closed += await bounded(sweep.runOnce(), "a sweep pass");
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  try {
    const taskId = await bounded(createTask(db.sql, owner, "silent-noop", 3), "the create");
    const row = await waitFor(
      async () => {
        const [t] = await db.sql<{ status: string }[]>`select status from tasks where id = ${taskId}`;
        return t?.status === "succeeded" ? t : undefined;
      },
      20_000,
      "the task to succeed on new connections",
    );
    assert.equal(row.status, "succeeded");
  } finally {
    sweeping = false;
    await passes;
  }
  assert.ok(closed >= 1, `${closed} connections closed`);
  // Its LISTEN connection is still stranded: the stop's UNLISTEN goes unanswered, and is not waited
  // for beyond UNLISTEN_WAIT_MS (it waited for good).
  let timer: NodeJS.Timeout | undefined;
  const stopped = await Promise.race([
    worker.stop(0).then(() => true),
    new Promise<false>((resolve) => {
      timer = setTimeout(resolve, 10_000, false);
    }),
  ]);
  clearTimeout(timer);
  assert.equal(stopped, true, "the worker stopped within 10 s");
});

test("a connection stranded inside a transaction is closed: the transaction fails, the process lives, the pool serves", async () => {
  // Safe since bin/patch-deps.js: unpatched, postgres.js ended the process here (porsager/postgres#1208).
  const { relay, database } = await poolThroughRelay(1);
  let pid = 0;
  const entered = deferred();
  const carryOn = deferred();
  const tx = database.sql.begin(async (t) => {
    const [row] = await t<{ pid: number }[]>`select pg_backend_pid() as pid`;
    pid = row?.pid ?? 0;
    entered.resolve();
    await carryOn.promise;
    await t`select 2`; // never arrives: its backend stays idle in transaction
  });
  const outcome = tx.then(
    () => "committed",
    (err: { code?: string }) => err.code ?? String(err),
  );
  await bounded(entered.promise, "the transaction's first statement");
  relay.strand();
  carryOn.resolve();
  const sweep = sweepOf(database);
  let closed = 0;
  await waitFor(
    async () => {
      closed += await bounded(sweep.runOnce(), "a sweep pass");
      return closed > 0;
    },
    10_000,
    "the sweep to close the transaction's connection",
  );
  try {
    assert.equal(closed, 1);
    assert.equal(await bounded(outcome, "the transaction"), "CONNECTION_CLOSED");
    // Its backend (idle in transaction, holding what it locked; the relay keeps its side open, as a
    // cut path does) was ended by the sweep.
    await waitFor(
      async () => {
        const [left] = await db.sql<{ n: number }[]>`
          select count(*)::int as n from pg_stat_activity where pid = ${pid}`;
        return left?.n === 0;
      },
      5_000,
      "the stranded transaction's backend to end",
    );
    const [row] = await bounded(
      database.sql<{ pid: number }[]>`select pg_backend_pid() as pid`,
      "the next statement",
    );
    assert.ok(row && row.pid !== pid, "served on a new connection");
  } finally {
    await db.sql`select pg_terminate_backend(${pid})`;
  }
});

test("a look-up the database does not answer closes nothing; the next one that is answered does", async () => {
  const { relay, database } = await poolThroughRelay(1);
  await database.sql`select 1`;
  relay.strand();
  let failed: string | undefined;
  const waiting = database.sql`select 1`.then(
    () => "answered",
    (err: { code?: string }) => {
      failed = err.code;
      return failed;
    },
  );
  const sweep = sweepOf(database);
  // New connections held unanswered: the look-up's own among them.
  relay.mode = "hold";
  await waitFor(
    async () => (pacerOf(database)?.silent?.(900).length ?? 0) === 1,
    10_000,
    "the connection to be silent past the stuck bound",
  );
  assert.equal(await sweep.runOnce(), 0);
  assert.equal(failed, undefined);
  relay.mode = "forward";
  assert.equal(await sweep.runOnce(), 1);
  assert.equal(await waiting, "CONNECTION_CLOSED");
  assert.equal((await database.sql<{ n: number }[]>`select 1 as n`)[0]?.n, 1);
});

test("a connection found at work and lost later without a byte is looked up again after the recheck, and closed", async () => {
  const { relay, database } = await poolThroughRelay(1);
  await database.sql`select 1`;
  let failed: string | undefined;
  const long = database.sql`select pg_sleep(60)`.then(
    () => "answered",
    (err: { code?: string }) => {
      failed = err.code;
      return failed;
    },
  );
  const sweep = new SilentSweep({
    database,
    logger,
    silentAfterMs: 300,
    lookupMs: 1_000,
    stuckMs: 800,
    recheckMs: 1_000,
  });
  // Found at work: nothing closed.
  await waitFor(
    async () => (pacerOf(database)?.silent?.(300).length ?? 0) === 1,
    10_000,
    "the statement to be silent",
  );
  assert.equal(await sweep.runOnce(), 0);
  // Its backend ended, and not a byte from it: a connection cut where nobody says so.
  const [backend] = pacerOf(database)?.silent?.(300) ?? [];
  assert.ok(backend, "the statement's connection");
  relay.strand();
  await db.sql`select pg_terminate_backend(${backend.pid})`;
  let closed = 0;
  await waitFor(
    async () => {
      closed += await sweep.runOnce();
      return failed !== undefined;
    },
    10_000,
    "the lost connection to be closed",
  );
  assert.equal(closed, 1);
  assert.equal(await long, "CONNECTION_CLOSED");
});

/**
 * A TCP proxy to the server of `url` that dials it `delayMs` after its first client connects (a proxy
 * that dials on accept, a SYN retransmitted, a slow DNS answer), and at once for the others.
 */
async function slowFirstDial(url: string, delayMs: number): Promise<string> {
  const u = new URL(url);
  const sockets = new Set<net.Socket>();
  let accepted = 0;
  const server = net.createServer((client) => {
    const delay = accepted++ === 0 ? delayMs : 0;
    sockets.add(client);
    client.on("error", () => {});
    client.pause();
    setTimeout(() => {
      const upstream = net.connect(Number(u.port), u.hostname);
      sockets.add(upstream);
      upstream.on("error", () => {});
      client.on("close", () => upstream.destroy());
      upstream.on("close", () => client.destroy());
      client.pipe(upstream);
      upstream.pipe(client);
      client.resume();
    }, delay);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  closers.push(
    () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  );
  const proxied = new URL(url);
  proxied.hostname = "127.0.0.1";
  proxied.port = String((server.address() as net.AddressInfo).port);
  return proxied.toString();
}

test("a statement at work on a connection whose dial took 1.5 s is left alone: its backend is younger than the connect, not than its start-up", async () => {
  const database = createDatabase(await slowFirstDial(db.url, 1_500), { max: 1 });
  closers.push(() => database.close());
  await database.sql`select 1`;
  const long = database.sql`select pg_sleep(2)`.then(
    () => "answered",
    (err: { code?: string }) => err.code,
  );
  const sweep = new SilentSweep({ database, logger, silentAfterMs: 300, lookupMs: 3_000, stuckMs: 800 });
  await waitFor(
    async () => (pacerOf(database)?.silent?.(300).length ?? 0) === 1,
    10_000,
    "the statement to be silent",
  );
  assert.equal(await sweep.runOnce(), 0);
  assert.equal(await long, "answered");
});
