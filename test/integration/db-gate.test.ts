// The database gate (src/db/gate.ts): while the database does not answer, API requests are answered
// 503 at once instead of waiting in the pool for as long as the outage lasts. The API reaches the real
// PostgreSQL through a TCP relay this file controls: it closes every connection it accepts (a proxy
// with nothing behind it, where postgres.js waits for ever), resets them, answers them with FATAL
// 53300 (too many connections: the database answering), or passes them through.
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { after, before, test } from "node:test";
import v8 from "node:v8";
import vm from "node:vm";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { loadConfig } from "../../src/config.ts";
import { createDatabase, type Database, type PacedSocket, pacedSocket } from "../../src/db/client.ts";
import { expectedMigrationCount } from "../../src/db/migrate.ts";
import { SILENT_DROPPED } from "../../src/db/silent.ts";
import { buildServer } from "../../src/http/server.ts";
import { createLogger } from "../../src/log.ts";
import { LocalStore } from "../../src/storage/local.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { type DbRelay, keyFakingProxy, relayTo, throughRelay } from "../helpers/db-relay.ts";
import { waitFor } from "../helpers/queue.ts";

const GATE = {
  suspectMs: 300,
  probeAnswerMs: 400,
  probeEveryMs: 100,
  pingEveryMs: 300,
  silentStuckMs: 1_000,
};
let db: TestDatabase;
let dataDir: string;
let token: string;
const closers: (() => Promise<void> | void)[] = [];

before(async () => {
  db = await createTestDatabase();
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-gate-"));
  token = (await tokenCreate(db.sql, "gate-user")).token;
});

after(async () => {
  for (const close of closers.reverse()) await close();
  await db.drop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

interface Api {
  app: FastifyInstance;
  relay: DbRelay;
  database: Database;
  /** The app's log lines, parsed. */
  logs: { level: number; msg: string }[];
}

/** An API on a pool of its own through a new relay (forwarding), the gate's timings shortened. */
async function apiThroughRelay(
  gate: typeof GATE = GATE,
  o: { tls?: boolean; max?: number; target?: string } = {},
): Promise<Api> {
  const relay = await relayTo(o.target ?? db.url, "forward", o);
  const url = `${throughRelay(db.url, relay)}${o.tls ? "?sslmode=require" : ""}`;
  const database = createDatabase(url, { max: o.max ?? 3 });
  const config = loadConfig({ ASSAY_DATA_DIR: dataDir, DATABASE_URL: url });
  const logs: Api["logs"] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split("\n")) if (line) logs.push(JSON.parse(line));
      done();
    },
  });
  const app = await buildServer(
    {
      config,
      database,
      storage: new LocalStore(dataDir),
      expectedMigrations: expectedMigrationCount(),
      databaseGate: gate,
    },
    createLogger({ level: "info", destination }),
  );
  closers.push(
    () => relay.close(),
    () => database.close(),
    async () => {
      relay.set("forward");
      await app.close();
    },
  );
  return { app, relay, database, logs };
}

const logged = (logs: Api["logs"], level: number, msg: string) =>
  logs.filter((l) => l.level === level && l.msg === msg).length;

const list = (app: FastifyInstance) =>
  app.inject({ url: "/api/analysis-tasks", headers: { authorization: `Bearer ${token}` } });

/** Resolves with `work`'s value, or rejects when it takes longer than `ms`. */
function within<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    work,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what} took over ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

const REFUSED = { code: "NOT_READY", message: "The database is not answering; try again shortly." };

async function outage(mode: "close" | "refuse" | "hold" | "too-many") {
  // Before the pool has made a connection (one cut under a query would fail that query).
  const { app, relay, logs } = await apiThroughRelay();
  relay.set(mode);
  // A request while the pool has no connection it can make: with `close` it waits (postgres.js makes
  // the connection again and again), with `hold` too (until its connect timeout), with `refuse` and
  // `too-many` it fails — and every other query waits while the pool makes its next connection.
  const early = list(app);
  await waitFor(async () => app.databaseGate.refuses(), 10_000, "the gate to close");

  // Two hundred requests now: each answered 503 at once, none left waiting in the pool; and the
  // links outside /api, which ask the database before anything else.
  const failedBefore = logged(logs, 50, "request failed");
  const started = performance.now();
  const answers = await within(
    Promise.all([
      ...Array.from({ length: 200 }, () => list(app)),
      app.inject({ url: "/view/1.1.1.9999999999.AAAA/x.csv" }),
      app.inject({ url: "/view/download/1.task.1.9999999999.AAAA/x.zip" }),
    ]),
    3_000,
    "200 requests while the database does not answer",
  );
  const ms = performance.now() - started;
  for (const res of answers) {
    assert.equal(res.statusCode, 503);
    assert.deepEqual(res.json(), REFUSED);
    assert.equal(res.headers["retry-after"], "2");
  }
  assert.ok(ms < 3_000, `${Math.round(ms)} ms`);
  // The outage is logged once, not as a failure of each request.
  assert.equal(
    logged(logs, 40, "the database does not answer: API requests are answered 503 until it does"),
    1,
  );
  assert.equal(logged(logs, 50, "request failed"), failedBefore);

  // The database back: the waiting request is served, and so is every request once a probe answers.
  relay.set("forward");
  const first = await within(early, 10_000, "the request made before the gate closed");
  // (A reset may come as a close: the request then waited too.)
  if (mode === "close" || mode === "hold") assert.equal(first.statusCode, 200);
  // Refused by PostgreSQL at the connection's start (a FATAL): its connection failed, so 503 as the
  // gate's (until 2026-12-07 a 500 INTERNAL_ERROR).
  if (mode === "too-many") assert.equal(first.statusCode, 503);
  await waitFor(async () => !app.databaseGate.refuses(), 10_000, "the gate to open again");
  assert.equal((await list(app)).statusCode, 200);
  assert.equal(logged(logs, 30, "the database answers again: API requests are served"), 1);
}

test("a database whose connections are closed unanswered: requests are 503 at once once a probe says so, not held; served again when it answers", async () => {
  await outage("close");
});

test("a database whose connections are reset: the same, 503 at once and served again", async () => {
  await outage("refuse");
});

test("a database whose connections are accepted and never answered: the same", async () => {
  await outage("hold");
});

test("a database that refuses new connections with FATAL 53300 (too many connections): the same — the other queries would wait", async () => {
  await outage("too-many");
});

test("requests whose queries fail on their connections (nothing listens; the pool's cut) before the gate has closed are 503, not 500, and the gate probes at once", async () => {
  // The gate's own timing would not probe for a minute: only the failed requests can make it.
  const { app, relay, logs } = await apiThroughRelay({ ...GATE, suspectMs: 60_000, pingEveryMs: 60_000 });
  assert.equal((await list(app)).statusCode, 200);
  // PostgreSQL gone (stopped at once, its host still up): the pool's connections are cut and new ones
  // are refused (ECONNREFUSED), as a trial saw with `pg_ctl stop -m immediate`.
  await relay.close();
  const answers = await within(
    Promise.all(Array.from({ length: 5 }, () => list(app))),
    10_000,
    "requests as the database goes",
  );
  for (const res of answers) {
    assert.equal(res.statusCode, 503, res.body);
    assert.deepEqual(res.json(), REFUSED);
    assert.equal(res.headers["retry-after"], "2");
  }
  assert.equal(logged(logs, 50, "request failed"), 0, "none logged as a failure of its own");
  await waitFor(async () => app.databaseGate.refuses(), 5_000, "the gate to close");
  // Requests still failing on their connections once it is closed start no probe of their own: a
  // closed gate probes on its timer, and each probe started beside it would have started another
  // chain of probes for the rest of the outage (found by the review: 105 probes in 5 s for 20).
  let started = 0;
  for (let i = 0; i < 30; i++) {
    const before = app.databaseGate.probes;
    app.databaseGate.suspect();
    started += app.databaseGate.probes - before;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  assert.equal(started, 0, "probes started by suspect() on a closed gate");
});

test("a database that answers: its connections' start-ups confirm them, so no probe is made and no request refused", async () => {
  const { app, database } = await apiThroughRelay();
  const before = app.databaseGate.probes;
  await Promise.all(Array.from({ length: 3 }, () => database.sql`select pg_sleep(0.05)`));
  assert.equal((await list(app)).statusCode, 200);
  // Every connection the pool asked for is over suspectMs old now, each confirmed by the
  // ReadyForQuery that ended its start-up.
  await new Promise((r) => setTimeout(r, GATE.suspectMs + 50));
  for (let i = 0; i < 20; i++) assert.equal((await list(app)).statusCode, 200);
  await app.databaseGate.settled();
  assert.equal(app.databaseGate.refuses(), false);
  assert.equal(app.databaseGate.probes, before, "no probe");
  // A probe all the same (runOnce) is answered.
  await app.databaseGate.runOnce();
  assert.equal(app.databaseGate.refuses(), false);
});

test("a probe while new connections are slow to open (a pooler queueing them) and a pool's connection serves: answered by the pool", async () => {
  const { app, relay, database } = await apiThroughRelay();
  assert.equal((await list(app)).statusCode, 200);
  // New connections now take 1.5 s to reach the database, past the probe's own 400 ms (the open one
  // is left be).
  relay.slowMs = 1_500;
  relay.mode = "slow";
  await app.databaseGate.runOnce();
  assert.equal(app.databaseGate.refuses(), false, "the pool's `select 1` answered");
  relay.mode = "forward";
  await database.sql`select 1`;
});

for (const [tls, mode] of [
  [false, "slow"],
  [true, "slow"],
  [false, "too-many"],
] as const) {
  test(`a probe while every pool connection is busy and new connections are ${mode === "slow" ? "slow" : "refused (FATAL 53300)"}: bytes read on the pool are an answer${tls ? " (TLS)" : ""}`, async () => {
    const { app, relay, database } = await apiThroughRelay(GATE, { tls });
    // The pool's one connection, confirmed (under TLS no ReadyForQuery is seen: a probe's answer does it).
    await database.sql`select 1`;
    await app.databaseGate.runOnce();
    assert.equal(app.databaseGate.refuses(), false);
    relay.slowMs = 1_500;
    relay.mode = mode;
    // That connection busy for 0.2 s: the probe's `select 1` goes to a new connection (postgres.js
    // makes one before it queues behind a busy one while under its maximum), which fares as the
    // probe's own: slow past the bound, or refused at once.
    const busy = database.sql`select pg_sleep(0.2)`.execute();
    await app.databaseGate.runOnce();
    assert.equal(app.databaseGate.refuses(), false, "the busy connection's answer counted");
    await busy;
    relay.mode = "forward";
  });
}

test("a probe while new connections are refused with FATAL 53300 and a pool's connection serves: the own connection's refusal is outweighed", async () => {
  const { app, relay } = await apiThroughRelay();
  assert.equal((await list(app)).statusCode, 200);
  relay.mode = "too-many";
  await app.databaseGate.runOnce();
  assert.equal(app.databaseGate.refuses(), false, "the pool's `select 1` answered");
  relay.mode = "forward";
});

test("a notification on the LISTEN connection is not the pool answering: with the pool's connections gone and new ones refused (FATAL 53300), NOTIFYs meanwhile, the gate closes", async () => {
  const { app, relay, database } = await apiThroughRelay();
  let heard = 0;
  // postgres.js's LISTEN client: made with the pool's options, its pacedSocket included.
  await database.sql.listen("gate_listen", () => void heard++);
  assert.equal((await list(app)).statusCode, 200);
  relay.mode = "too-many";
  // Every pool connection ended by the database (as `max_lifetime` renews them), the LISTEN one kept.
  const pooled = await db.sql<{ pid: number }[]>`
    select pid from pg_stat_activity
    where client_port = any(${relay.upstreamPorts}) and query not ilike 'listen %'`;
  assert.ok(pooled.length > 0, "the pool had a connection");
  await db.sql`select pg_terminate_backend(pid) from unnest(${pooled.map((r) => r.pid)}::int[]) as pid`;
  await waitFor(async () => relay.upstreamPorts.length === 1, 10_000, "the pool's connections to end");
  // Notifications arrive on the LISTEN connection all through the probe.
  let probing = true;
  const notifying = (async () => {
    while (probing) {
      await db.sql`select pg_notify('gate_listen', 'x')`;
      await new Promise((r) => setTimeout(r, 20));
    }
  })();
  await app.databaseGate.runOnce();
  probing = false;
  await notifying;
  assert.equal(app.databaseGate.refuses(), true, "the gate closed: the pool did not answer");
  await waitFor(async () => heard > 0, 10_000, "a notification on the LISTEN connection");
  relay.mode = "forward";
  await waitFor(async () => !app.databaseGate.refuses(), 10_000, "the gate to open again");
  assert.equal((await list(app)).statusCode, 200);
});

test("a closed gate's probes leave nothing behind while the pool's `select 1` waits for the whole outage", async () => {
  const { app, relay } = await apiThroughRelay({ ...GATE, probeAnswerMs: 100, probeEveryMs: 10 });
  v8.setFlagsFromString("--expose-gc");
  const gc = vm.runInNewContext("gc") as () => void;
  relay.set("close");
  const early = list(app);
  await waitFor(async () => app.databaseGate.refuses(), 10_000, "the gate to close");
  const heapAfter = async (probes: number) => {
    while (app.databaseGate.probes < probes) await app.databaseGate.runOnce();
    for (let i = 0; i < 3; i++) gc();
    return process.memoryUsage().heapUsed;
  };
  const start = app.databaseGate.probes;
  const at20 = await heapAfter(start + 20);
  const at50 = await heapAfter(start + 50);
  // Each probe kept ~46 KB (its error pinning its ended client) while the pool's query waited.
  const perProbe = (at50 - at20) / 30;
  assert.ok(perProbe < 8_000, `${Math.round(perProbe)} bytes kept per probe`);
  relay.set("forward");
  assert.equal((await within(early, 10_000, "the request held")).statusCode, 200);
});

test("connections that stop answering without closing (a network partition): a ping finds it, requests are 503, served again when it heals", async () => {
  const { app, relay, database } = await apiThroughRelay();
  await Promise.all(Array.from({ length: 3 }, () => database.sql`select pg_sleep(0.05)`));
  assert.equal((await list(app)).statusCode, 200);
  await new Promise((r) => setTimeout(r, GATE.suspectMs + 50));
  assert.equal((await list(app)).statusCode, 200);
  await app.databaseGate.settled();
  // The pool has every connection it may have and asks for none: only the ping can tell.
  relay.freeze();
  const held = list(app);
  await waitFor(async () => app.databaseGate.refuses(), 10_000, "the gate to close");
  const answers = await within(
    Promise.all(Array.from({ length: 50 }, () => list(app))),
    3_000,
    "50 requests during the partition",
  );
  for (const res of answers) assert.deepEqual([res.statusCode, res.json()], [503, REFUSED]);
  relay.thaw();
  assert.equal((await within(held, 10_000, "the request held by the partition")).statusCode, 200);
  await waitFor(async () => !app.databaseGate.refuses(), 10_000, "the gate to open again");
  assert.equal((await list(app)).statusCode, 200);
});

/** The pool's pacedSocket (silent() and friends). */
const pacer = (database: Database) => (database.sql.options as unknown as { socket: PacedSocket }).socket;

/**
 * Waits while requests look at the gate (each may ping the pool; an unanswered ping, or a silent
 * connection, starts a probe) until every one of `waiting` has settled, and checks each failed as its
 * connection was closed.
 */
async function closedByPings(app: FastifyInstance, waiting: Promise<unknown>[]): Promise<void> {
  let settled = 0;
  for (const w of waiting) void w.then(() => settled++);
  await waitFor(
    async () => {
      app.databaseGate.refuses();
      return settled === waiting.length;
    },
    15_000,
    "the silent connections' statements to fail",
  );
  assert.deepEqual(
    await Promise.all(waiting),
    waiting.map(() => "CONNECTION_CLOSED"),
  );
}

/**
 * A `pg_sleep` on an API's pool (through a relay to `o.target`) silent past the probe's bound: a probe
 * leaves it alone (the gate open, the statement answered, nothing closed).
 */
async function longStatementLeftAlone(o: { target?: string } = {}): Promise<void> {
  const { app, database, logs } = await apiThroughRelay(GATE, o);
  await database.sql`select 1`;
  const long = database.sql`select pg_sleep(1.5)`.then(() => "answered");
  await waitFor(
    async () => pacer(database).silent(GATE.probeAnswerMs).length === 1,
    10_000,
    "the long statement's connection to be silent",
  );
  await app.databaseGate.runOnce();
  assert.equal(app.databaseGate.refuses(), false, "the probe was answered");
  assert.equal(await long, "answered");
  assert.equal(logged(logs, 40, SILENT_DROPPED), 0);
}

const SILENT_CASES = {
  idle: "their statements never arrived",
  gone: "their backends gone: another server's now",
  writing: "their answers held, a large one blocking its backend",
  "first-run": "a statement's first run, its Parse and Describe sent with a Flush and no Sync",
} as const;

for (const [which, backends] of [
  ["both", "idle"],
  ["both", "gone"],
  ["answers", "writing"],
  ["both", "first-run"],
] as const) {
  test(`pool connections that go silent while new connections work (${SILENT_CASES[backends]}): a probe closes them, their queries fail at once, new connections serve`, async () => {
    const { app, relay, database, logs } = await apiThroughRelay();
    // The pool's three connections made and confirmed.
    await Promise.all(Array.from({ length: 3 }, () => database.sql`select pg_sleep(0.05)`));
    assert.equal((await list(app)).statusCode, 200);
    const pids = new Set(
      (
        await db.sql<{ pid: number }[]>`
          select pid from pg_stat_activity
          where client_port = any(${relay.upstreamPorts}) and query not ilike 'listen %'`
      ).map((r) => r.pid),
    );
    assert.equal(pids.size, 3);
    relay.strand(which);
    if (backends === "gone")
      await db.sql`select pg_terminate_backend(pid) from unnest(${[...pids]}::int[]) as pid`;
    // A statement on each connection (a large answer with `writing`), and a request.
    const waiting = Array.from({ length: 3 }, () =>
      (backends === "writing"
        ? database.sql`select repeat('x', 10000) from generate_series(1, 20000)`
        : backends === "first-run"
          ? database.sql`select ${7}::int as never_run_here`
          : database.sql`select 1`
      ).then(
        () => "answered",
        (err: { code?: string }) => err.code,
      ),
    );
    const held = list(app);
    await closedByPings(app, waiting);
    // Failed with its connection (503, to be tried again: a 500 until 2026-12-07), or (a query
    // postgres.js had not yet written anywhere) served on a new one.
    const answer = await within(held, 10_000, "the request made while the connections were silent");
    assert.ok([503, 200].includes(answer.statusCode), `${answer.statusCode}`);
    const warned = logs.filter((l) => l.level === 40 && l.msg === SILENT_DROPPED) as unknown as {
      pids: number[];
    }[];
    assert.deepEqual(new Set(warned.flatMap((l) => l.pids)), pids);
    // Served on new connections, the gate open all along.
    assert.equal((await list(app)).statusCode, 200);
    assert.equal(app.databaseGate.refuses(), false);
    assert.equal(
      logged(logs, 40, "the database does not answer: API requests are answered 503 until it does"),
      0,
    );
  });
}

test("silent pool connections are found while another pool connection answers the pings", async () => {
  const { app, relay, database, logs } = await apiThroughRelay(GATE, { max: 4 });
  await Promise.all(Array.from({ length: 3 }, () => database.sql`select pg_sleep(0.05)`));
  relay.strand();
  const waiting = Array.from({ length: 3 }, () =>
    database.sql`select 1`.then(
      () => "answered",
      (err: { code?: string }) => err.code,
    ),
  );
  // The pool's fourth connection, made now through the relay: it answers, and takes the pings.
  await database.sql`select 2`;
  await closedByPings(app, waiting);
  assert.equal(logged(logs, 40, SILENT_DROPPED), 1);
  assert.equal((await list(app)).statusCode, 200);
});

test("a pool connection whose statement has not reached its idle backend is closed only once it has been silent for silentStuckMs", async () => {
  const stuckMs = 2_500;
  const { app, relay, database, logs } = await apiThroughRelay(
    { ...GATE, silentStuckMs: stuckMs },
    { max: 1 },
  );
  await database.sql`select 1`;
  relay.strand();
  const asked = performance.now();
  let failedAt = 0;
  const waiting = database.sql`select 1`.then(
    () => "answered",
    (err: { code?: string }) => {
      failedAt = performance.now();
      return err.code;
    },
  );
  await waitFor(
    async () => pacer(database).silent(GATE.probeAnswerMs).length === 1,
    10_000,
    "the connection to be silent",
  );
  // Looked up, found idle, and left: it may be a statement still on its way.
  await app.databaseGate.runOnce();
  assert.equal(logged(logs, 40, SILENT_DROPPED), 0);
  assert.equal(failedAt, 0);
  await waitFor(
    async () => {
      await app.databaseGate.runOnce();
      return failedAt > 0;
    },
    15_000,
    "the connection to be closed",
  );
  assert.equal(await waiting, "CONNECTION_CLOSED");
  assert.ok(failedAt - asked >= stuckMs, `closed ${Math.round(failedAt - asked)} ms after its statement`);
});

test("behind a pooler that answers with a key of its own, no pid is judged: a long statement silent past the bound is answered", async () => {
  const proxy = await keyFakingProxy(db.url);
  closers.push(() => proxy.close());
  const target = new URL(db.url);
  target.hostname = "127.0.0.1";
  target.port = String(proxy.port);
  await longStatementLeftAlone({ target: target.toString() });
});

test("with track_activities off (every state `disabled`), a long statement silent past the bound is answered", async () => {
  const [row] = await db.sql<{ name: string }[]>`select current_database() as name`;
  const name = row?.name as string;
  await db.sql.unsafe(`alter database "${name}" set track_activities = off`);
  try {
    await longStatementLeftAlone();
  } finally {
    await db.sql.unsafe(`alter database "${name}" reset track_activities`);
  }
});

test("a pool connection silent through a long statement is left alone: its backend is active", () =>
  longStatementLeftAlone());

test("the pacer confirms only connections made before what was answered, and one that said ReadyForQuery itself", async () => {
  // A server that answers a connection with ReadyForQuery once it has a byte, and holds the others.
  const readyFor = new Set<number>();
  const server = net.createServer((socket) => {
    socket.once("data", () => {
      if (readyFor.has(socket.remotePort ?? 0)) socket.write(Buffer.from([0x5a, 0, 0, 0, 5, 0x49]));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  closers.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const { port } = server.address() as net.AddressInfo;
  const pacer = pacedSocket();
  const connect = async () => {
    const socket = await pacer({ host: ["127.0.0.1"], port: [port] });
    await new Promise((resolve) => socket.once("connect", resolve));
    closers.push(() => void socket.destroy());
    return socket;
  };
  const early = await connect();
  const before = performance.now();
  const late = await connect();
  pacer.confirm(before);
  assert.deepEqual([...pacer.mark().keys()], [early], "the one made after `before` is left out");
  // A third connection that says ReadyForQuery is confirmed by it, and it alone.
  const ready = await connect();
  readyFor.add(ready.localPort ?? 0);
  ready.write("x");
  late.write("x");
  await waitFor(async () => pacer.mark().has(ready), 5_000, "the ready connection to be confirmed");
  assert.equal(pacer.mark().has(late), false);
  assert.equal(pacer.unconfirmedSince(), null);
});
