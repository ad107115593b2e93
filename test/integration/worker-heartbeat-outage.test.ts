// A worker's heartbeat while the database does not answer: postgres.js keeps a query waiting through a
// proxy that closes every connection (making the connection again and again), so a heartbeat started
// on every tick stayed in flight for the whole outage — one more per tick, all sent at once when the
// database came back. The timer now lets at most one more than the pool's connections run at once: a
// beat stuck on a connection that went silent must not stop the next from keeping the leases over
// another connection, which a cap of two did (second test).
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";
import { createDatabase } from "../../src/db/client.ts";
import { createLogger } from "../../src/log.ts";
import { Worker } from "../../src/queue/worker.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { relayTo, throughRelay } from "../helpers/db-relay.ts";
import { createTask, seedUser, waitFor } from "../helpers/queue.ts";

let db: TestDatabase;

before(async () => {
  db = await createTestDatabase();
});

after(async () => {
  await db.drop();
});

test("a database that does not answer holds at most the pool's connections + 1 heartbeats in flight, however many ticks pass", async () => {
  const relay = await relayTo(db.url, "forward");
  const pool = createDatabase(throughRelay(db.url, relay), { max: 3 });
  const worker = new Worker({
    sql: pool.sql,
    logger: createLogger({ level: "silent" }),
    types: { summary: { handler: async () => ({ status: "succeeded" }) } },
    concurrency: 1,
    // A heartbeat every 200 ms.
    leaseTtlMs: 600,
    pollIntervalMs: 60_000,
    retryBaseMs: 1_000,
  });
  const beating = (worker as unknown as { beating: Set<Promise<void>> }).beating;
  await worker.start();
  try {
    relay.set("close");
    // Fifteen ticks of the heartbeat's timer, the beats in flight looked at every 20 ms.
    const started = performance.now();
    const accepted = relay.accepted;
    let most = 0;
    while (performance.now() - started < 3_000) {
      most = Math.max(most, beating.size);
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.ok(relay.accepted > accepted, "the pool kept trying the database meanwhile");
    assert.ok(most >= 1, "a heartbeat was waiting on the database");
    assert.ok(most <= 4, `${most} heartbeats were in flight at once (a pool of 3)`);
    // Back: the beats waiting finish, and the next ones run.
    relay.set("forward");
    await waitFor(async () => beating.size === 0, 10_000, "the waiting heartbeats to finish");
  } finally {
    // stop() waits for the heartbeats in flight: the database answers again first.
    relay.set("forward");
    await worker.stop();
    await pool.close();
    await relay.close();
  }
});

/** Forwards to `target`; freeze() silences every connection open now (kept open, nothing passed on). */
async function freezer(target: URL) {
  const pairs = new Set<{ c: net.Socket; u: net.Socket; frozen: boolean }>();
  const server = net.createServer((c) => {
    const u = net.connect(Number(target.port), target.hostname);
    const p = { c, u, frozen: false };
    pairs.add(p);
    c.on("error", () => {});
    u.on("error", () => {});
    c.on("data", (d) => {
      if (!p.frozen) u.write(d);
    });
    u.on("data", (d) => {
      if (!p.frozen) c.write(d);
    });
    c.on("close", () => {
      u.destroy();
      pairs.delete(p);
    });
    u.on("close", () => {
      c.destroy();
      pairs.delete(p);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    port: (server.address() as net.AddressInfo).port,
    freeze: () => {
      let n = 0;
      for (const p of pairs) {
        if (!p.frozen) n++;
        p.frozen = true;
      }
      return n;
    },
    close: async () => {
      for (const p of pairs) {
        p.c.destroy();
        p.u.destroy();
      }
      await new Promise((r) => server.close(r));
    },
  };
}

test("heartbeats stuck on connections that went silent do not stop the next from keeping the lease", async () => {
  // A network fault that drops packets silences every connection open at the time; a query on one
  // waits until TCP gives up (minutes). New connections work. A cap of two beats in flight stopped
  // all heartbeats here and the lease expired.
  const relay = await freezer(new URL(db.url));
  const url = new URL(db.url);
  url.hostname = "127.0.0.1";
  url.port = String(relay.port);
  const pool = createDatabase(url.toString(), { max: 10 });
  const ttl = 1500;
  let release!: () => void;
  const done = new Promise<void>((r) => {
    release = r;
  });
  const worker = new Worker({
    sql: pool.sql,
    logger: createLogger({ level: "silent" }),
    types: {
      summary: {
        handler: async () => {
          await done;
          return { status: "succeeded" };
        },
      },
    },
    concurrency: 1,
    leaseTtlMs: ttl,
    pollIntervalMs: 60_000,
    retryBaseMs: 1_000,
  });
  const beating = (worker as unknown as { beating: Set<Promise<void>> }).beating;
  const owner = await seedUser(db.sql, "Zoë «silent»");
  await worker.start();
  try {
    const taskId = await createTask(db.sql, owner, "summary", 1);
    await waitFor(
      async () => {
        const [r] = await db.sql`select status from runs where task_id = ${taskId}`;
        return r?.status === "starting" || r?.status === "running";
      },
      10_000,
      "the run to start",
    );
    // A few connections open in the pool, then every one of them goes silent.
    await Promise.all([1, 2, 3].map(() => pool.sql`select pg_sleep(0.05)`));
    assert.ok(relay.freeze() >= 2, "connections silenced");
    const frozenAt = performance.now();
    let stuck = 0;
    // Four lease lifetimes: the lease must stay ahead of now all along.
    while (performance.now() - frozenAt < 4 * ttl) {
      await new Promise((r) => setTimeout(r, 250));
      stuck = Math.max(stuck, beating.size);
      const [r] = await db.sql<{ left: number }[]>`
        select extract(epoch from lease_expires_at - now())::float8 * 1000 as left from runs where task_id = ${taskId}`;
      assert.ok(
        (r?.left ?? -1) > 0,
        `the lease expired ${-Math.round(r?.left ?? 0)} ms ago, a connection working`,
      );
    }
    assert.ok(stuck >= 1, "a heartbeat was stuck on a silent connection");
  } finally {
    release();
    // stop() waits for the heartbeats in flight, and those on silent connections never end: drop them.
    beating.clear();
    await Promise.race([worker.stop(), new Promise((r) => setTimeout(r, 3_000))]);
    await relay.close();
    await Promise.race([pool.close(), new Promise((r) => setTimeout(r, 3_000))]);
  }
});
