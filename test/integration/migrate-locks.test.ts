// The migrator on a busy database: each statement waits at most lock_timeout for a table's lock (an
// ALTER TABLE queued behind a long transaction held every query on that table behind it, for as long as
// that transaction lasted), rolls back and tries again, and in the end gives up saying who held it up;
// migrators started together are serialised by the advisory lock, whose wait lock_timeout does not cut.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import postgres from "postgres";
import {
  expectedMigrationCount,
  MIGRATIONS_DIR,
  MigrationLockError,
  type MigrationWait,
  runMigrations,
} from "../../src/db/migrate.ts";
import { createTestDatabaseBefore, type TestDatabase } from "../helpers/db.ts";

/** The migration these tests leave pending: an ALTER TABLE on api_tokens (and what follows it). */
const PENDING = "0014_api_tokens_expires_at";

let scratch: string;
before(() => {
  scratch = fs.mkdtempSync(path.join(os.tmpdir(), "assay-migrate-locks-"));
});
after(() => fs.rmSync(scratch, { recursive: true, force: true }));

const databaseBefore = (tag: string) => createTestDatabaseBefore(tag, scratch);

/** A transaction that has read api_tokens (ACCESS SHARE) and stays open until release() or `ms`. */
async function holdTokensTable(url: string, ms: number) {
  const sql = postgres(url, { max: 1, onnotice: () => {}, connection: { application_name: "test-holder" } });
  let release = () => {};
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  const timer = setTimeout(release, ms);
  let pid = 0;
  let ended: Promise<void> | undefined;
  let opened = () => {};
  const open = new Promise<void>((resolve) => {
    opened = resolve;
  });
  const done = sql
    .begin(async (tx) => {
      const [row] = await tx<{ pid: number }[]>`select pg_backend_pid() as pid, count(*) from api_tokens`;
      pid = row?.pid as number;
      opened();
      await released;
    })
    .finally(() => clearTimeout(timer));
  await open;
  return {
    pid,
    release: () => {
      release();
      ended ??= done.then(() => sql.end({ timeout: 5 }));
      return ended;
    },
  };
}

async function hasExpiresAt(db: TestDatabase): Promise<boolean> {
  const [row] = await db.sql`
    select count(*)::int as n from information_schema.columns
    where table_name = 'api_tokens' and column_name = 'expires_at'`;
  return row?.n === 1;
}

/** Polls `check` every 20 ms until it is true, failing after `ms`. */
async function until(check: () => Promise<boolean> | boolean, what: string, ms = 20_000): Promise<void> {
  const deadline = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

test("behind a long transaction, reads of the table wait at most lock_timeout, and the migration is applied when it ends", async () => {
  const db = await databaseBefore(PENDING);
  // Without lock_timeout the read below waits for the whole hold: 8 s.
  const holder = await holdTokensTable(db.url, 8_000);
  try {
    const waits: MigrationWait[] = [];
    const migrating = runMigrations(db.url, {
      lockTimeoutMs: 500,
      retryForMs: 60_000,
      onWait: (w) => waits.push(w),
    });
    // The ALTER TABLE is queued behind the holder (or has already timed out once).
    await until(async () => {
      if (waits.length > 0) return true;
      const [row] = await db.sql`
        select count(*)::int as n from pg_stat_activity
        where application_name = 'assay-migrate' and wait_event_type = 'Lock'`;
      return row?.n === 1;
    }, "the migration to wait for the lock");
    // A token check's read, as the API makes one: queued behind the ALTER TABLE, at most its timeout.
    const started = performance.now();
    await db.sql`select count(*) from api_tokens`;
    const readMs = performance.now() - started;
    assert.ok(readMs < 2_500, `a read of api_tokens waited ${Math.round(readMs)} ms behind the migration`);
    await until(() => waits.length >= 2, "a second attempt");
    assert.equal(await hasExpiresAt(db), false, "a timed-out attempt leaves nothing applied");
    assert.equal(waits[0]?.migration, PENDING);
    assert.deepEqual(
      waits.map((w) => w.attempt),
      waits.map((_, i) => i + 1),
    );
    assert.ok(
      waits.some((w) => w.holders.some((h) => h.pid === holder.pid && h.applicationName === "test-holder")),
      JSON.stringify(waits),
    );
    await holder.release();
    const counts = await migrating;
    assert.equal(counts.after, expectedMigrationCount());
    assert.equal(await hasExpiresAt(db), true);
  } finally {
    await holder.release();
    await db.drop();
  }
});

test("a migrator whose connection is made again between attempts keeps its lock_timeout and takes its advisory lock again", async () => {
  const db = await databaseBefore(PENDING);
  const holder = await holdTokensTable(db.url, 8_000);
  try {
    const waits: MigrationWait[] = [];
    let dropped: Promise<unknown> | undefined;
    const migrating = runMigrations(db.url, {
      lockTimeoutMs: 500,
      retryForMs: 60_000,
      onWait: (w) => {
        waits.push(w);
        // What postgres.js's connection lifetime, a network blip or a restart does to it, idle between
        // two attempts.
        dropped ??= db.sql`
          select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'assay-migrate'`;
      },
    });
    await until(() => waits.length >= 1, "a first attempt that waited");
    await dropped;
    // The attempt after the drop: on a new connection, waiting for the table again.
    await until(async () => {
      const [row] = await db.sql`
        select count(*)::int as n from pg_stat_activity
        where application_name = 'assay-migrate' and wait_event_type = 'Lock'`;
      return row?.n === 1 || waits.length >= 2;
    }, "an attempt on the new connection");
    const [locks] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from pg_locks l join pg_stat_activity a using (pid)
      where a.application_name = 'assay-migrate' and l.locktype = 'advisory' and l.granted`;
    assert.equal(locks?.n, 1, "the new connection holds the migrators' advisory lock");
    const started = performance.now();
    await db.sql`select count(*) from api_tokens`;
    const readMs = performance.now() - started;
    assert.ok(readMs < 2_500, `a read of api_tokens waited ${Math.round(readMs)} ms behind the migration`);
    await holder.release();
    assert.equal((await migrating).after, expectedMigrationCount());
  } finally {
    await holder.release();
    await db.drop();
  }
});

test("a transaction that outlasts the retries: MigrationLockError naming its session, nothing applied", async () => {
  const db = await databaseBefore(PENDING);
  const holder = await holdTokensTable(db.url, 15_000);
  try {
    const before = await db.sql<{ n: number }[]>`select count(*)::int as n from drizzle.__drizzle_migrations`;
    await assert.rejects(runMigrations(db.url, { lockTimeoutMs: 200, retryForMs: 1_500 }), (err: Error) => {
      assert.ok(err instanceof MigrationLockError, String(err));
      assert.match(err.message, new RegExp(`could not apply migration ${PENDING}`));
      assert.match(
        err.message,
        new RegExp(`pid ${holder.pid} \\(test-holder, idle in transaction, \\d+ s\\)`),
      );
      assert.match(err.message, /nothing was applied/);
      // drizzle's error, and PostgreSQL's own under it: the lock timeout.
      assert.equal((err.cause as { cause?: { code?: string } } | undefined)?.cause?.code, "55P03");
      return true;
    });
    const afterRows = await db.sql<
      { n: number }[]
    >`select count(*)::int as n from drizzle.__drizzle_migrations`;
    assert.equal(afterRows[0]?.n, before[0]?.n);
    assert.equal(await hasExpiresAt(db), false);
  } finally {
    await holder.release();
    await db.drop();
  }
});

test("two migrators at once: the second waits for the first, past lock_timeout, and applies nothing", async () => {
  const db = await databaseBefore(PENDING);
  // The first migrator retries behind the holder for a while, holding the advisory lock meanwhile: the
  // second waits for it longer than its own lock_timeout, which must not cut that wait.
  const holder = await holdTokensTable(db.url, 10_000);
  try {
    const firstWaits: MigrationWait[] = [];
    const first = runMigrations(db.url, {
      lockTimeoutMs: 200,
      retryForMs: 60_000,
      onWait: (w) => firstWaits.push(w),
    });
    await until(() => firstWaits.length >= 1, "the first migrator's first timed-out attempt");
    const second = runMigrations(db.url, { lockTimeoutMs: 200, retryForMs: 0 });
    await until(async () => {
      const [row] = await db.sql`
        select count(*)::int as n from pg_stat_activity
        where application_name = 'assay-migrate' and wait_event = 'advisory'`;
      return row?.n === 1;
    }, "the second migrator to wait for the advisory lock");
    await until(() => firstWaits.length >= 3, "more attempts of the first, the second still waiting");
    await holder.release();
    const [a, b] = await Promise.all([first, second]);
    const all = expectedMigrationCount();
    const pendingAt = JSON.parse(
      fs.readFileSync(path.join(MIGRATIONS_DIR, "meta", "_journal.json"), "utf8"),
    ).entries.findIndex((e: { tag: string }) => e.tag === PENDING);
    assert.deepEqual(a, { before: pendingAt, after: all });
    assert.deepEqual(b, { before: all, after: all });
    const [rows] = await db.sql<{ n: number }[]>`select count(*)::int as n from drizzle.__drizzle_migrations`;
    assert.equal(rows?.n, all);
  } finally {
    await holder.release();
    await db.drop();
  }
});
