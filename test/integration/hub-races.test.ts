// The event hub's per-task delivery chain under interleavings: a subscriber that leaves while a
// catch-up is in flight and one that comes after it, and subscribers whose callbacks throw.
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { after, before, describe, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { EventHub } from "../../src/events/hub.ts";
import type { TaskEvent } from "../../src/events/read.ts";
import { createLogger } from "../../src/log.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser, tableEvents, waitFor } from "../helpers/queue.ts";

let db: TestDatabase;
let owner: Principal;

before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "hub-races");
});
after(() => db.drop());

/** A test that hangs fails instead of holding up the suite. */
const LIMIT = { timeout: 30_000 };

/** Inserts an event straight into the table (no notification), as the hub would read it. */
async function insertEvent(taskId: string, type: string): Promise<TaskEvent> {
  const [e] = await db.sql<TaskEvent[]>`
    insert into task_events (task_id, type, data) values (${taskId}, ${type}, '{}'::jsonb)
    returning id::text as id, task_id::text as "taskId", run_id::text as "runId", type, data,
              to_char(created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') as "createdAt"`;
  assert.ok(e);
  return e;
}

const announce = (taskId: string, events: TaskEvent[]) =>
  db.sql`select pg_notify('assay_events', ${JSON.stringify({ taskId, events })})`;
const ringDoorbell = (taskId: string, eventId: string) =>
  db.sql`select pg_notify('assay_events', ${JSON.stringify({ taskId, eventId })})`;

/** A logger whose lines the test can read. */
function capturedLogger() {
  const lines: Record<string, unknown>[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split("\n")) if (line) lines.push(JSON.parse(line));
      done();
    },
  });
  return { lines, logger: createLogger({ level: "warn", destination }) };
}

describe("a catch-up in flight when its task's last subscriber leaves", () => {
  test(
    "its failed read does not break off a subscriber that came after it, whose events still arrive in order",
    LIMIT,
    async () => {
      const taskId = await createTask(db.sql, owner, "hub-leave", 1);
      const [first] = await tableEvents(db.sql, taskId);
      assert.ok(first);
      // The hub's reads of the table, once `hold` is set, wait for `release` and then fail.
      let hold = false;
      let held = false;
      let release: () => void = () => {};
      const released = new Promise<void>((resolve) => {
        release = resolve;
      });
      const sql = new Proxy(db.sql, {
        apply(target, self, args: unknown[]) {
          const strings = args[0] as { raw?: readonly string[] } & readonly string[];
          if (hold && strings?.raw && strings.join("").includes("from task_events e")) {
            hold = false;
            held = true;
            return released.then(() => Promise.reject(new Error("the catch-up's read failed (test)")));
          }
          return Reflect.apply(target, self, args);
        },
      });
      const { lines, logger } = capturedLogger();
      const hub = new EventHub({ sql, logger, sweepIntervalMs: 60_000 });
      await hub.ready();
      try {
        const leaving = hub.subscribe(taskId, first[0], () => {});
        // A doorbell: the hub reads the table for the subscriber, and that read hangs.
        hold = true;
        const big = await insertEvent(taskId, "test.big");
        await ringDoorbell(taskId, big.id);
        await waitFor(async () => held, 5_000, "the catch-up's read");
        // The last subscriber leaves while the read is in flight; a new stream of the task comes
        // (it reads its backlog from the table after subscribing, so it has `big` from there).
        leaving();
        const delivered: string[] = [];
        let failed = false;
        const unsubscribe = hub.subscribe(
          taskId,
          big.id,
          (events) => delivered.push(...events.map((e) => e.id)),
          () => {},
          () => {
            failed = true;
          },
        );
        // The read fails now: it was for the subscriber that left.
        release();
        await waitFor(
          async () => lines.some((l) => l.msg === "event delivery failed; streams broken off"),
          5_000,
          "the failed catch-up",
        );
        assert.equal(failed, false, "the new subscriber was broken off by a read made for one that had left");
        // And it is still served, in id order.
        const next = await insertEvent(taskId, "test.next");
        await announce(taskId, [next]);
        const later = await insertEvent(taskId, "test.later");
        await announce(taskId, [later]);
        await waitFor(async () => delivered.length >= 2, 5_000, `two events (got ${delivered})`);
        assert.deepEqual(delivered, [next.id, later.id]);
        assert.equal(failed, false);
        unsubscribe();
      } finally {
        await hub.stop();
      }
    },
  );

  test(
    "a delivery announced after the new subscriber came waits for the catch-up in flight (one chain per task)",
    LIMIT,
    async () => {
      const taskId = await createTask(db.sql, owner, "hub-one-chain", 1);
      const [first] = await tableEvents(db.sql, taskId);
      assert.ok(first);
      let hold = false;
      let held = false;
      let release: () => void = () => {};
      const released = new Promise<void>((resolve) => {
        release = resolve;
      });
      // The held read succeeds once released, with what the table held when it was made.
      const sql = new Proxy(db.sql, {
        apply(target, self, args: unknown[]) {
          const strings = args[0] as { raw?: readonly string[] } & readonly string[];
          if (hold && strings?.raw && strings.join("").includes("from task_events e")) {
            hold = false;
            held = true;
            const read = Reflect.apply(target, self, args) as Promise<unknown>;
            return released.then(() => read);
          }
          return Reflect.apply(target, self, args);
        },
      });
      const hub = new EventHub({ sql, logger: createLogger({ level: "silent" }), sweepIntervalMs: 60_000 });
      await hub.ready();
      try {
        const leaving = hub.subscribe(taskId, first[0], () => {});
        hold = true;
        const big = await insertEvent(taskId, "test.big");
        await ringDoorbell(taskId, big.id);
        await waitFor(async () => held, 5_000, "the catch-up's read");
        leaving();
        const delivered: string[] = [];
        const unsubscribe = hub.subscribe(taskId, first[0], (events) =>
          delivered.push(...events.map((e) => e.id)),
        );
        const next = await insertEvent(taskId, "test.next");
        const seen = hub.received.notifications;
        await announce(taskId, [next]);
        await waitFor(async () => hub.received.notifications > seen, 5_000, "the notification");
        // Its delivery must not overtake the catch-up in flight: that would move the subscriber past
        // `big`, which the catch-up then holds back as already seen.
        await new Promise((resolve) => setImmediate(resolve));
        assert.deepEqual(delivered, [], "delivered ahead of the catch-up in flight");
        release();
        await waitFor(async () => delivered.length >= 2, 5_000, `two events (got ${delivered})`);
        assert.deepEqual(delivered, [big.id, next.id]);
        unsubscribe();
      } finally {
        await hub.stop();
      }
    },
  );
});

describe("a catch-up while a stream's backlog is read", () => {
  test(
    "one that began before the backlog's first page reads on from where the backlog stands, not through the whole history",
    LIMIT,
    async () => {
      const taskId = await createTask(db.sql, owner, "hub-catchup-backlog", 1);
      // More than four catch-up pages of history.
      await db.sql`
        insert into task_events (task_id, type, data)
        select ${taskId}, 'test.history', jsonb_build_object('n', g) from generate_series(1, 2100) g`;
      const history = await tableEvents(db.sql, taskId);
      const lastId = history.at(-1)?.[0] as string;
      // Where each of the hub's reads of the table started (its `and e.id >` fragment); the first
      // read is held until `release`.
      const reads: string[] = [];
      let hold = true;
      let release: () => void = () => {};
      const released = new Promise<void>((resolve) => {
        release = resolve;
      });
      const sql = new Proxy(db.sql, {
        apply(target, self, args: unknown[]) {
          const strings = args[0] as { raw?: readonly string[] } & readonly string[];
          if (strings?.raw && strings.join("?").includes("and e.id >")) reads.push(String(args[1]));
          if (hold && strings?.raw && strings.join("").includes("from task_events e")) {
            hold = false;
            const read = Reflect.apply(target, self, args) as Promise<unknown>;
            return released.then(() => read);
          }
          return Reflect.apply(target, self, args);
        },
      });
      const hub = new EventHub({ sql, logger: createLogger({ level: "silent" }), sweepIntervalMs: 60_000 });
      await hub.ready();
      try {
        // A stream without Last-Event-ID subscribes from 0; a doorbell rings before its backlog's
        // first page is read.
        const delivered: string[] = [];
        const subscription = hub.subscribe(taskId, null, (events) =>
          delivered.push(...events.map((e) => e.id)),
        );
        const big = await insertEvent(taskId, "test.big");
        await ringDoorbell(taskId, big.id);
        await waitFor(async () => reads.length === 1, 5_000, "the catch-up's first read");
        // The backlog reads the whole history meanwhile, `big` included, and advances the subscription.
        subscription.advance(big.id);
        release();
        // A later event, announced: delivered once the catch-up (ahead of it in the chain) is done.
        const next = await insertEvent(taskId, "test.next");
        await announce(taskId, [next]);
        await waitFor(async () => delivered.includes(next.id), 5_000, "the later event");
        assert.deepEqual(delivered, [next.id]);
        assert.ok(BigInt(lastId) < BigInt(big.id));
        assert.equal(reads.length, 2, `the catch-up read from ${reads.join(", ")}`);
        assert.equal(reads[1], big.id, "its second read starts where the backlog stands");
        subscription();
      } finally {
        await hub.stop();
      }
    },
  );
});

describe("subscribers whose callbacks throw", () => {
  test(
    "one subscriber's deliver that throws neither keeps the event from the others nor breaks them off",
    LIMIT,
    async () => {
      const taskId = await createTask(db.sql, owner, "hub-throw", 1);
      const [first] = await tableEvents(db.sql, taskId);
      assert.ok(first);
      const hub = new EventHub({
        sql: db.sql,
        logger: createLogger({ level: "silent" }),
        sweepIntervalMs: 60_000,
      });
      await hub.ready();
      try {
        let badFailed = false;
        hub.subscribe(
          taskId,
          first[0],
          () => {
            throw new Error("a subscriber's deliver threw (test)");
          },
          () => {},
          () => {
            badFailed = true;
          },
        );
        const delivered: string[] = [];
        let goodFailed = false;
        const unsubscribe = hub.subscribe(
          taskId,
          first[0],
          (events) => delivered.push(...events.map((e) => e.id)),
          () => {},
          () => {
            goodFailed = true;
          },
        );
        const one = await insertEvent(taskId, "test.one");
        await announce(taskId, [one]);
        const two = await insertEvent(taskId, "test.two");
        await announce(taskId, [two]);
        await waitFor(
          async () => delivered.length >= 2 || goodFailed,
          5_000,
          `two events (got ${delivered})`,
        );
        assert.equal(goodFailed, false, "broken off by another subscriber's error");
        assert.deepEqual(delivered, [one.id, two.id]);
        // The one that threw is detached and told so (its stream resumes by Last-Event-ID).
        assert.equal(badFailed, true);
        assert.equal(hub.size, 1);
        unsubscribe();
      } finally {
        await hub.stop();
      }
    },
  );

  test(
    "a subscriber's fail that throws does not end the process (an unhandled rejection) or spare the others",
    LIMIT,
    async () => {
      const taskId = await createTask(db.sql, owner, "hub-throw-fail", 1);
      const [first] = await tableEvents(db.sql, taskId);
      assert.ok(first);
      let failReads = false;
      const sql = new Proxy(db.sql, {
        apply(target, self, args: unknown[]) {
          const strings = args[0] as { raw?: readonly string[] } & readonly string[];
          if (failReads && strings?.raw && strings.join("").includes("from task_events e")) {
            failReads = false;
            return Promise.reject(new Error("the catch-up's read failed (test)"));
          }
          return Reflect.apply(target, self, args);
        },
      });
      const unhandled: unknown[] = [];
      const onUnhandled = (reason: unknown) => unhandled.push(reason);
      process.on("unhandledRejection", onUnhandled);
      const hub = new EventHub({ sql, logger: createLogger({ level: "silent" }), sweepIntervalMs: 60_000 });
      await hub.ready();
      try {
        hub.subscribe(
          taskId,
          first[0],
          () => {},
          () => {},
          () => {
            throw new Error("a subscriber's fail threw (test)");
          },
        );
        let otherFailed = false;
        hub.subscribe(
          taskId,
          first[0],
          () => {},
          () => {},
          () => {
            otherFailed = true;
          },
        );
        failReads = true;
        const big = await insertEvent(taskId, "test.big");
        await ringDoorbell(taskId, big.id);
        await waitFor(async () => otherFailed || unhandled.length > 0, 5_000, "the failed catch-up");
        // An unhandled rejection surfaces a turn after the chain settles.
        await new Promise((resolve) => setTimeout(resolve, 0));
        await new Promise((resolve) => setImmediate(resolve));
        assert.deepEqual(unhandled, []);
        assert.equal(otherFailed, true, "the other subscriber was not broken off");
        assert.equal(hub.size, 0);
      } finally {
        process.off("unhandledRejection", onUnhandled);
        await hub.stop();
      }
    },
  );
});

test(
  "a catch-up reads for the subscribers it is owed to: one that came after it does not pull it back to its start",
  LIMIT,
  async () => {
    const taskId = await createTask(db.sql, owner, "hub-owed", 1);
    for (let i = 0; i < 5; i++) await insertEvent(taskId, "test.history");
    const latest = (await tableEvents(db.sql, taskId)).at(-1)?.[0] as string;
    // Where each of the hub's reads of the table started; the first read's answer is held back.
    const reads: string[] = [];
    let hold = true;
    let release: () => void = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    const sql = new Proxy(db.sql, {
      apply(target, self, args: unknown[]) {
        const strings = args[0] as { raw?: readonly string[] } & readonly string[];
        // The position is a fragment's parameter; the read is the statement around it.
        if (strings?.raw && strings.join("?").includes("and e.id >")) reads.push(String(args[1]));
        else if (hold && strings?.raw && strings.join("").includes("from task_events e")) {
          hold = false;
          // Read now (nothing new yet), answered once released.
          const rows = Promise.resolve(Reflect.apply(target, self, args) as PromiseLike<unknown>);
          return rows.then((r) => released.then(() => r));
        }
        return Reflect.apply(target, self, args);
      },
    });
    const hub = new EventHub({ sql, logger: createLogger({ level: "silent" }), sweepIntervalMs: 60_000 });
    await hub.ready();
    try {
      const delivered: string[] = [];
      const first = hub.subscribe(taskId, latest, (events) => delivered.push(...events.map((e) => e.id)));
      // A doorbell whose catch-up finds nothing new, its answer held: the task's chain is busy.
      await ringDoorbell(taskId, latest);
      await waitFor(async () => reads.length === 1, 5_000, "the first catch-up's read");
      // An event too large to travel: its catch-up queues behind, owed to the first subscriber.
      const big = await insertEvent(taskId, "test.big");
      await ringDoorbell(taskId, big.id);
      await waitFor(async () => hub.received.notifications >= 2, 5_000, "the second doorbell");
      // A stream from the start subscribes now: it reads its own backlog, the catch-up is not for it.
      const late = hub.subscribe(taskId, null, () => {});
      release();
      await waitFor(async () => delivered.includes(big.id), 5_000, "the event to the first subscriber");
      assert.deepEqual(delivered, [big.id]);
      assert.deepEqual(
        reads.map((from) => BigInt(from) >= BigInt(latest)),
        [true, true],
        `the catch-ups read after ${reads}, the subscriber they were owed to stood at ${latest}`,
      );
      late();
      first();
    } finally {
      await hub.stop();
    }
  },
);
