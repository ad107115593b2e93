// An upgrade with real processes: `assay migrate` on a busy database, and processes started against a
// schema older than their code (not migrated yet: refused, saying so) or newer (a newer release
// migrated it while this one still runs, the rolling upgrade's other half: they keep working).
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import postgres from "postgres";
import { cleanEnv, collect, exitWithin as exitWithinMs, runCli, spawnCli, watch } from "../helpers/cli.ts";
import { createTestDatabase, createTestDatabaseBefore, type TestDatabase } from "../helpers/db.ts";

/** The migration left pending: an ALTER TABLE on api_tokens, which every token check reads. */
const PENDING = "0014_api_tokens_expires_at";
/** Well above a failed start's own time: a process still running then did not refuse. */
const EXIT_BOUND_MS = 20_000;

let home: string;
before(() => {
  home = fs.mkdtempSync(path.join(os.tmpdir(), "assay-upgrade-"));
});
after(() => fs.rmSync(home, { recursive: true, force: true }));

const databaseBefore = (tag: string) => createTestDatabaseBefore(tag, home);

function serverEnv(db: TestDatabase, extra: Record<string, string> = {}) {
  return cleanEnv({
    DATABASE_URL: db.url,
    ASSAY_DATA_DIR: fs.mkdtempSync(path.join(home, "data-")),
    PORT: "0",
    LOG_LEVEL: "info",
    ...extra,
  });
}

const exitWithin = (child: ChildProcess, what: string) => exitWithinMs(child, EXIT_BOUND_MS, what);

const notMigrated = new RegExp(
  `the database is not migrated to this version: it lacks \\d+ of this release's migrations \\(${PENDING}[^)]*\\): run \`assay migrate\``,
);

test("a schema older than the code: the worker and a dev token refuse at start-up (exit 1, naming what is missing); the API waits, 503, until migrated", async () => {
  const db = await databaseBefore(PENDING);
  try {
    for (const args of [["worker"], ["all"], ["api", "--dev-token"]]) {
      const exit = await exitWithin(spawnCli(args, serverEnv(db)), `assay ${args.join(" ")}`);
      assert.equal(exit.code, 1, `${args}: ${exit.stderr}`);
      assert.match(exit.stderr, notMigrated, args.join(" "));
      assert.doesNotMatch(exit.stdout, /worker started|Server listening/, args.join(" "));
    }
    // `assay token` too: the cause, not a missing column's raw 42703.
    const token = await runCli(
      ["token", "create", "--user", "too-early"],
      cleanEnv({ DATABASE_URL: db.url }),
    );
    assert.equal(token.code, 1, token.stderr);
    assert.match(token.stderr, notMigrated);
    assert.doesNotMatch(token.stderr, /42703|does not exist/);

    // The API listens (a migration run as a separate step may come after it starts), says why it is
    // not ready, and is ready once `assay migrate` has run, without a restart.
    const api = spawnCli(["api"], serverEnv(db));
    const out = watch(api);
    const done = collect(api);
    try {
      const [, port] = await out.waitFor(/Server listening at http:\/\/127\.0\.0\.1:(\d+)/, 20_000);
      await out.waitFor(/is not migrated to this version.*\/readyz answers 503 until then/, 20_000);
      const ready = async () => {
        const res = await fetch(`http://127.0.0.1:${port}/readyz`);
        return { status: res.status, body: (await res.json()) as { message: string } };
      };
      const before = await ready();
      assert.equal(before.status, 503);
      assert.equal(before.body.message, "The database is not migrated.");
      // A request a balancer sends it anyway: its token check names the column 0014 adds. A 503 the
      // client may retry, saying why, not a bug's 500.
      const early = await fetch(`http://127.0.0.1:${port}/api/me`, {
        headers: { authorization: `Bearer assay_${"x".repeat(43)}` },
      });
      assert.equal(early.status, 503);
      assert.deepEqual(await early.json(), {
        code: "NOT_READY",
        message: "The database is not migrated to this version.",
      });
      const migrated = await runCli(["migrate"], cleanEnv({ DATABASE_URL: db.url }));
      assert.equal(migrated.code, 0, migrated.stderr);
      assert.match(migrated.stdout, /^applied \d+ migrations?: the database has all \d+$/m);
      assert.equal((await ready()).status, 200);
    } finally {
      api.kill("SIGTERM");
    }
    assert.equal((await done).code, 0);
  } finally {
    await db.drop();
  }
});

test("a schema newer than the code (an additive migration of a newer release): assay all starts and a task runs", async () => {
  const db = await createTestDatabase();
  try {
    // What a newer release's migration may do: add a column, a table, an index; and record itself.
    await db.sql`alter table runs add column newer_release_note text`;
    await db.sql`create table newer_release_table (id bigserial primary key)`;
    await db.sql`
      insert into drizzle.__drizzle_migrations (hash, created_at)
      values ('a newer release', (select max(created_at) + 1000 from drizzle.__drizzle_migrations))`;
    const env = serverEnv(db);
    const server = spawnCli(["all", "--concurrency", "2"], env);
    const out = watch(server);
    const done = collect(server);
    try {
      const [, port] = await out.waitFor(/Server listening at http:\/\/127\.0\.0\.1:(\d+)/, 20_000);
      await out.waitFor(/the database has migrations newer than this release/, 20_000);
      await out.waitFor(/worker started/, 20_000);
      const ready = await fetch(`http://127.0.0.1:${port}/readyz`);
      assert.equal(ready.status, 200);
      const created = await runCli(["token", "create", "--user", "upgrader"], env);
      assert.equal(created.code, 0, created.stderr);
      const token = created.stdout.trim().split("\n").at(-1) ?? "";
      const input = path.join(home, "newer.csv");
      fs.writeFileSync(input, "a,b\n1,2\n3,4\n");
      const submitted = await runCli(
        ["submit", "--type", "summary", input, "--follow", "--json"],
        cleanEnv({ ASSAY_URL: `http://127.0.0.1:${port}`, ASSAY_TOKEN: token }),
      );
      assert.equal(submitted.code, 0, submitted.stdout + submitted.stderr);
      assert.match(submitted.stdout, /"status":"succeeded"/);
    } finally {
      server.kill("SIGTERM");
    }
    assert.equal((await done).code, 0);
  } finally {
    await db.drop();
  }
});

test("assay migrate behind a long transaction: each attempt waits --lock-timeout, says who holds it up, and gives up after --retry-for (exit 1); applied once it ends", async () => {
  const db = await databaseBefore(PENDING);
  const holder = postgres(db.url, {
    max: 1,
    onnotice: () => {},
    connection: { application_name: "nightly-report" },
  });
  let release = () => {};
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  let pid = 0;
  let opened = () => {};
  const open = new Promise<void>((resolve) => {
    opened = resolve;
  });
  const held = holder.begin(async (tx) => {
    const [row] = await tx<{ pid: number }[]>`select pg_backend_pid() as pid, count(*) from api_tokens`;
    pid = row?.pid as number;
    opened();
    await released;
  });
  try {
    await open;
    const env = cleanEnv({ DATABASE_URL: db.url });
    const bad = await runCli(["migrate", "--lock-timeout", "soon"], env);
    assert.equal(bad.code, 2, bad.stderr);
    assert.match(bad.stderr, /--lock-timeout must be a number of seconds/);

    const res = await runCli(["migrate", "--lock-timeout", "0.3", "--retry-for", "2"], env);
    assert.equal(res.code, 1, res.stdout + res.stderr);
    assert.equal(res.stdout, "");
    assert.match(
      res.stderr,
      new RegExp(
        `^assay migrate: attempt 1 \\(${PENDING}\\) waited 0\\.3 s for a lock and was rolled back; transactions open longer: pid ${pid} \\(nightly-report, idle in transaction, \\d+ s\\); trying again in \\d\\.\\d s$`,
        "m",
      ),
    );
    assert.match(
      res.stderr,
      new RegExp(`assay: could not apply migration ${PENDING}: .*pid ${pid} \\(nightly-report`),
    );
    assert.match(res.stderr, /canceling statement due to lock timeout \(SQLSTATE 55P03\)/);
    const [col] = await db.sql`
      select count(*)::int as n from information_schema.columns
      where table_name = 'api_tokens' and column_name = 'expires_at'`;
    assert.equal(col?.n, 0, "nothing applied");

    release();
    await held;
    const again = await runCli(["migrate"], env);
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stdout, /^applied \d+ migrations?: the database has all \d+$/m);
  } finally {
    release();
    await held.catch(() => {});
    await holder.end({ timeout: 5 });
    await db.drop();
  }
});
