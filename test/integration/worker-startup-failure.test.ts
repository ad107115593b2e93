// A worker whose start-up fails after it registered (its LISTEN connection refused): it must not leave
// a row that GET /api/analysis-types counts as a live worker until the reaper finds it stale.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, test } from "node:test";
import postgres from "postgres";
import { createLogger } from "../../src/log.ts";
import { Worker } from "../../src/queue/worker.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.drop());

test("a start-up that fails after registering (LISTEN refused) removes the worker's row", async () => {
  // A role allowed one connection: the pool's (which registers) gets in, postgres.js's dedicated LISTEN
  // connection is refused (53300, too many connections for role) — as behind a pooler or at the
  // server's connection limit. Real connections to the real server, no stand-in.
  const role = `assay_one_conn_${randomBytes(4).toString("hex")}`;
  await db.sql`create role ${db.sql(role)} login password 'pw' connection limit 1`;
  await db.sql`grant select, insert, update, delete on all tables in schema public to ${db.sql(role)}`;
  await db.sql`grant usage on all sequences in schema public to ${db.sql(role)}`;
  const url = new URL(db.url);
  url.username = role;
  url.password = "pw";
  const sql = postgres(url.toString(), { max: 1, onnotice: () => {} });
  // Past a digit boundary, non-ASCII, quotes and a semicolon: the id is the row's key.
  const id = `wörker-"9'99;⚡:${process.pid}`;
  try {
    const w = new Worker({
      sql,
      id,
      logger: createLogger({ level: "silent" }),
      types: { "startup-type": { handler: async () => ({ status: "succeeded" as const }) } },
      concurrency: 2,
      leaseTtlMs: 60_000,
      pollIntervalMs: 100,
      retryBaseMs: 20,
    });
    await assert.rejects(w.start(), (err: Error & { code?: string }) => {
      assert.equal(err.code, "53300", String(err));
      return true;
    });
    // It did register before the LISTEN failed (the pool's connection answered) ...
    const [seen] = await db.sql`select 1 from analysis_type_seen where analysis_type = 'startup-type'`;
    assert.ok(seen, "the worker registered before its LISTEN failed");
    // ... and took its row away again when start() failed.
    const rows = await db.sql`select id from workers where id = ${id}`;
    assert.equal(rows.length, 0, "the failed worker's row is gone");
    // stop() after a failed start() neither hangs nor throws.
    await w.stop();
  } finally {
    await sql.end({ timeout: 5 });
    await db.sql`drop owned by ${db.sql(role)}`;
    await db.sql`drop role ${db.sql(role)}`;
  }
});
