// The event record (issue 13): every read of task_events in numeric id order across a power of ten,
// streams that end with their task whatever Last-Event-ID says, no subscription outliving its client,
// and one createdAt format on every path.
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, describe, test } from "node:test";
import { type Principal, tokenCreate, tokenRevoke } from "../../src/auth/tokens.ts";
import { isoTimeSql } from "../../src/db/client.ts";
import { EventHub } from "../../src/events/hub.ts";
import type { TaskEvent } from "../../src/events/read.ts";
import { type StreamTarget, serveTaskEvents } from "../../src/http/routes/events.ts";
import { createLogger } from "../../src/log.ts";
import {
  EVENT_PAYLOAD_BYTES,
  EVENTS_CHANNEL,
  NOTIFY_MAX_BYTES,
  notifyEvents,
  PAYLOAD_WRAPPER_BYTES,
} from "../../src/queue/sql/shared.ts";
import { runClaim, runComplete } from "../../src/queue/sql.ts";
import { type Handler, Worker } from "../../src/queue/worker.ts";
import { taskCancel } from "../../src/tasks/cancel.ts";
import { bearer, startTestApp, type TestApp } from "../helpers/app.ts";
import {
  createTask,
  idsCrossPowerOfTen,
  seedUser,
  tableEvents,
  waitFor,
  waitForTerminal,
} from "../helpers/queue.ts";
import { openSse } from "../helpers/sse.ts";

let t: TestApp;
let base: string;
let token: string;
let owner: Principal;

before(async () => {
  // A long keep-alive interval: a stream that ends here ended by itself, not by a keep-alive sweep.
  t = await startTestApp({ ASSAY_SSE_HEARTBEAT_MS: "60000" });
  await t.app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
  token = await t.token("event-reader");
  owner = await seedUser(t.db.sql, "event-reader");
});
after(() => t.close());

function worker(type: string, handler: Handler): Worker {
  return new Worker({
    sql: t.db.sql,
    logger: createLogger({ level: "silent" }),
    types: { [type]: { handler } },
    concurrency: 4,
    leaseTtlMs: 30_000,
    pollIntervalMs: 100,
    retryBaseMs: 50,
  });
}

/** A test that hangs fails instead of holding up the suite. */
const LIMIT = { timeout: 30_000 };

const succeed: Handler = async () => ({ status: "succeeded" });

/** A finished task of `runs` runs whose events cross a power of ten about halfway. */
async function finishedTaskCrossing(type: string, runs = 20): Promise<string> {
  await idsCrossPowerOfTen(t.db.sql, "task_events", Math.floor(runs / 2));
  const taskId = await createTask(t.db.sql, owner, type, runs);
  const w = worker(type, succeed);
  await w.start();
  await waitForTerminal(t.db.sql, taskId);
  await w.stop();
  const events = await tableEvents(t.db.sql, taskId);
  assert.ok(events.length >= runs + 2, `${events.length} events`);
  const digits = new Set(events.map(([id]) => id.length));
  assert.equal(digits.size, 2, "the task's event ids cross a power of ten");
  return taskId;
}

const sseUrl = (taskId: string) => `${base}/api/analysis-tasks/${taskId}/events`;

describe("/logs", () => {
  test(
    "pages of 3 chained by nextCursor return every event once, in id order, across a power of ten",
    LIMIT,
    async () => {
      const taskId = await finishedTaskCrossing("ev-logs");
      const seen: string[] = [];
      let cursor: string | null = null;
      let pages = 0;
      do {
        const res: Awaited<ReturnType<typeof t.app.inject>> = await t.app.inject({
          url: `/api/analysis-tasks/${taskId}/logs?limit=3${cursor ? `&after=${cursor}` : ""}`,
          headers: bearer(token),
        });
        assert.equal(res.statusCode, 200);
        const { items, nextCursor } = res.json().data as { items: TaskEvent[]; nextCursor: string | null };
        assert.ok(items.length <= 3);
        seen.push(...items.map((e) => e.id));
        cursor = nextCursor;
        assert.ok(++pages < 100, "pagination ends");
      } while (cursor);
      assert.deepEqual(
        seen,
        (await tableEvents(t.db.sql, taskId)).map(([id]) => id),
      );
    },
  );
});

describe("SSE over a finished task", () => {
  test("a fresh stream sends every event in id order and ends", LIMIT, async () => {
    const taskId = await finishedTaskCrossing("ev-fresh");
    const s = await openSse(sseUrl(taskId), token);
    await s.ended;
    assert.deepEqual(
      s.events.map((e) => [e.id, e.event]),
      await tableEvents(t.db.sql, taskId),
    );
  });

  test("a resumed stream sends exactly the events after Last-Event-ID and ends", LIMIT, async () => {
    const taskId = await finishedTaskCrossing("ev-resume");
    const all = await tableEvents(t.db.sql, taskId);
    for (const k of [0, 3, all.length - 2]) {
      const lastEventId = all[k]?.[0] as string;
      const s = await openSse(sseUrl(taskId), token, lastEventId);
      await s.ended;
      assert.deepEqual(
        s.events.map((e) => [e.id, e.event]),
        all.slice(k + 1),
        `resumed after event #${k} (${lastEventId})`,
      );
    }
  });

  test(
    "resumed with the final event's id the stream ends at once with nothing sent; with one past every id (a restore), reset and the whole log",
    LIMIT,
    async () => {
      const taskId = await finishedTaskCrossing("ev-final", 3);
      const all = await tableEvents(t.db.sql, taskId);
      const finalId = all.at(-1)?.[0] as string;
      const s = await openSse(sseUrl(taskId), token, finalId);
      assert.equal(s.status, 200);
      await s.ended; // with a 60 s keep-alive interval, only the stream itself can end it in time
      assert.deepEqual(s.events, [], `Last-Event-ID ${finalId}`);
      for (const lastEventId of [(BigInt(finalId) + 1n).toString(), "999999999999999999"]) {
        const r = await openSse(sseUrl(taskId), token, lastEventId);
        assert.equal(r.status, 200);
        await r.ended;
        assert.equal(r.events[0]?.event, "reset", `Last-Event-ID ${lastEventId}`);
        assert.deepEqual(
          r.events.slice(1).map((e) => [e.id, e.event]),
          all,
          `Last-Event-ID ${lastEventId}`,
        );
      }
      assert.equal(t.app.services.events.size, 0, "no subscription left behind");
    },
  );
});

describe("the hub", () => {
  test(
    "catch-up after pg_terminate_backend on the LISTEN connection delivers in id order",
    LIMIT,
    async () => {
      const taskId = await finishedTaskCrossing("ev-catchup");
      const all = await tableEvents(t.db.sql, taskId);
      const hub = t.app.services.events;
      await hub.ready();
      const firstId = all[0]?.[0] as string;
      const delivered: string[] = [];
      const unsubscribe = hub.subscribe(taskId, firstId, (events) =>
        delivered.push(...events.map((e) => e.id)),
      );
      try {
        const killed = await t.db.sql`
        select pg_terminate_backend(pid) from pg_stat_activity
        where datname = current_database() and query ~* '^(un)?listen "' and pid <> pg_backend_pid()`;
        assert.ok(killed.length >= 1, "found the LISTEN connection");
        await waitFor(async () => delivered.length >= all.length - 1, 10_000, "the catch-up");
        assert.deepEqual(
          delivered,
          all.slice(1).map(([id]) => id),
        );
      } finally {
        unsubscribe();
      }
    },
  );

  /** Inserts an event straight into the table (no notification), as the hub would read it. */
  async function insertEvent(taskId: string, type: string): Promise<TaskEvent> {
    const [e] = await t.db.sql<TaskEvent[]>`
      insert into task_events (task_id, type, data) values (${taskId}, ${type}, '{}'::jsonb)
      returning id::text as id, task_id::text as "taskId", run_id::text as "runId", type, data,
                to_char(created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') as "createdAt"`;
    assert.ok(e);
    return e;
  }

  /** Kills the LISTEN connection(s) of this test database (postgres.js reconnects and re-listens). */
  async function killListener(): Promise<void> {
    const killed = await t.db.sql`
      select pg_terminate_backend(pid) from pg_stat_activity
      where datname = current_database() and query ~* '^(un)?listen "' and pid <> pg_backend_pid()`;
    assert.ok(killed.length >= 1, "found the LISTEN connection");
  }

  /** `n` more events in the task's log (1,100: more than two backlog pages). */
  async function addHistory(taskId: string, n: number): Promise<void> {
    await t.db.sql`
      insert into task_events (task_id, type, data)
      select ${taskId}, 'test.history', jsonb_build_object('n', g) from generate_series(1, ${n}) g`;
  }

  /**
   * A stream target whose client reads slowly: every frame counts as 4 KiB not yet taken (a page of 500
   * is ~2 MiB behind) until `drained`, which first runs `beforeDrain`. Ending it is fine; breaking it
   * off fails the test.
   */
  function slowReader(beforeDrain: () => Promise<void> = async () => {}) {
    let buffered = 0;
    const reader = {
      written: [] as string[],
      waits: 0,
      target: {
        write: (chunk: string) => {
          reader.written.push(/^id: (\d+)/.exec(chunk)?.[1] ?? "?");
          buffered += 4096;
          return false;
        },
        get writableLength() {
          return buffered;
        },
        close: () => {},
        destroy: () => assert.fail("broken off"),
        drained: async () => {
          reader.waits++;
          await beforeDrain();
          await new Promise((r) => setImmediate(r));
          buffered = 0;
        },
      } satisfies StreamTarget,
    };
    return reader;
  }

  test(
    "a reconnected LISTEN connection's notification that comes before onlisten does not skip the outage's events",
    LIMIT,
    async () => {
      // (Event ids are past several powers of ten by now: the tests above crossed them.)
      const taskId = await createTask(t.db.sql, owner, "ev-relisten", 1);
      const [first] = await tableEvents(t.db.sql, taskId);
      assert.ok(first);
      let notify: ((payload: string) => void) | undefined;
      let listens = 0;
      let reconnected: (() => Promise<void>) | undefined;
      // The real listener, with one thing staged: on the reconnect, before the hub's onlisten runs,
      // events are committed without a notification (as during the outage), and one more is handed
      // to the hub as PostgreSQL hands over a notification that arrived while the LISTEN ran.
      const sql = new Proxy(t.db.sql, {
        get(target, prop, receiver) {
          if (prop !== "listen") return Reflect.get(target, prop, receiver);
          return (channel: string, fn: (payload: string) => void, onlisten?: () => void) => {
            notify = fn;
            return target.listen(channel, fn, () => {
              const staged = reconnected;
              if (listens++ === 0 || !staged) return onlisten?.();
              reconnected = undefined;
              staged().then(
                () => onlisten?.(),
                (err: unknown) => console.error("staging the reconnect failed", err),
              );
            });
          };
        },
      });
      const hub = new EventHub({ sql, logger: createLogger({ level: "silent" }), sweepIntervalMs: 60_000 });
      await hub.ready();
      const delivered: string[] = [];
      const unsubscribe = hub.subscribe(taskId, first[0], (events) =>
        delivered.push(...events.map((e) => e.id)),
      );
      const expected: string[] = [];
      let staged = false;
      reconnected = async () => {
        for (let i = 0; i < 3; i++) expected.push((await insertEvent(taskId, "test.outage")).id);
        const late = await insertEvent(taskId, "test.late");
        expected.push(late.id);
        notify?.(JSON.stringify({ taskId, events: [late] }));
        staged = true;
      };
      try {
        await killListener();
        await waitFor(async () => staged, 10_000, "the reconnect");
        await waitFor(async () => delivered.length >= expected.length, 5_000, `4 events (got ${delivered})`);
        assert.deepEqual(delivered, expected);
      } finally {
        unsubscribe();
        await hub.stop();
      }
    },
  );

  test(
    "a catch-up whose read fails breaks the task's streams off instead of letting them skip what it missed",
    LIMIT,
    async () => {
      const taskId = await createTask(t.db.sql, owner, "ev-readfail", 1);
      const [first] = await tableEvents(t.db.sql, taskId);
      assert.ok(first);
      let failReads = false;
      const sql = new Proxy(t.db.sql, {
        apply(target, self, args: unknown[]) {
          const strings = args[0] as { raw?: readonly string[] } & readonly string[];
          if (failReads && strings?.raw && strings.join("").includes("from task_events e")) {
            failReads = false;
            return Promise.reject(new Error("the catch-up's read failed (test)"));
          }
          return Reflect.apply(target, self, args);
        },
      });
      const hub = new EventHub({ sql, logger: createLogger({ level: "silent" }), sweepIntervalMs: 60_000 });
      await hub.ready();
      const delivered: string[] = [];
      let ended = false;
      let failed = false;
      hub.subscribe(
        taskId,
        first[0],
        (events) => delivered.push(...events.map((e) => e.id)),
        () => {
          ended = true;
        },
        () => {
          failed = true;
        },
      );
      try {
        failReads = true;
        // A doorbell (an event too large to travel): the hub must read the table, and that read fails.
        const missed = await insertEvent(taskId, "test.missed");
        await t.db.sql`select pg_notify('assay_events', ${JSON.stringify({ taskId, eventId: missed.id })})`;
        await waitFor(async () => failed, 5_000, "the subscriber broken off");
        // The next event travels in its notification: it must not reach the subscriber, whose stream
        // would otherwise resume after it and never see the missed one.
        const next = await insertEvent(taskId, "test.next");
        const seen = hub.received.notifications;
        await t.db.sql`select pg_notify('assay_events', ${JSON.stringify({ taskId, events: [next] })})`;
        await waitFor(async () => hub.received.notifications > seen, 5_000, "the second notification");
        // Its delivery, had there been one, runs in the task's chain a turn later.
        await new Promise((resolve) => setImmediate(resolve));
        assert.deepEqual(delivered, []);
        assert.equal(ended, false, "broken off, not ended: the client must not take it for the task's end");
        assert.equal(hub.size, 0);
      } finally {
        await hub.stop();
      }
    },
  );

  test(
    "a live client more than 1 MiB behind is broken off, not ended (a graceful end would wait for it to read)",
    LIMIT,
    async () => {
      const hub = t.app.services.events;
      await hub.ready();
      const taskId = await createTask(t.db.sql, owner, "ev-behind", 1);
      let buffered = 0;
      let destroyed = false;
      const already = hub.size;
      await serveTaskEvents(
        hub,
        t.db.sql,
        taskId,
        null,
        {
          write: () => false,
          get writableLength() {
            return buffered;
          },
          close: () => assert.fail("ended gracefully"),
          destroy: () => {
            destroyed = true;
          },
        },
        new AbortController().signal,
      );
      // Live now; the client stops reading.
      buffered = 2 * 1024 * 1024;
      const next = await insertEvent(taskId, "test.live");
      await t.db.sql`select pg_notify('assay_events', ${JSON.stringify({ taskId, events: [next] })})`;
      await waitFor(async () => destroyed, 5_000, "the stream broken off");
      assert.equal(hub.size, already, "its subscription gone");
    },
  );

  test(
    "a client slower than the backlog is read is waited for between pages, not broken off",
    LIMIT,
    async () => {
      const hub = t.app.services.events;
      await hub.ready();
      const taskId = await createTask(t.db.sql, owner, "ev-slow-reader", 1);
      // More than two backlog pages.
      await addHistory(taskId, 1100);
      const all = await tableEvents(t.db.sql, taskId);
      const reader = slowReader();
      const stop = new AbortController();
      await serveTaskEvents(hub, t.db.sql, taskId, null, reader.target, stop.signal);
      stop.abort();
      assert.ok(reader.waits >= 2, `waited ${reader.waits} times`);
      assert.deepEqual(
        reader.written,
        all.map(([id]) => id),
      );
    },
  );

  test(
    "a slow but reading client of a finished task gets its end gracefully, whatever is still queued",
    LIMIT,
    async () => {
      const hub = t.app.services.events;
      await hub.ready();
      const taskId = await createTask(t.db.sql, owner, "ev-final-slow", 1);
      // History before the end: the backlog leaves output queued for the client when the end comes.
      await addHistory(taskId, 1300);
      const w = worker("ev-final-slow", succeed);
      await w.start();
      try {
        await waitForTerminal(t.db.sql, taskId);
      } finally {
        await w.stop();
      }
      const reader = slowReader();
      let closed = 0;
      reader.target.close = () => {
        closed++;
      };
      await serveTaskEvents(hub, t.db.sql, taskId, null, reader.target, new AbortController().signal);
      assert.ok(reader.target.writableLength > 0, "the end came with output queued");
      assert.equal(closed, 1, "ended gracefully (slowReader fails the test when broken off)");
      assert.equal(reader.written.length, (await tableEvents(t.db.sql, taskId)).length);
    },
  );

  test(
    "a stream ended while its backlog waits for a reader that stopped reading is broken off, and returns",
    LIMIT,
    async () => {
      const hub = t.app.services.events;
      await hub.ready();
      const taskId = await createTask(t.db.sql, owner, "ev-stalled-reader", 1);
      await addHistory(taskId, 1100);
      const already = hub.size;
      const stop = new AbortController();
      const ends: string[] = [];
      let waits = 0;
      // A reader that takes nothing: the first page leaves ~2 MiB queued, and drained never settles.
      const target: StreamTarget = {
        write: () => false,
        writableLength: 2 * 1024 * 1024,
        close: () => ends.push("close"),
        destroy: () => ends.push("destroy"),
        drained: () => {
          waits++;
          // A shutdown (or a revoke) while the stream waits.
          setImmediate(() => stop.abort());
          return new Promise<void>(() => {});
        },
      };
      await serveTaskEvents(hub, t.db.sql, taskId, null, target, stop.signal);
      assert.equal(waits, 1, "no page read after the end");
      assert.deepEqual(ends, ["destroy"], "a graceful end would wait for a client 2 MiB behind");
      assert.equal(hub.size, already, "no subscription left behind");
    },
  );

  test(
    "a doorbell during a long backlog makes the hub read from where the backlog stands, not from the start",
    LIMIT,
    async () => {
      const taskId = await createTask(t.db.sql, owner, "ev-backlog-doorbell", 1);
      await addHistory(taskId, 1100);
      const all = await tableEvents(t.db.sql, taskId);
      // Where each of the hub's reads of the table started.
      const reads: string[] = [];
      const sql = new Proxy(t.db.sql, {
        apply(target, self, args: unknown[]) {
          const strings = args[0] as { raw?: readonly string[] } & readonly string[];
          if (strings?.raw && strings.join("?").includes("and e.id >")) reads.push(String(args[1]));
          return Reflect.apply(target, self, args);
        },
      });
      const hub = new EventHub({ sql, logger: createLogger({ level: "silent" }), sweepIntervalMs: 60_000 });
      await hub.ready();
      let rang = false;
      // Where the backlog stood when the doorbell rang.
      let stood = "";
      const reader = slowReader(async () => {
        if (rang) return;
        // At the backlog's first wait for the client: an event too large to travel rings the doorbell.
        rang = true;
        stood = reader.written.at(-1) as string;
        const big = await insertEvent(taskId, "test.big");
        await t.db.sql`select pg_notify('assay_events', ${JSON.stringify({ taskId, eventId: big.id })})`;
        await waitFor(async () => reads.length > 0, 5_000, "the hub's catch-up");
      });
      const written = reader.written;
      const stop = new AbortController();
      try {
        await serveTaskEvents(hub, t.db.sql, taskId, null, reader.target, stop.signal);
        assert.ok(rang);
        assert.ok(BigInt(stood) > BigInt(all[0]?.[0] as string), "the backlog had written events");
        assert.ok(
          BigInt(reads[0] as string) >= BigInt(stood),
          `the catch-up read after ${reads[0]}, the backlog stood at ${stood}`,
        );
        const table = await tableEvents(t.db.sql, taskId);
        await waitFor(async () => written.length === table.length, 5_000, "every event");
        assert.deepEqual(
          written,
          table.map(([id]) => id),
        );
      } finally {
        stop.abort();
        await hub.stop();
      }
    },
  );

  test(
    "a start whose LISTEN failed (its callbacks kept by postgres.js) does not make notifications count twice",
    LIMIT,
    async () => {
      const taskId = await createTask(t.db.sql, owner, "ev-restart", 1);
      const [first] = await tableEvents(t.db.sql, taskId);
      assert.ok(first);
      let calls = 0;
      // As when the database is down at the first stream: postgres.js has registered the callbacks,
      // and the caller gets an error (and no unlisten).
      const sql = new Proxy(t.db.sql, {
        get(target, prop, receiver) {
          if (prop !== "listen") return Reflect.get(target, prop, receiver);
          return async (channel: string, fn: (payload: string) => void, onlisten?: () => void) => {
            const registered = await target.listen(channel, fn, onlisten);
            if (calls++ === 0) throw new Error("LISTEN failed (test)");
            return registered;
          };
        },
      });
      const hub = new EventHub({ sql, logger: createLogger({ level: "silent" }), sweepIntervalMs: 60_000 });
      await assert.rejects(hub.ready(), /LISTEN failed/);
      await hub.ready();
      const delivered: string[][] = [];
      const unsubscribe = hub.subscribe(taskId, first[0], (events) =>
        delivered.push(events.map((e) => e.id)),
      );
      try {
        const event = await insertEvent(taskId, "test.once");
        const seen = hub.received.notifications;
        await t.db.sql`select pg_notify('assay_events', ${JSON.stringify({ taskId, events: [event] })})`;
        await waitFor(async () => delivered.length > 0, 5_000, "the delivery");
        await new Promise((resolve) => setImmediate(resolve));
        assert.equal(hub.received.notifications, seen + 1, "handled once");
        assert.deepEqual(delivered, [[event.id]]);
      } finally {
        unsubscribe();
        await hub.stop();
      }
    },
  );

  test(
    "a stream resumed at a running task's latest event, which commits one while the backlog is read, is not ended",
    LIMIT,
    async () => {
      // The usual reconnect of a client of a quiet, running task. The backlog's read takes its snapshot,
      // an event commits and its notification reaches the hub before that (empty) page does: the
      // stream once took the delivered event's absence from the page for a task retention had deleted,
      // and ended cleanly — the client saw an end without the closing event, and had to come back.
      const hub = t.app.services.events;
      await hub.ready();
      const taskId = await createTask(t.db.sql, owner, "ev-resume-race", 1);
      const latest = (await tableEvents(t.db.sql, taskId)).at(-1)?.[0] as string;
      // Told of every delivery the hub makes for the task, in the same turn as the stream is.
      const heard: string[] = [];
      const probe = hub.subscribe(taskId, latest, (events) => heard.push(...events.map((e) => e.id)));
      let committed: TaskEvent | undefined;
      const sql = new Proxy(t.db.sql, {
        apply(target, self, args: unknown[]) {
          const strings = args[0] as { raw?: readonly string[] } & readonly string[];
          const read = Reflect.apply(target, self, args) as Promise<unknown>;
          if (committed || !strings?.raw || !strings.join("").includes("from task_events e")) return read;
          // The backlog's first read: its page comes back after the event's delivery.
          return read.then(async (page) => {
            committed = await insertEvent(taskId, "run.progress");
            await t.db
              .sql`select pg_notify('assay_events', ${JSON.stringify({ taskId, events: [committed] })})`;
            await waitFor(async () => heard.includes(committed?.id as string), 5_000, "the delivery");
            return page;
          });
        },
      });
      const written: string[] = [];
      const ends: string[] = [];
      const stop = new AbortController();
      try {
        await serveTaskEvents(
          hub,
          sql,
          taskId,
          latest,
          {
            write: (chunk) => {
              written.push(/^id: (\d+)/.exec(chunk)?.[1] ?? "?");
              return true;
            },
            writableLength: 0,
            close: () => ends.push("close"),
            destroy: () => ends.push("destroy"),
          },
          stop.signal,
        );
        assert.ok(committed, "the race was staged");
        assert.deepEqual(ends, [], "the stream of a running task ended");
        assert.deepEqual(written, [committed.id]);
        // And it is live.
        const next = await insertEvent(taskId, "run.progress");
        await t.db.sql`select pg_notify('assay_events', ${JSON.stringify({ taskId, events: [next] })})`;
        await waitFor(async () => written.length === 2, 5_000, "the live event");
        assert.deepEqual(written, [committed.id, next.id]);
      } finally {
        stop.abort();
        probe();
      }
    },
  );

  test(
    "a stream resumed from an id above every id (a reset, the whole log) ends with its task's closing event",
    LIMIT,
    async () => {
      let release: () => void = () => {};
      const gate = new Promise<void>((r) => {
        release = r;
      });
      const taskId = await createTask(t.db.sql, owner, "ev-outlive", 2);
      const w = worker("ev-outlive", async () => {
        await gate;
        return { status: "succeeded" };
      });
      await w.start();
      const hub = t.app.services.events;
      const s = await openSse(sseUrl(taskId), token, "999999999999999999");
      assert.equal(s.status, 200);
      assert.equal(hub.size, 1, "subscribed before the headers were sent");
      release();
      await waitForTerminal(t.db.sql, taskId);
      await w.stop();
      // Reset, then the whole log, the closing event with it: the stream ends by itself.
      await s.ended;
      assert.equal(s.events[0]?.event, "reset");
      assert.deepEqual(
        s.events.slice(1).map((e) => [e.id, e.event]),
        await tableEvents(t.db.sql, taskId),
      );
      assert.equal(hub.size, 0);
    },
  );

  test("a stream of a task that disappears (retention) ends at the next sweep", LIMIT, async () => {
    const taskId = await createTask(t.db.sql, owner, "ev-gone", 1);
    const s = await openSse(sseUrl(taskId), token);
    await s.waitFor((events) => events.length === 1);
    await t.db.sql`delete from tasks where id = ${taskId}`;
    await t.app.services.events.sweepOnce();
    await s.ended;
    assert.equal(t.app.services.events.size, 0);
  });
});

describe("SSE clients", () => {
  test("1,000 clients that connect and drop leave the hub with 0 subscribers", LIMIT, async () => {
    const taskId = await createTask(t.db.sql, owner, "ev-drop", 1); // never runs: streams stay open
    const { port } = t.app.server.address() as { port: number };
    const request =
      `GET /api/analysis-tasks/${taskId}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n` +
      `Authorization: Bearer ${token}\r\nAccept: text/event-stream\r\n\r\n`;
    const client = (i: number) =>
      new Promise<void>((resolve) => {
        const socket = net.connect(port, "127.0.0.1", () => {
          socket.write(request);
          // Drop at every stage: before the request is read, during the ownership check, while the
          // hub starts, after the headers, after the backlog.
          if (i % 4 === 0) socket.destroy();
          else if (i % 4 === 1) setImmediate(() => socket.destroy());
          else if (i % 4 === 2) setTimeout(() => socket.destroy(), i % 7);
          else socket.once("data", () => socket.destroy());
        });
        socket.on("error", () => {});
        socket.on("close", () => resolve());
      });
    for (let i = 0; i < 1000; i += 100) {
      await Promise.all(Array.from({ length: 100 }, (_, k) => client(i + k)));
    }
    const hub = t.app.services.events;
    await waitFor(async () => hub.size === 0, 10_000, `0 subscribers (have ${hub.size})`);
    await waitFor(
      async () => new Promise<boolean>((resolve) => t.app.server.getConnections((_e, n) => resolve(n === 0))),
      10_000,
      "every connection closed",
    );
  });
});

describe("HEAD on the stream", () => {
  test(
    "is 405 with Allow: GET: no subscription held, the connection free for the next request",
    LIMIT,
    async () => {
      const taskId = await createTask(t.db.sql, owner, "ev-head", 3); // never runs: a stream stays open
      const { port } = t.app.server.address() as { port: number };
      const socket = net.connect(port, "127.0.0.1");
      socket.on("error", () => {});
      let received = "";
      socket.on("data", (chunk) => {
        received += chunk.toString("latin1");
      });
      const head = (path: string) =>
        `HEAD ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${token}\r\n` +
        `Accept: text/event-stream\r\n\r\n`;
      try {
        socket.write(head(`/api/analysis-tasks/${taskId}/events`));
        await waitFor(async () => received.includes("\r\n\r\n"), 10_000, "a response head");
        assert.match(received, /^HTTP\/1\.1 405 /);
        assert.match(received, /\r\nallow: GET\r\n/i);
        assert.equal(t.app.services.events.size, 0, "no subscription held for a response without a body");
        // The connection takes the next request at once (a stream held it until the stall timer).
        received = "";
        socket.write(head(`/api/analysis-tasks/${"9".repeat(15)}/events`));
        await waitFor(async () => received.includes("\r\n\r\n"), 10_000, "a second response");
        assert.match(received, /^HTTP\/1\.1 405 /);
      } finally {
        socket.destroy();
      }
    },
  );
});

describe("createdAt", () => {
  test("a live event and the same event from the table carry the same createdAt", LIMIT, async () => {
    const taskId = await createTask(t.db.sql, owner, "ev-time", 3);
    const s = await openSse(sseUrl(taskId), token);
    await s.waitFor((events) => events.length === 1); // the backlog: task.queued
    const w = worker("ev-time", succeed);
    await w.start();
    await s.ended;
    await w.stop();
    const res = await t.app.inject({ url: `/api/analysis-tasks/${taskId}/logs`, headers: bearer(token) });
    const logged = new Map((res.json().data.items as TaskEvent[]).map((e) => [e.id, e.createdAt] as const));
    assert.ok(s.events.length >= 5);
    for (const e of s.events) {
      const createdAt = (e.data as TaskEvent).createdAt;
      assert.match(createdAt, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      assert.equal(createdAt, logged.get(e.id as string), `event ${e.id}`);
    }
  });
});

describe("a task that ends while a stream starts", () => {
  // The task ends just before one of the stream's first queries runs: the stream must still send
  // every event, the closing one included, and then end. With a doorbell (an event too large for
  // the notification) the hub has to read the table before it can deliver.
  const cases = [
    { before: "the open-task check", marker: "t.status not in", doorbell: false },
    { before: "the open-task check", marker: "t.status not in", doorbell: true },
    { before: "the backlog read", marker: "from task_events e", doorbell: false },
    { before: "the backlog read", marker: "from task_events e", doorbell: true },
  ];
  for (const c of cases) {
    test(`ended just before ${c.before}${c.doorbell ? ", announced by a doorbell" : ""}`, LIMIT, async () => {
      const hub = t.app.services.events;
      await hub.ready();
      const taskId = await createTask(t.db.sql, owner, "ev-race", 1);
      const real = t.db.sql;
      const endTask = async () => {
        if (c.doorbell) {
          // As a completion would, with an event too large to travel in the notification.
          await real.begin(async (tx) => {
            await tx`update runs set status = 'cancelled' where task_id = ${taskId}`;
            await tx`update tasks set status = 'cancelled', cancelled_count = 1, finished_at = now() where id = ${taskId}`;
            const [e] = await tx<{ id: string }[]>`
              insert into task_events (task_id, type, data)
              values (${taskId}, 'task.cancelled', ${tx.json({ status: "cancelled", pad: "x".repeat(8000) })})
              returning id::text as id`;
            await tx`select pg_notify('assay_events', ${JSON.stringify({ taskId, eventId: e?.id })})`;
          });
        } else {
          await taskCancel(real, owner, taskId);
        }
      };
      let fired = false;
      const sql = new Proxy(real, {
        apply(target, thisArg, args: unknown[]) {
          const strings = args[0] as { raw?: readonly string[] } & readonly string[];
          if (!fired && strings?.raw && strings.join("").includes(c.marker)) {
            fired = true;
            return endTask().then(() => Reflect.apply(target, thisArg, args));
          }
          return Reflect.apply(target, thisArg, args);
        },
      });
      const written: string[] = [];
      let closed: () => void = () => {};
      const ended = new Promise<void>((r) => {
        closed = r;
      });
      await serveTaskEvents(
        hub,
        sql,
        taskId,
        null,
        {
          write: (chunk) => {
            written.push(/^id: (\d+)/.exec(chunk)?.[1] ?? "?");
            return true;
          },
          writableLength: 0,
          close: () => closed(),
          destroy: () => assert.fail("the stream was broken off"),
        },
        new AbortController().signal,
      );
      await ended;
      assert.ok(fired);
      assert.deepEqual(
        written,
        (await tableEvents(t.db.sql, taskId)).map(([id]) => id),
      );
    });
  }
});

describe("the events NOTIFY", () => {
  test(
    "a batch that fits carries its events; one of more events than could fit is a doorbell naming the last",
    LIMIT,
    async () => {
      const heard: { taskId: string; events?: { id: string; type: string }[]; eventId?: string }[] = [];
      const { unlisten } = await t.db.sql.listen("assay_events", (payload) =>
        heard.push(JSON.parse(payload)),
      );
      try {
        // Cancelling ends every queued run in one statement and records them in its task.cancelling
        // event: 3 runs → 2 events. Completing 100 runs in one statement: 101 events, more than fit.
        const small = await createTask(t.db.sql, owner, "never-claimed-notify", 3);
        assert.equal((await taskCancel(t.db.sql, owner, small)).kind, "cancelling");
        const big = await createTask(t.db.sql, owner, "notify-complete-100", 100);
        const claimed = await runClaim(t.db.sql, {
          workerId: "notify-w",
          analysisType: "notify-complete-100",
          limit: 100,
          globalLimit: 0,
          leaseTtlMs: 30_000,
        });
        assert.equal(claimed.length, 100);
        const done = await runComplete(
          t.db.sql,
          claimed.map((c) => ({ id: c.id, token: c.leaseToken, status: "failed" as const })),
        );
        assert.equal(done.completed.length, 100);
        const of = (taskId: string) => heard.filter((n) => n.taskId === taskId);
        const carried = (taskId: string) => of(taskId).flatMap((n) => n.events ?? []);
        await waitFor(async () =>
          carried(small).some((e) => e.type === "task.cancelled") && of(big).some((n) => !n.events)
            ? true
            : undefined,
        );
        const smallEvents = await tableEvents(t.db.sql, small);
        assert.deepEqual(
          smallEvents.map(([, type]) => type),
          ["task.queued", "task.cancelling", "task.cancelled"],
        );
        assert.deepEqual(
          carried(small).map((e) => [e.id, e.type]),
          smallEvents.slice(1), // the helper's create does not announce task.queued
          "the small batches' payloads are their events, in order",
        );
        const bigEvents = await tableEvents(t.db.sql, big);
        assert.equal(bigEvents.filter(([, type]) => type === "run.failed").length, 100);
        assert.deepEqual(
          of(big).find((n) => !n.events),
          { taskId: big, eventId: bigEvents.at(-1)?.[0] },
          "the big one's is a doorbell",
        );
      } finally {
        await unlisten();
      }
    },
  );
});

describe("the events NOTIFY's payload size", () => {
  /** The statements' own event JSON, built by the same expression as notifyEvents(). */
  const built = (sql: typeof t.db.sql) =>
    sql`json_build_object('id', id::text, 'taskId', task_id::text, 'runId', run_id::text, 'type', type,
          'data', data, 'createdAt', ${isoTimeSql(sql, "created_at")})::text`;

  test(
    "an event's size summed from its columns is its JSON's in the payload, byte for byte",
    LIMIT,
    async () => {
      const taskId = await createTask(t.db.sql, owner, "ev-size", 1);
      // Ids past 2^31, a null run id, non-ASCII, quotes and backslashes in the data, an empty object.
      await idsCrossPowerOfTen(t.db.sql, "task_events", 10);
      await t.db.sql`
      insert into task_events (task_id, run_id, type, data)
      values (${taskId}, null, 'task.cancelling', '{}'::jsonb),
             (${taskId}, 3000000000, 'run.progress',
              jsonb_build_object('percent', 42, 'message', 'données « ü » "quoted" \\ 漢字 😀')),
             (${taskId}, 7, 'run.failed', jsonb_build_object('status', 'failed', 'attempt', 2147483648,
              'errorCode', 'ANALYSIS_DATA_INVALID', 'nested', jsonb_build_object('a', array[1, 2]), 'x', null))`;
      const rows = await t.db.sql<{ id: string; estimate: number; actual: number }[]>`
      select id::text, ${t.db.sql.unsafe(EVENT_PAYLOAD_BYTES)} - 2 as estimate,
             octet_length(${built(t.db.sql)}) as actual
      from task_events where task_id = ${taskId} order by id`;
      assert.ok(rows.length >= 4);
      for (const r of rows) assert.equal(r.estimate, r.actual, `event ${r.id}`);
      // And the task's whole payload, as notifyEvents() builds it.
      const [whole] = await t.db.sql<{ estimate: number; actual: number }[]>`
        select ${PAYLOAD_WRAPPER_BYTES} + octet_length(${taskId}::text)
                 + sum(${t.db.sql.unsafe(EVENT_PAYLOAD_BYTES)})::int as estimate,
               octet_length(json_build_object('taskId', ${taskId}::text,
                 'events', json_agg(${built(t.db.sql)}::json order by id))::text) as actual
        from task_events where task_id = ${taskId}`;
      assert.equal(whole?.estimate, whole?.actual, "the payload");
    },
  );

  test("a payload that fits travels whole, one byte more rings the doorbell", LIMIT, async () => {
    const heard: { taskId: string; events?: { id: string }[]; eventId?: string; bytes: number }[] = [];
    const { unlisten } = await t.db.sql.listen(EVENTS_CHANNEL, (payload) =>
      heard.push({ ...JSON.parse(payload), bytes: Buffer.byteLength(payload) }),
    );
    try {
      const taskId = await createTask(t.db.sql, owner, "ev-size-edge", 1);
      // One event whose data is padded to make the payload exactly NOTIFY_MAX_BYTES, then one byte
      // more: the payload is the event's JSON in a wrapper, measured from a first, unpadded event.
      const announce = (pad: string) =>
        t.db.sql<{ id: string; bytes: number }[]>`
          with events as (
            insert into task_events (task_id, run_id, type, data)
            values (${taskId}, null, 'run.progress', jsonb_build_object('message', ${pad}::text))
            returning id, task_id, run_id, type, data, created_at
          ),
          ${notifyEvents(t.db.sql)}
          select (select id::text from events) as id,
                 (select octet_length(${built(t.db.sql)}) from events) as bytes,
                 (select count(*) from notified)`;
      const [probe] = await announce("");
      await waitFor(async () => (heard.some((n) => n.events?.[0]?.id === probe?.id) ? true : undefined));
      const payloadOf = heard.find((n) => n.events?.[0]?.id === probe?.id);
      assert.ok(payloadOf && probe);
      const wrapper = payloadOf.bytes - probe.bytes;
      // Padding of n ASCII characters adds n bytes to the event.
      const fits = NOTIFY_MAX_BYTES - wrapper - probe.bytes;
      const [whole] = await announce("x".repeat(fits));
      const [over] = await announce("x".repeat(fits + 1));
      await waitFor(async () =>
        heard.some((n) => n.eventId === over?.id) && heard.some((n) => n.events?.[0]?.id === whole?.id)
          ? true
          : undefined,
      );
      const carried = heard.find((n) => n.events?.[0]?.id === whole?.id);
      assert.equal(carried?.bytes, NOTIFY_MAX_BYTES, "exactly the limit");
      assert.equal(carried?.events?.length, 1, "carried whole");
      const { bytes, ...doorbell } = heard.find((n) => n.eventId === over?.id) ?? { bytes: 0 };
      assert.deepEqual(doorbell, { taskId, eventId: over?.id }, "a doorbell");
    } finally {
      await unlisten();
    }
  });
});

describe("streams and their tokens", () => {
  /** Rejects when `stream` has not ended within 5 s. */
  const endsSoon = (stream: { ended: Promise<void> }, what: string) =>
    Promise.race([
      stream.ended,
      new Promise((_, reject) => setTimeout(() => reject(new Error(what)), 5_000)),
    ]);
  /** Whether `stream` has ended by now (its end is taken as it comes). */
  const watch = (stream: { ended: Promise<void> }) => {
    const state = { ended: false };
    void stream.ended.then(() => {
      state.ended = true;
    });
    return state;
  };

  test(
    "a revoke ends the token's live streams (not the same user's other token's); a role change ends its user's streams only",
    LIMIT,
    async () => {
      const revokee = await tokenCreate(t.db.sql, "stream-revokee");
      const other = await tokenCreate(t.db.sql, "stream-revokee");
      const bystander = await tokenCreate(t.db.sql, "stream-bystander");
      const user: Principal = { userId: revokee.userId, name: "stream-revokee", role: revokee.role };
      // Tasks nobody runs: their streams stay open until something ends them.
      const taskId = await createTask(t.db.sql, user, "ev-revoke", 1);
      const bystanderTask = await createTask(
        t.db.sql,
        { userId: bystander.userId, name: "stream-bystander", role: bystander.role },
        "ev-revoke",
        1,
      );
      const url = `${base}/api/analysis-tasks/${taskId}/events`;
      const hub = t.app.services.events;
      const already = hub.size;
      const revoked = await openSse(url, revokee.token);
      const kept = await openSse(url, other.token);
      const byStander = await openSse(`${base}/api/analysis-tasks/${bystanderTask}/events`, bystander.token);
      assert.deepEqual([revoked.status, kept.status, byStander.status], [200, 200, 200]);
      const keptState = watch(kept);
      const bystanderState = watch(byStander);
      try {
        for (const s of [revoked, kept, byStander]) await s.waitFor((events) => events.length === 1, 5_000);
        assert.equal(await tokenRevoke(t.db.sql, revokee.tokenId), true);
        await endsSoon(revoked, "the revoked token's stream went on");
        await waitFor(async () => hub.size === already + 2, 5_000, "the revoked stream's subscription gone");
        assert.equal(keptState.ended, false, "the other token's stream goes on");
        const again = await openSse(url, revokee.token);
        assert.equal(again.status, 401);
        again.close();
        // A role change: every stream's token is checked again, and the streams of the user whose
        // role changed end (what they may see has changed); the bystander's goes on.
        await tokenCreate(t.db.sql, "stream-revokee", "admin");
        await endsSoon(kept, "the stream outlived its user's role change");
        assert.equal(bystanderState.ended, false, "another user's stream goes on");
        await waitFor(async () => hub.size === already + 1, 5_000, "the ended stream's subscription gone");
      } finally {
        for (const s of [revoked, kept, byStander]) s.close();
      }
      await waitFor(async () => hub.size === already, 5_000, "no subscription left behind");
    },
  );

  test(
    "a revoke missed while the LISTEN connection was down ends the token's streams when it reconnects",
    LIMIT,
    async () => {
      const lost = await tokenCreate(t.db.sql, "stream-outage-lost");
      const fine = await tokenCreate(t.db.sql, "stream-outage-fine");
      const taskOf = (c: typeof lost, name: string) =>
        createTask(t.db.sql, { userId: c.userId, name, role: c.role }, "ev-outage-revoke", 1);
      const lostStream = await openSse(sseUrl(await taskOf(lost, "stream-outage-lost")), lost.token);
      const fineStream = await openSse(sseUrl(await taskOf(fine, "stream-outage-fine")), fine.token);
      assert.deepEqual([lostStream.status, fineStream.status], [200, 200]);
      const fineState = watch(fineStream);
      try {
        // Committed, and its notification lost (as while the connection is down).
        await t.db.sql`update api_tokens set revoked_at = now() where id = ${lost.tokenId}`;
        const killed = await t.db.sql`
          select pg_terminate_backend(pid) from pg_stat_activity
          where datname = current_database() and query ~* '^(un)?listen "' and pid <> pg_backend_pid()`;
        assert.ok(killed.length >= 1, "found the LISTEN connection");
        await endsSoon(lostStream, "the revoked token's stream outlived the reconnect");
        assert.equal(fineState.ended, false, "a live token's stream goes on across the reconnect");
        const again = await openSse(sseUrl(await taskOf(lost, "stream-outage-lost")), lost.token);
        assert.equal(again.status, 401, "the reconnect emptied the token cache");
        again.close();
      } finally {
        lostStream.close();
        fineStream.close();
      }
    },
  );

  test("streams that open while role changes are announced open, and stay open", LIMIT, async () => {
    const reader = await tokenCreate(t.db.sql, "stream-storm");
    const changing = await tokenCreate(t.db.sql, "stream-storm-changing");
    const ownedBy = (c: typeof reader, name: string) =>
      createTask(t.db.sql, { userId: c.userId, name, role: c.role }, "ev-storm", 1);
    const taskId = await ownedBy(reader, "stream-storm");
    const hub = t.app.services.events;
    const already = hub.size;
    // Other users' role changes (as `assay token create NAME --role ...` announces them), while 20
    // streams open: none of them concerns this user.
    let storming = true;
    const storm = (async () => {
      let n = 0;
      while (storming || n < 20) {
        await t.db.sql`select pg_notify('assay_tokens', '*')`;
        n++;
      }
      return n;
    })();
    const streams = await Promise.all(
      Array.from({ length: 20 }, () => openSse(sseUrl(taskId), reader.token)),
    );
    storming = false;
    const announced = await storm;
    // A stream whose user's role changes last: when it has ended, every check before has been made.
    const last = await openSse(sseUrl(await ownedBy(changing, "stream-storm-changing")), changing.token);
    try {
      assert.deepEqual(
        streams.map((s) => s.status),
        streams.map(() => 200),
        `${announced} announcements`,
      );
      assert.equal(last.status, 200);
      await waitFor(async () => hub.size === already + 21, 5_000, "21 subscriptions");
      await tokenCreate(t.db.sql, "stream-storm-changing", "admin");
      await last.ended;
      assert.equal(hub.size, already + 20, "the 20 streams are still subscribed");
    } finally {
      for (const s of [...streams, last]) s.close();
    }
  });
});
