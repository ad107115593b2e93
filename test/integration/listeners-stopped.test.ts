// What listens on postgres.js's LISTEN connection — the event hub, the task and token caches, a
// worker's channels (listenAll) — hears nothing once stopped, also when the connection reconnected
// before the stop: postgres.js re-listens under new registrations, which the unlisten it returned
// at the first LISTEN no longer finds.
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { after, before, test } from "node:test";
import { TOKENS_CHANNEL, TokenCache } from "../../src/auth/token-cache.ts";
import type { Authenticated } from "../../src/auth/tokens.ts";
import { listenAll } from "../../src/db/listen.ts";
import { EventHub } from "../../src/events/hub.ts";
import { createLogger } from "../../src/log.ts";
import { EVENTS_CHANNEL } from "../../src/queue/sql.ts";
import { TaskCache } from "../../src/tasks/task-cache.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { waitFor } from "../helpers/queue.ts";

let db: TestDatabase;

before(async () => {
  db = await createTestDatabase();
});
after(() => db.drop());

/** A channel name that needs quoting, as a worker's are not. */
const OTHER_CHANNEL = 'assay "stopped" ü';

/** Kills this database's LISTEN connection (postgres.js reconnects and re-listens). */
async function killListener(): Promise<void> {
  const killed = await db.sql`
    select pg_terminate_backend(pid) from pg_stat_activity
    where datname = current_database() and query ~* '^(un)?listen "' and pid <> pg_backend_pid()`;
  assert.ok(killed.length >= 1, "found the LISTEN connection");
}

test("a stopped hub, task cache, token cache and listenAll hear nothing after a reconnect, and stay off", {
  timeout: 30_000,
}, async () => {
  const lines: Record<string, unknown>[] = [];
  const logger = createLogger({
    level: "warn",
    destination: new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const line of chunk.toString().split("\n")) if (line) lines.push(JSON.parse(line));
        done();
      },
    }),
  });
  const hub = new EventHub({ sql: db.sql, logger, sweepIntervalMs: 60_000 });
  await hub.ready();
  const tasks = new TaskCache(60_000);
  await tasks.start(db.sql, logger);
  const tokens = new TokenCache(60_000);
  await tokens.start(db.sql, logger);
  const revokes: string[] = [];
  tokens.onRevoke((tokenId) => revokes.push(tokenId));
  const other = { notified: [] as string[], listens: 0 };
  const unlistenOther = await listenAll(db.sql, [
    {
      channel: OTHER_CHANNEL,
      onNotify: (payload) => other.notified.push(payload),
      onListen: () => {
        other.listens++;
      },
    },
  ]);
  // Probes registered last on each channel: postgres.js calls a channel's callbacks in the order
  // they were registered, so once a probe has heard something, the others have been called too.
  const probe = { notified: [] as string[], listens: 0 };
  const probes = await Promise.all(
    [EVENTS_CHANNEL, TOKENS_CHANNEL, OTHER_CHANNEL].map((channel) =>
      db.sql.listen(
        channel,
        (payload) => probe.notified.push(payload),
        () => {
          probe.listens++;
        },
      ),
    ),
  );
  const notifyAll = async (tag: string) => {
    const heard = probe.notified.length;
    await db.sql`select pg_notify(${EVENTS_CHANNEL}, ${JSON.stringify({ taskId: "100000", events: [] })})`;
    await db.sql`select pg_notify(${TOKENS_CHANNEL}, '99999')`;
    await db.sql`select pg_notify(${OTHER_CHANNEL}, ${tag})`;
    await waitFor(async () => probe.notified.length >= heard + 3, 5_000, `the probes to hear ${tag}`);
  };
  try {
    // A reconnect while they run: they hear it and go on hearing.
    await killListener();
    await waitFor(async () => probe.listens >= 6, 10_000, "the re-listens");
    await notifyAll("before the stop");
    assert.equal(hub.received.notifications, 1);
    assert.deepEqual(revokes, ["*", "99999"], "the reconnect, then the revoke");
    assert.deepEqual(other.notified, ["before the stop"]);
    assert.equal(other.listens, 2);

    await hub.stop();
    await tasks.stop();
    await tokens.stop();
    await unlistenOther();
    const warnings = lines.length;

    await notifyAll("after the stop");
    assert.equal(hub.received.notifications, 1, "the stopped hub heard a notification");
    assert.deepEqual(revokes, ["*", "99999"], "the stopped token cache passed on a revoke");
    assert.deepEqual(other.notified, ["before the stop"], "listenAll's unlisten left its callback on");

    // Another reconnect: a stopped cache must not turn itself back on, nor the hub catch up.
    await killListener();
    await waitFor(async () => probe.listens >= 9, 10_000, "the second re-listens");
    await new Promise((resolve) => setImmediate(resolve));
    const principal: Authenticated = { tokenId: 1, userId: 1, name: "ünïcode", role: "user" };
    tokens.set("a".repeat(64), principal, tokens.begin());
    assert.equal(tokens.size, 0, "the stopped token cache caches again");
    tasks.set("100000", 1, {}, tasks.begin());
    assert.equal(tasks.size, 0, "the stopped task cache caches again");
    assert.deepEqual(revokes, ["*", "99999"], "the stopped token cache announced the reconnect");
    assert.equal(other.listens, 2, "listenAll's onListen was called after its unlisten");
    assert.equal(lines.length, warnings, `logged after the stop: ${JSON.stringify(lines.slice(warnings))}`);
  } finally {
    for (const p of probes) await p.unlisten();
  }
});

test("a cache whose LISTEN failed comes back once postgres.js listens with it after a reconnect, and is off after stop()", {
  timeout: 30_000,
}, async () => {
  const logger = createLogger({ level: "silent" });
  // As when the database is down at start-up: postgres.js has registered the callbacks (and listens
  // with them once it reconnects), and the caller gets an error.
  const sql = new Proxy(db.sql, {
    get(target, prop, receiver) {
      if (prop !== "listen") return Reflect.get(target, prop, receiver);
      return async (channel: string, fn: (payload: string) => void, onlisten?: () => void) => {
        // Its first LISTEN "fails": that one is not announced; the re-listens after a reconnect are.
        let listens = 0;
        await target.listen(channel, fn, () => {
          if (listens++ > 0) onlisten?.();
        });
        throw new Error("LISTEN failed (test)");
      };
    },
  });
  const tasks = new TaskCache(60_000);
  await tasks.start(sql, logger);
  const tokens = new TokenCache(60_000);
  await tokens.start(sql, logger);
  const principal: Authenticated = { tokenId: 1, userId: 1, name: "ünïcode", role: "user" };
  const fill = () => {
    tokens.set("b".repeat(64), principal, tokens.begin());
    tasks.set("100001", 1, {}, tasks.begin());
  };
  const probe = { listens: 0 };
  const probes = await Promise.all(
    [EVENTS_CHANNEL, TOKENS_CHANNEL].map((channel) =>
      db.sql.listen(
        channel,
        () => {},
        () => {
          probe.listens++;
        },
      ),
    ),
  );
  try {
    fill();
    assert.equal(tokens.size + tasks.size, 0, "nothing cached while not listening");
    await killListener();
    await waitFor(async () => probe.listens >= 4, 10_000, "the re-listens");
    await new Promise((resolve) => setImmediate(resolve));
    fill();
    assert.equal(tokens.size, 1, "the token cache came back");
    assert.equal(tasks.size, 1, "the task cache came back");

    await tasks.stop();
    await tokens.stop();
    await killListener();
    await waitFor(async () => probe.listens >= 6, 10_000, "the second re-listens");
    await new Promise((resolve) => setImmediate(resolve));
    fill();
    assert.equal(tokens.size + tasks.size, 0, "a stopped cache caches again");
  } finally {
    for (const p of probes) await p.unlisten();
  }
});
