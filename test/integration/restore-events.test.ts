// Event ids after the database is restored from an older backup. The restore takes `task_events` and
// its id sequence back to the backup, so the ids a client saw after it are handed out again, to new
// events: a client resuming by Last-Event-ID (the dashboard, `assay follow`) was sent only the events
// whose ids had passed the one it held — every event in between, the task's closing event too, was
// lost for it, silently. A Last-Event-ID (or a log's `after`) that names none of the task's events now
// says so: the stream sends a `reset` frame and the whole log; the log answers 400.
//
// The restore is the table's state after one, made in SQL: the events written after the "backup"
// deleted and the sequence set back to where the backup had it (what pg_restore of a dump, a base
// backup or a volume snapshot leaves; checked by hand with pg_dump/pg_restore, see
// docs/operations.md "Backup and restore").
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { ApiClient } from "../../src/client/http.ts";
import { TaskTracker } from "../../src/client/progress.ts";
import { taskEvents } from "../../src/client/sse.ts";
import { bearer, startTestApp, type TestApp } from "../helpers/app.ts";
import { createTask, seedUser, tableEvents } from "../helpers/queue.ts";
import { openSse, type SseEvent } from "../helpers/sse.ts";

let t: TestApp;
let base: string;
let token: string;
let owner: Principal;

before(async () => {
  // A long keep-alive interval: a stream ends here by itself, never by the hub's sweep.
  t = await startTestApp({ ASSAY_SSE_HEARTBEAT_MS: "60000" });
  await t.app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
  token = await t.token("restore-reader");
  owner = await seedUser(t.db.sql, "restore-reader");
});
after(() => t.close());

const LIMIT = { timeout: 60_000 };
const sseUrl = (taskId: string) => `${base}/api/analysis-tasks/${taskId}/events`;

/** Appends an event and announces it, as the queue's statements do. */
async function emit(taskId: string, type: string): Promise<string> {
  const [e] = await t.db.sql<{ id: string }[]>`
    insert into task_events (task_id, type, data) values (${taskId}, ${type}, '{}'::jsonb) returning id::text`;
  assert.ok(e);
  const [event] = await t.db.sql`
    select e.id::text as id, e.task_id::text as "taskId", e.run_id::text as "runId", e.type, e.data,
           to_char(e.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') as "createdAt"
    from task_events e where e.id = ${e.id}`;
  await t.db.sql`select pg_notify('assay_events', ${JSON.stringify({ taskId, events: [event] })})`;
  return e.id;
}

/** The id sequence's position: what a backup taken now holds. */
async function backup(): Promise<string> {
  const [row] = await t.db.sql<{ last: string }[]>`select last_value::text as last from task_events_id_seq`;
  return row?.last as string;
}

/** The events table as a restore of that backup leaves it: later events gone, the sequence set back. */
async function restore(at: string): Promise<void> {
  await t.db.sql`delete from task_events where id > ${at}`;
  await t.db.sql`select setval('task_events_id_seq', ${at})`;
}

const ids = (events: SseEvent[]) => events.map((e) => [e.id, e.event]);

test(
  "resumed after a restore with an id the database no longer has: a reset, then the whole log, then live events",
  LIMIT,
  async () => {
    const taskId = await createTask(t.db.sql, owner, "restore-ev", 2);
    await emit(taskId, "run.running");
    const backedUp = await backup();
    // After the backup: the client reads these, then the database is lost.
    for (const type of ["run.progress", "run.progress", "run.progress", "run.progress", "run.progress"])
      await emit(taskId, type);
    const first = await openSse(sseUrl(taskId), token);
    const seen = (await tableEvents(t.db.sql, taskId)).length;
    await first.waitFor((events) => events.length === seen);
    first.close();
    const held = first.events.at(-1)?.id as string;

    await restore(backedUp);
    // The restored installation goes on: its new events get the ids the client already saw.
    const redone = await emit(taskId, "run.running");
    assert.ok(BigInt(redone) <= BigInt(held), `id ${redone} handed out again (client holds ${held})`);

    const s = await openSse(sseUrl(taskId), token, held);
    assert.equal(s.status, 200);
    const table = await tableEvents(t.db.sql, taskId);
    // Without the fix: nothing until the ids pass `held`, every event in between lost.
    await s.waitFor((events) => events.length === table.length + 1, 10_000);
    const [reset, ...log] = s.events;
    assert.equal(reset?.event, "reset");
    assert.equal(reset?.id, "", "the reset frame clears the client's id");
    assert.deepEqual(reset?.data, {
      reason: "LAST_EVENT_ID_UNKNOWN",
      lastEventId: held,
      message: `Event ${held} is not in this task's log (was the database restored from a backup?): the whole log follows, from its first event.`,
    });
    assert.deepEqual(ids(log), table, "the whole log, in order");

    // Live from there, ids still below the one the client held, up to the closing event.
    const live = await emit(taskId, "run.succeeded");
    const closing = await emit(taskId, "task.succeeded");
    assert.ok(BigInt(closing) <= BigInt(held));
    await s.ended;
    assert.deepEqual(ids(s.events.slice(-2)), [
      [live, "run.succeeded"],
      [closing, "task.succeeded"],
    ]);

    // The log's cursor the same way: refused, said why, rather than an empty page.
    const res = await t.app.inject({
      url: `/api/analysis-tasks/${taskId}/logs?after=${held}`,
      headers: bearer(token),
    });
    assert.equal(res.statusCode, 400);
    assert.equal(res.json().code, "VALIDATION_FAILED");
    assert.match(
      res.json().message,
      new RegExp(`${held} is none \\(was the database restored from a backup\\?\\)`),
    );
    // An id of the task's own (one the restored database wrote) is a cursor as before.
    const ok = await t.app.inject({
      url: `/api/analysis-tasks/${taskId}/logs?after=${redone}`,
      headers: bearer(token),
    });
    assert.equal(ok.statusCode, 200);
    assert.deepEqual(
      ok.json().data.items.map((e: { id: string; type: string }) => [e.id, e.type]),
      [
        [live, "run.succeeded"],
        [closing, "task.succeeded"],
      ],
    );
  },
);

test(
  "an id the restored database has handed out again, to another task, is no resume point either",
  LIMIT,
  async () => {
    const taskId = await createTask(t.db.sql, owner, "restore-ev-other", 1);
    const backedUp = await backup();
    for (let i = 0; i < 3; i++) await emit(taskId, "run.progress");
    const held = (await tableEvents(t.db.sql, taskId)).at(-1)?.[0] as string;
    await restore(backedUp);
    // Another task's events pass the id the client holds before it reconnects.
    const other = await createTask(t.db.sql, owner, "restore-ev-busy", 1);
    while (BigInt(await emit(other, "run.progress")) <= BigInt(held));
    assert.deepEqual((await t.db.sql`select task_id::text from task_events where id = ${held}`)[0], {
      task_id: other,
    });
    await emit(taskId, "run.running");
    await emit(taskId, "task.failed");
    const s = await openSse(sseUrl(taskId), token, held);
    await s.ended;
    assert.equal(s.events[0]?.event, "reset");
    assert.deepEqual(ids(s.events.slice(1)), await tableEvents(t.db.sql, taskId));
  },
);

test("a resume from one of the task's own events, or from 0, is as before: no reset", LIMIT, async () => {
  const taskId = await createTask(t.db.sql, owner, "restore-ev-plain", 1);
  await emit(taskId, "run.running");
  await emit(taskId, "run.succeeded");
  await emit(taskId, "task.succeeded");
  const table = await tableEvents(t.db.sql, taskId);
  for (const [k, from] of [
    [0, table[0]?.[0]],
    [1, table[1]?.[0]],
    [-1, "0"],
  ] as const) {
    const s = await openSse(sseUrl(taskId), token, from);
    await s.ended;
    assert.deepEqual(ids(s.events), table.slice(k + 1), `resumed from ${from}`);
  }
  const res = await t.app.inject({
    url: `/api/analysis-tasks/${taskId}/logs?after=0`,
    headers: bearer(token),
  });
  assert.equal(res.json().data.items.length, table.length);
});

test(
  "the CLI's follow, resumed from an id the restored database no longer has: told of the reset, then every event once, counted from nothing",
  LIMIT,
  async () => {
    const taskId = await createTask(t.db.sql, owner, "restore-ev-cli", 2);
    const runs = await t.db.sql<
      { id: string }[]
    >`select id::text from runs where task_id = ${taskId} order by id`;
    const backedUp = await backup();
    // More events than the restored installation writes below: the id held is not handed out again
    // to this task (that one case no server can tell; operations.md's restore moves the sequences on).
    for (let i = 0; i < 6; i++) await emit(taskId, "run.progress");
    const held = (await tableEvents(t.db.sql, taskId)).at(-1)?.[0] as string;
    await restore(backedUp);
    // The restored installation runs the task again: a retry, then both runs succeed.
    const runEvent = async (runId: string, type: string, data: object) => {
      await t.db.sql`
        insert into task_events (task_id, run_id, type, data) values (${taskId}, ${runId}, ${type}, ${t.db.sql.json(data as never)})`;
    };
    const [a, b] = runs.map((r) => r.id) as [string, string];
    await runEvent(a, "run.succeeded", { attempt: 1 });
    await runEvent(b, "run.retry", { attempt: 1, errorCode: "ANALYSIS_DEPENDENCY_FAILED" });
    await runEvent(b, "run.succeeded", { attempt: 2 });
    await emit(taskId, "task.succeeded");

    const client = new ApiClient(base, token);
    const tracker = new TaskTracker(
      taskId,
      2,
      runs.map((r) => ({ runId: r.id, fileName: `f${r.id}` })),
    );
    // What the client made of the events before the restore: one run already counted.
    tracker.apply({ id: held, taskId, runId: b, type: "run.succeeded", data: {}, createdAt: "" });
    const states: string[] = [];
    const seen: string[] = [];
    for await (const e of taskEvents(client, taskId, {
      signal: AbortSignal.timeout(20_000),
      after: held,
      onState: (state) => {
        states.push(state);
        if (state === "reset") tracker.reset();
      },
    })) {
      seen.push(e.id);
      tracker.apply(e);
    }
    assert.deepEqual(states, ["reset"]);
    assert.deepEqual(
      seen,
      (await tableEvents(t.db.sql, taskId)).map(([id]) => id),
      "the whole log, each event once",
    );
    assert.deepEqual(tracker.counts, { succeeded: 2, failed: 0, timed_out: 0, cancelled: 0 });
  },
);
