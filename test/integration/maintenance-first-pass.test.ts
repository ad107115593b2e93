// Retention and the store sweep run their first pass soon after start, not a (jittered) interval —
// an hour by default — later: a worker restarted more often than that, or one that lives for a batch,
// otherwise never ran them. And stop() still ends a pass at its next step.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { Retention } from "../../src/queue/retention.ts";
import { FIRST_PASS_WITHIN_MS } from "../../src/queue/service.ts";
import { StoreSweep } from "../../src/queue/store-sweep.ts";
import { LocalStore } from "../../src/storage/local.ts";
import type { ObjectStore } from "../../src/storage/store.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser, waitFor } from "../helpers/queue.ts";

let db: TestDatabase;
let owner: Principal;
const logger = createLogger({ level: "silent" });
const HOUR = 3_600_000;
const dirs: string[] = [];
const tmp = () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-first-pass-"));
  dirs.push(dir);
  return dir;
};
before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "first-pass");
});
after(async () => {
  await db.drop();
  for (const dir of dirs) fs.rmSync(dir, { recursive: true, force: true });
});

test("by default the first pass comes within FIRST_PASS_WITHIN_MS (a minute) of start, the next an interval later", async (t) => {
  assert.equal(FIRST_PASS_WITHIN_MS, 60_000);
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const store = new LocalStore(tmp());
  const services = [
    new Retention({ sql: db.sql, logger, store, retentionDays: 30, intervalMs: HOUR }),
    new StoreSweep({ sql: db.sql, logger, store, intervalMs: HOUR }),
  ];
  const passes = services.map(() => 0);
  services.forEach((s, i) => {
    // Only when its passes come is at stake here.
    s.runOnce = async () => {
      passes[i] = (passes[i] ?? 0) + 1;
      return 0;
    };
    s.start();
  });
  const settle = async () => {
    for (let i = 0; i < 10; i++) await Promise.resolve();
  };
  t.mock.timers.tick(FIRST_PASS_WITHIN_MS);
  await settle();
  assert.deepEqual(passes, [1, 1], "the first pass came within a minute of start");
  // The next comes a jittered interval (±20%) later, not a minute.
  t.mock.timers.tick(0.8 * HOUR - FIRST_PASS_WITHIN_MS - 1);
  await settle();
  assert.deepEqual(passes, [1, 1]);
  t.mock.timers.tick(0.4 * HOUR + FIRST_PASS_WITHIN_MS + 1);
  await settle();
  assert.deepEqual(passes, [2, 2]);
  await Promise.all(services.map((s) => s.stop()));
  t.mock.timers.tick(2 * HOUR);
  await settle();
  assert.deepEqual(passes, [2, 2], "no pass after stop()");
});

test("the first pass really runs soon after start with an interval of an hour: the expired task and the orphan go", async () => {
  const store = new LocalStore(tmp());
  // An old finished task for retention, and an upload no row references for the sweep.
  const old = await createTask(db.sql, owner, "first-pass", 1);
  await db.sql`update runs set status = 'cancelled', finished_at = now() where task_id = ${old}`;
  await db.sql`
    update tasks set status = 'cancelled', cancelled_count = total_count, finished_at = now() - interval '40 days'
    where id = ${old}`;
  const orphan = "files/999999999999";
  await store.put(orphan, Readable.from([Buffer.from("x")]));
  const retention = new Retention({
    sql: db.sql,
    logger,
    store,
    retentionDays: 30,
    intervalMs: HOUR,
    firstPassWithinMs: 100,
  });
  const sweep = new StoreSweep({
    sql: db.sql,
    logger,
    store,
    intervalMs: HOUR,
    minAgeMs: 0,
    firstPassWithinMs: 100,
  });
  retention.start();
  sweep.start();
  try {
    await waitFor(
      async () => (await db.sql`select 1 from tasks where id = ${old}`).length === 0,
      20_000,
      "retention's first pass",
    );
    await waitFor(
      async () => !(await store.list("files/")).some((o) => o.key === orphan),
      20_000,
      "the sweep's first pass",
    );
  } finally {
    await Promise.all([retention.stop(), sweep.stop()]);
  }
});

test("stop() during a sweep's pass ends it at the next step: the prefixes after the one in progress are left", async () => {
  const base = new LocalStore(tmp());
  const listed: string[] = [];
  let listing: () => void = () => {};
  const inList = new Promise<void>((r) => (listing = r));
  let release: () => void = () => {};
  const released = new Promise<void>((r) => (release = r));
  const store: ObjectStore = Object.create(base);
  store.list = async (prefix, o) => {
    listed.push(prefix);
    listing();
    await released;
    return base.list(prefix, o);
  };
  const sweep = new StoreSweep({
    sql: db.sql,
    logger,
    store,
    intervalMs: HOUR,
    minAgeMs: 0,
    firstPassWithinMs: 0,
  });
  sweep.start();
  await inList;
  const stopped = sweep.stop();
  release();
  await stopped;
  assert.deepEqual(listed, ["files/"]);
});
