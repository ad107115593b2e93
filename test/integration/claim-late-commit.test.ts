// A claim whose connection broke while the server was still running it commits later, after the
// worker's first look for runs a failed claim had taken (adoptOrphans()). Here the claim waits on a
// lock the test holds on the type's queue_owners rows (as one would behind a big create's), a TCP
// proxy in front of the database drops every connection of the worker meanwhile, and the lock is let
// go only after that first look has found nothing: the claim then commits on a backend whose client
// is gone. The worker's later looks must find its runs and run them, not leave them leased until the
// reaper fails them at their one attempt.
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { after, before, test } from "node:test";
import { createDatabase } from "../../src/db/client.ts";
import { createLogger } from "../../src/log.ts";
import { Reaper } from "../../src/queue/reaper.ts";
import { Worker } from "../../src/queue/worker.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import {
  createTask,
  idsCrossPowerOfTen,
  seedUser,
  taskRow,
  waitFor,
  waitForTerminal,
} from "../helpers/queue.ts";
import { startTcpProxy } from "../helpers/tcp-proxy.ts";

let db: TestDatabase;
const APP = "assay-late-claim";
const TYPE = "late-claim-ü";

before(async () => {
  db = await createTestDatabase();
  await idsCrossPowerOfTen(db.sql, "runs", 2);
});
after(async () => {
  await db.drop();
});

test("a claim that commits after the worker's first look for orphans: its runs are found by a later look and run once, at their one attempt", async () => {
  const a = await seedUser(db.sql, "late «a»");
  const b = await seedUser(db.sql, "late 'b'; --");
  // Two owners waiting: the fair claim, which locks their queue_owners rows (the sole owner's
  // claim takes no lock it could wait on). Created before the worker listens: no newcomer claims.
  const tasks = [
    await createTask(db.sql, a, TYPE, 2, { maxAttempts: 1 }),
    await createTask(db.sql, b, TYPE, 2, { maxAttempts: 1 }),
  ];

  const proxy = await startTcpProxy(db.url);
  const pool = createDatabase(proxy.url, { max: 4, applicationName: APP });
  const lines: { msg: string }[] = [];
  const logger = createLogger({
    level: "debug",
    destination: new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const line of chunk.toString().split("\n")) if (line) lines.push(JSON.parse(line));
        done();
      },
    }),
  });
  const executed: number[] = [];
  const w = new Worker({
    sql: pool.sql,
    logger,
    types: {
      [TYPE]: {
        handler: async (run) => {
          executed.push(run.id);
          return { status: "succeeded" };
        },
      },
    },
    concurrency: 4,
    leaseTtlMs: 2000,
    pollIntervalMs: 100,
    retryBaseMs: 20,
  });
  const reaper = new Reaper({
    sql: db.sql,
    logger: createLogger({ level: "silent" }),
    intervalMs: 100,
    leaseTtlMs: 2000,
    retryBaseMs: 20,
    workerWaitMs: 60_000,
  });

  let release: () => void = () => {};
  const released = new Promise<void>((r) => {
    release = r;
  });
  let locked: () => void = () => {};
  const isLocked = new Promise<void>((r) => {
    locked = r;
  });
  const holder = db.sql.begin(async (tx) => {
    await tx`select 1 from queue_owners where analysis_type = ${TYPE} for update`;
    locked();
    await released;
  });
  try {
    await isLocked;
    await w.start();
    reaper.start();
    // The worker's claim waits on the lock.
    await waitFor(
      async () =>
        (
          await db.sql`select 1 from pg_stat_activity
            where application_name = ${APP} and wait_event_type = 'Lock' and state = 'active'`
        ).length > 0,
      10_000,
      "the worker's claim to wait on the lock",
    );
    assert.ok(proxy.dropAll() > 0, "the worker's connections were dropped");
    // The claim failed on the worker's side; its backend still waits. The first look finds nothing.
    await waitFor(
      async () => lines.some((l) => l.msg === "looked for runs a failed claim had taken: none"),
      10_000,
      "the worker's first look for orphans",
    );
    release();
    await holder;
    for (const id of tasks) await waitForTerminal(db.sql, id, 30_000);
    const runs = await db.sql<{ status: string; error_code: string | null; attempt: number }[]>`
      select status, error_code, attempt from runs where task_id = any(${tasks.map(Number)}::bigint[]) order by id`;
    assert.deepEqual(
      runs.map((r) => ({ ...r })),
      Array.from({ length: 4 }, () => ({ status: "succeeded", error_code: null, attempt: 1 })),
      "every run ran at its one attempt",
    );
    assert.equal(new Set(executed).size, 4, "four runs executed");
    assert.equal(executed.length, 4, "each once");
    assert.ok(
      lines.some((l) => l.msg.startsWith("runs a failed claim had taken")),
      "a later look adopted the late claim's runs",
    );
    for (const id of tasks) {
      const t = await taskRow(db.sql, id);
      assert.deepEqual([t.status, t.succeeded, t.total], ["succeeded", 2, 2]);
    }
  } finally {
    release();
    await holder.catch(() => {});
    await reaper.stop();
    await w.stop();
    await pool.close();
    await proxy.close();
  }
});
