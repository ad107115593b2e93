// Live events through real listening servers: order, resume, several API processes, oversized
// events, a dropped LISTEN connection.
import assert from "node:assert/strict";
import { once } from "node:events";
import net from "node:net";
import { after, before, test } from "node:test";
import { createLogger } from "../../src/log.ts";
import type { Handler } from "../../src/queue/worker.ts";
import { Worker } from "../../src/queue/worker.ts";
import { startTestApp, type TestApp } from "../helpers/app.ts";
import { cleanEnv, spawnCli, watch } from "../helpers/cli.ts";
import { createTask, waitFor } from "../helpers/queue.ts";
import { openSse } from "../helpers/sse.ts";
import { createExecutionsTable, startWorkerProcess } from "../helpers/workers.ts";

let t: TestApp;
let base: string;
let token: string;
let owner: { userId: number; name: string; role: "admin" | "user" };

before(async () => {
  t = await startTestApp({ ASSAY_SSE_HEARTBEAT_MS: "200" });
  await t.app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
  token = await t.token("viewer", "admin");
  const [u] = await t.db.sql`select id::float8 from users where name = 'viewer'`;
  owner = { userId: u?.id as number, name: "viewer", role: "admin" };
});
after(() => t.close());

/** A worker whose handler waits for `gate` (when given), reports progress and succeeds. */
function worker(type: string, handler: Handler) {
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

const tableEvents = async (taskId: string) =>
  (
    await t.db.sql`select e.id::text, e.type from task_events e where e.task_id = ${taskId} order by e.id`
  ).map((r) => [r.id, r.type]);

test("events arrive in order, with table ids, keep-alives, and the stream ends with the task", async () => {
  const taskId = await createTask(t.db.sql, owner, "sse-order", 3);
  const s = await openSse(`${base}/api/analysis-tasks/${taskId}/events`, token);
  assert.equal(s.status, 200);
  const w = worker("sse-order", async (_run, { reportProgress }) => {
    for (const p of [25, 50, 75]) {
      reportProgress(p, `at ${p}`);
      await new Promise((r) => setTimeout(r, 300));
    }
    return { status: "succeeded" };
  });
  await w.start();
  await s.ended;
  await w.stop();
  const got = s.events.map((e) => [e.id, e.event]);
  assert.deepEqual(got, await tableEvents(taskId));
  assert.equal(got.at(-1)?.[1], "task.succeeded");
  assert.ok(got.some(([, type]) => type === "run.progress"));
  assert.ok(s.comments > 0, "keep-alive comments were sent");
  const ids = got.map(([id]) => Number(id));
  assert.deepEqual(
    ids,
    [...ids].sort((a, b) => a - b),
  );
});

test("disconnect and reconnect with Last-Event-ID: nothing lost, nothing repeated", async () => {
  const taskId = await createTask(t.db.sql, owner, "sse-resume", 4);
  let release: () => void = () => {};
  const gate = new Promise<void>((r) => {
    release = r;
  });
  const w = worker("sse-resume", async (run, { reportProgress }) => {
    reportProgress(10, `run ${run.id}`);
    await gate;
    return { status: "succeeded" };
  });
  const first = await openSse(`${base}/api/analysis-tasks/${taskId}/events`, token);
  await w.start();
  await first.waitFor((events) => events.filter((e) => e.event === "run.progress").length >= 2);
  first.close();
  const last = first.events.at(-1)?.id as string;
  release();
  await waitFor(
    async () =>
      (await t.db.sql`select 1 from tasks where id = ${taskId} and status = 'succeeded'`).length > 0,
  );
  const second = await openSse(`${base}/api/analysis-tasks/${taskId}/events`, token, last);
  await second.ended;
  await w.stop();
  const all = [...first.events, ...second.events].map((e) => [e.id, e.event]);
  assert.deepEqual(all, await tableEvents(taskId));
});

test("an event larger than 7,000 bytes arrives whole (the doorbell path)", async () => {
  const taskId = await createTask(t.db.sql, owner, "sse-big", 1);
  const s = await openSse(`${base}/api/analysis-tasks/${taskId}/events`, token);
  await s.waitFor((events) => events.length >= 1); // subscribed
  const big = "x".repeat(9000);
  const w = worker("sse-big", async (_run, { reportProgress }) => {
    reportProgress(50, big);
    // Until it has been written and announced (an attempt's first progress write waits until it is
    // 250 ms old).
    await s.waitFor((events) => events.some((e) => e.event === "run.progress"));
    return { status: "succeeded" };
  });
  await w.start();
  await s.ended;
  await w.stop();
  const progress = s.events.find((e) => e.event === "run.progress");
  assert.ok(progress, "the progress event arrived");
  assert.equal((progress.data as { data: { message: string } }).data.message, big);
  const metrics = (await t.app.inject({ url: "/metrics" })).body;
  assert.match(metrics, /assay_event_notifications_total\{kind="doorbell"\} [1-9]/);
  assert.deepEqual(
    s.events.map((e) => [e.id, e.event]),
    await tableEvents(taskId),
  );
});

test("the LISTEN connection killed with pg_terminate_backend: streams keep delivering", async () => {
  const taskId = await createTask(t.db.sql, owner, "sse-drop", 2);
  let release: () => void = () => {};
  const gate = new Promise<void>((r) => {
    release = r;
  });
  const s = await openSse(`${base}/api/analysis-tasks/${taskId}/events`, token);
  await s.waitFor((events) => events.length >= 1);
  const killed = await t.db.sql`
    select pg_terminate_backend(pid) from pg_stat_activity
    where datname = current_database() and query ~* '^(un)?listen "' and pid <> pg_backend_pid()`;
  assert.ok(killed.length >= 1, "found the LISTEN connection");
  const w = worker("sse-drop", async () => {
    await gate;
    return { status: "succeeded" };
  });
  await w.start();
  release();
  await s.ended;
  await w.stop();
  assert.deepEqual(
    s.events.map((e) => [e.id, e.event]),
    await tableEvents(taskId),
  );
  assert.equal(s.events.at(-1)?.event, "task.succeeded");
});

test("a client disconnect frees its subscription", async () => {
  const taskId = await createTask(t.db.sql, owner, "sse-leave", 1);
  const hub = t.app.services.events;
  const before = hub.size;
  const streams = await Promise.all(
    [1, 2, 3].map(() => openSse(`${base}/api/analysis-tasks/${taskId}/events`, token)),
  );
  await Promise.all(streams.map((s) => s.waitFor((events) => events.length >= 1)));
  assert.equal(hub.size, before + 3);
  for (const s of streams) s.close();
  await waitFor(async () => hub.size === before, 5000, "subscriptions to be released");
});

test("foreign task → 404 before any stream; bad Last-Event-ID → 400", async () => {
  const taskId = await createTask(t.db.sql, owner, "sse-auth", 1);
  const other = await t.token("stranger");
  const res = await fetch(`${base}/api/analysis-tasks/${taskId}/events`, {
    headers: { authorization: `Bearer ${other}` },
  });
  assert.equal(res.status, 404);
  assert.equal(((await res.json()) as { code: string }).code, "ANALYSIS_TASK_NOT_FOUND");
  const bad = await fetch(`${base}/api/analysis-tasks/${taskId}/events`, {
    headers: { authorization: `Bearer ${token}`, "last-event-id": "abc" },
  });
  assert.equal(bad.status, 400);
  assert.equal((await fetch(`${base}/api/analysis-tasks/${taskId}/events`)).status, 401);
});

test("two API processes and a worker process: subscribers on both APIs see the worker's events", async () => {
  await createExecutionsTable(t.db.sql);
  const apis = [0, 1].map(() =>
    spawnCli(
      ["api"],
      cleanEnv({ DATABASE_URL: t.db.url, PORT: "0", LOG_LEVEL: "info", ASSAY_SSE_HEARTBEAT_MS: "500" }),
    ),
  );
  try {
    const addresses = await Promise.all(
      apis.map(
        async (p) => (await watch(p).waitFor(/Server listening at (http:\/\/127\.0\.0\.1:\d+)/))[1] as string,
      ),
    );
    const taskId = await createTask(t.db.sql, owner, "sse-multi", 5);
    const streams = await Promise.all(
      addresses.map((a) => openSse(`${a}/api/analysis-tasks/${taskId}/events`, token)),
    );
    const w = await startWorkerProcess(t.db.url, {
      types: { "sse-multi": { sleepMs: 50 } },
      concurrency: 2,
      leaseTtlMs: 30_000,
      reapIntervalMs: 1000,
    });
    await Promise.all(streams.map((s) => s.ended));
    w.child.kill("SIGTERM");
    await w.exited;
    const expected = await tableEvents(taskId);
    for (const s of streams)
      assert.deepEqual(
        s.events.map((e) => [e.id, e.event]),
        expected,
      );
    assert.equal(expected.filter(([, type]) => type === "run.succeeded").length, 5);
  } finally {
    for (const p of apis) p.kill("SIGTERM");
  }
});

test("the hub's own sweep ends a stream whose task went without a closing event (no sweepOnce call)", async () => {
  const taskId = await createTask(t.db.sql, owner, "sse-sweep", 1);
  const s = await openSse(`${base}/api/analysis-tasks/${taskId}/events`, token);
  assert.equal(s.status, 200);
  await s.waitFor((events) => events.length >= 1);
  // Deleted under it (retention): no closing event comes, only the sweep can end it.
  await t.db.sql`delete from tasks where id = ${taskId}`;
  await s.ended; // the keep-alive interval here is 200 ms, and so is the sweep's
  assert.deepEqual(
    s.events.map((e) => e.event),
    ["task.queued"],
  );
});

test("a client that stops reading is cut off once it has taken no byte for ASSAY_SSE_STALL_MS; a quiet stream is not", async () => {
  // Without it such a client kept its socket, a megabyte of buffered events and (while the task
  // lived) its subscription for as long as it liked: a few hundred of them could exhaust the API.
  const s = await startTestApp({ ASSAY_SSE_HEARTBEAT_MS: "200", ASSAY_SSE_STALL_MS: "1000" });
  try {
    await s.app.listen({ host: "127.0.0.1", port: 0 });
    const port = (s.app.server.address() as { port: number }).port;
    const bearer = await s.token("stall", "admin");
    const [u] = await s.db.sql`select id::float8 from users where name = 'stall'`;
    const me = { userId: u?.id as number, name: "stall", role: "admin" as const };
    const connections = () =>
      new Promise<number>((resolve, reject) =>
        s.app.server.getConnections((err, n) => (err ? reject(err) : resolve(n))),
      );

    // A quiet stream whose client reads stays open well past the stall time: its keep-alives are taken.
    const quietTask = await createTask(s.db.sql, me, "sse-stall-quiet", 1);
    const quiet = await openSse(`http://127.0.0.1:${port}/api/analysis-tasks/${quietTask}/events`, bearer);
    assert.equal(quiet.status, 200);
    // Twelve keep-alives (2.4 s) on one stream: cut off at 1 s, it would have ended with fewer.
    await waitFor(async () => (quiet.comments >= 12 ? true : undefined), 15_000);
    quiet.close();
    await waitFor(async () => ((await connections()) === 0 ? true : undefined), 10_000);

    // A backlog far larger than the socket buffers, for a client that never reads.
    const taskId = await createTask(s.db.sql, me, "sse-stall", 1);
    await s.db.sql`
      insert into task_events (task_id, type, data)
      select ${taskId}, 'run.progress', jsonb_build_object('message', repeat('x', 1000), 'n', g)
      from generate_series(1, 30000) g`;
    const socket = net.connect(port, "127.0.0.1");
    await once(socket, "connect");
    socket.on("error", () => {});
    const closed = once(socket, "close");
    socket.write(
      `GET /api/analysis-tasks/${taskId}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${bearer}\r\nAccept: text/event-stream\r\n\r\n`,
    );
    socket.pause();
    await waitFor(async () => ((await connections()) === 1 ? true : undefined));
    // The server gives up on it: the connection is gone, server side.
    await waitFor(async () => ((await connections()) === 0 ? true : undefined), 15_000);
    socket.resume();
    await closed;
  } finally {
    await s.close();
  }
});
