// A worker's heartbeat while the database does not answer: postgres.js keeps a query waiting through a
// proxy that closes every connection (making the connection again and again), so a heartbeat started
// on every tick stayed in flight for the whole outage — one more per tick, all sent at once when the
// database came back. The timer now lets at most two run at once (two: one stuck on a dead connection
// must not stop the next from keeping the leases).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { createDatabase } from "../../src/db/client.ts";
import { createLogger } from "../../src/log.ts";
import { Worker } from "../../src/queue/worker.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { relayTo, throughRelay } from "../helpers/db-relay.ts";
import { waitFor } from "../helpers/queue.ts";

let db: TestDatabase;

before(async () => {
  db = await createTestDatabase();
});

after(async () => {
  await db.drop();
});

test("a database that does not answer holds at most two heartbeats in flight, however many ticks pass", async () => {
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
    assert.ok(most <= 2, `${most} heartbeats were in flight at once`);
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
