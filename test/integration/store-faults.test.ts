// Retention, the store sweep and uploads under faults: a store that fails once, a key that looks like
// the service's own but is not, an insert whose answer is lost after its commit (a real PostgreSQL
// behind a TCP proxy that cuts the connection there).
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createDatabase } from "../../src/db/client.ts";
import { fileCreate } from "../../src/files/files.ts";
import { createLogger } from "../../src/log.ts";
import { Retention } from "../../src/queue/retention.ts";
import { runClaim, runComplete } from "../../src/queue/sql.ts";
import { StoreSweep } from "../../src/queue/store-sweep.ts";
import { LocalStore } from "../../src/storage/local.ts";
import type { ObjectStore } from "../../src/storage/store.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser } from "../helpers/queue.ts";

let db: TestDatabase;
let owner: Principal;
const roots: string[] = [];
const logger = createLogger({ level: "silent" });
const newRoot = () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-store-faults-"));
  roots.push(dir);
  return dir;
};

before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "store-faults");
});
after(async () => {
  await db.drop();
  for (const dir of roots) fs.rmSync(dir, { recursive: true, force: true });
});

const put = (store: ObjectStore, key: string) => store.put(key, Readable.from([Buffer.from(key)]));
const keys = async (store: ObjectStore, prefix: string) => (await store.list(prefix)).map((o) => o.key);

/** A task of one succeeded run with one output object, finished `daysAgo`. */
async function finished(store: ObjectStore, type: string, daysAgo: number): Promise<string> {
  const taskId = await createTask(db.sql, owner, type, 1);
  const [run] = await runClaim(db.sql, {
    workerId: "w",
    analysisType: type,
    limit: 1,
    globalLimit: 0,
    leaseTtlMs: 30_000,
  });
  assert.ok(run);
  const outputKey = `${taskId}/${run.id}.${run.attempt}.${run.leaseToken}`;
  await put(store, `outputs/${outputKey}/out.json`);
  await runComplete(db.sql, [{ id: run.id, token: run.leaseToken, status: "succeeded", outputKey }]);
  await db.sql`update tasks set finished_at = now() - ${daysAgo} * interval '1 day' where id = ${taskId}`;
  return taskId;
}

test("retention: a store that fails one task's deletion still deletes the other tasks of the batch", async () => {
  const base = new LocalStore(newRoot());
  const tasks: string[] = [];
  for (let i = 0; i < 3; i++) tasks.push(await finished(base, `faults-fail-${i}`, 40 + i));
  // The first task's deletion fails, once (a 503 from a bucket, a disk error).
  const store: ObjectStore = Object.create(base);
  const failed: string[] = [];
  store.deletePrefix = async (prefix) => {
    if (failed.length === 0) {
      failed.push(prefix);
      throw new Error("the store failed once");
    }
    return base.deletePrefix(prefix);
  };
  const retention = new Retention({ sql: db.sql, logger, store, retentionDays: 30, intervalMs: 60_000 });
  await assert.rejects(retention.runOnce(), /the store failed once/);
  assert.equal(failed.length, 1);
  assert.equal((await db.sql`select 1 from tasks where id = any(${tasks}::bigint[])`).length, 0);
  // The rows are gone: nothing but the sweep (a day later, when its walk gets there) would find these
  // objects again, so the failure of one must not leave the others'.
  const left = (await keys(base, "outputs/")).map((k) => `outputs/${k.split("/")[1]}/`);
  assert.deepEqual(left, failed, "only the task whose deletion failed keeps its objects");
});

test("the sweep: an output key whose token is not a UUID is left alone, and the page's orphans still go", async () => {
  const store = new LocalStore(newRoot());
  const taskId = await createTask(db.sql, owner, "faults-odd", 1);
  const [run] = await db.sql<{ id: string }[]>`select id::text as id from runs where task_id = ${taskId}`;
  assert.ok(run);
  // The service's shape but for the token, under a run that exists: 36 hex digits, where a UUID has
  // 32 and four dashes.
  const odd = `outputs/${taskId}/${run.id}.1.${"0123456789abcdef".repeat(2)}0123/out.json`;
  const orphan = `outputs/${taskId}/${run.id}.1.00000000-0000-4000-8000-000000000000/out.json`;
  const orphanFile = "files/424242";
  for (const key of [odd, orphan, orphanFile]) await put(store, key);
  const sweep = new StoreSweep({ sql: db.sql, logger, store, intervalMs: 60_000, minAgeMs: 0 });
  // Two passes: the first starts at a random key (possibly past these).
  await sweep.runOnce();
  await sweep.runOnce();
  assert.deepEqual(await keys(store, "outputs/"), [odd]);
  assert.deepEqual(await keys(store, "files/"), []);
});

/**
 * A TCP proxy in front of PostgreSQL that cuts the connection instead of passing on the server's
 * answer to an INSERT: the statement has committed (PostgreSQL sends its answer with the ReadyForQuery
 * that follows the commit), and the client sees only a lost connection.
 */
async function cutAfterInsert(target: URL): Promise<{ url: string; cuts: () => number; close(): void }> {
  let cuts = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => {});
      s.on("close", () => sockets.delete(s));
    }
    client.pipe(upstream);
    upstream.on("data", (chunk: Buffer) => {
      if (chunk.includes("INSERT 0 1\0")) {
        cuts++;
        client.destroy();
        upstream.destroy();
      } else client.write(chunk);
    });
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = new URL(target);
  url.hostname = "127.0.0.1";
  url.port = String((server.address() as net.AddressInfo).port);
  return {
    url: url.toString(),
    cuts: () => cuts,
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

test("an upload whose insert committed but whose answer was lost keeps its bytes: a row never names a missing object", async () => {
  const store = new LocalStore(newRoot());
  const proxy = await cutAfterInsert(new URL(db.url));
  const cut = createDatabase(proxy.url, { max: 1 });
  try {
    await assert.rejects(
      fileCreate(cut.sql, store, owner, Readable.from([Buffer.from("a,b\n1,2\n")]), {
        name: "lost.csv",
        contentType: "text/csv",
        maxBytes: 1024,
      }),
    );
    assert.equal(proxy.cuts(), 1);
    const [row] = await db.sql<
      { key: string }[]
    >`select storage_key as key from files where name = 'lost.csv'`;
    assert.ok(row, "the insert committed");
    // The row is there: its bytes must be too (a task over this file would fail for good without them).
    assert.equal((await store.open(row.key)).size, 8);
  } finally {
    await cut.sql.end({ timeout: 0 }).catch(() => {});
    proxy.close();
  }
});

test("an upload whose insert the server refuses leaves no object", async () => {
  const store = new LocalStore(newRoot());
  // No such user: the foreign key refuses the row.
  const ghost: Principal = { userId: 2 ** 40, name: "ghost", role: "user" };
  await assert.rejects(
    fileCreate(db.sql, store, ghost, Readable.from([Buffer.from("x\n")]), {
      name: "refused.csv",
      contentType: "text/csv",
      maxBytes: 1024,
    }),
    /foreign key/,
  );
  assert.deepEqual(await keys(store, "files/"), []);
});
