import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { expectedMigrationCount } from "../../src/db/migrate.ts";
import { cleanEnv, collect, runCli, spawnCli, watch } from "../helpers/cli.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";

let db: TestDatabase;
let dataDir: string;
before(async () => {
  db = await createTestDatabase();
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-cli-"));
});
after(async () => {
  await db.drop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});
const env = (extra: Record<string, string> = {}) =>
  cleanEnv({ DATABASE_URL: db.url, ASSAY_DATA_DIR: dataDir, ...extra });

describe("help", { concurrency: true }, () => {
  for (const args of [
    ["--help"],
    ["api", "--help"],
    ["worker", "--help"],
    ["all", "--help"],
    ["migrate", "--help"],
    ["token", "--help"],
    ["token", "create", "--help"],
    ["config", "--help"],
  ]) {
    test(`assay ${args.join(" ")} prints usage and exits 0, even with a broken config`, async () => {
      const res = await runCli(args, cleanEnv({ PORT: "nope" }));
      assert.equal(res.code, 0, res.stderr);
      assert.match(res.stdout, /Usage:/);
    });
  }

  test("no command → usage on stdout, exit 2; unknown command → exit 2", async () => {
    assert.equal((await runCli([], cleanEnv())).code, 2);
    const res = await runCli(["frobnicate"], cleanEnv());
    assert.equal(res.code, 2);
    assert.match(res.stderr, /unknown command: frobnicate/);
  });

  test("`assay config` prints the settings table", async () => {
    const res = await runCli(["config"], cleanEnv());
    assert.equal(res.code, 0);
    assert.match(res.stdout, /\| `ASSAY_MAX_UPLOAD_BYTES` \| `104857600` \|/);
  });

  test("`assay config --values` prints the values in effect, masks secrets, names unread variables", async () => {
    const secretEnv = cleanEnv({
      DATABASE_URL: "postgres://assay:pa55word@db.internal:5432/assay",
      PORT: "8080",
      ASSAY_SHUTDOWN_GRACE: "5",
    });
    const res = await runCli(["config", "--values"], secretEnv);
    assert.equal(res.code, 0, res.stderr);
    assert.match(
      res.stdout,
      /^DATABASE_URL +postgres:\/\/assay:\*\*\*@db\.internal:5432\/assay +environment$/m,
    );
    assert.match(res.stdout, /^PORT +8080 +environment$/m);
    assert.match(res.stdout, /^HOST +127\.0\.0\.1 +default$/m);
    assert.doesNotMatch(res.stdout + res.stderr, /pa55word/);
    assert.match(
      res.stderr,
      /ASSAY_SHUTDOWN_GRACE is set but nothing reads it \(did you mean ASSAY_SHUTDOWN_GRACE_MS\?\)/,
    );
    const json = await runCli(["config", "--values", "--json"], secretEnv);
    assert.equal(json.code, 0, json.stderr);
    const parsed = JSON.parse(json.stdout) as Record<
      string,
      { value: unknown; masked: boolean; from: string }
    >;
    assert.deepEqual(parsed.PORT, { value: 8080, masked: false, from: "environment" });
    assert.equal(parsed.DATABASE_URL?.masked, true);
    const bad = await runCli(["config", "--values"], cleanEnv({ PORT: "x" }));
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /PORT="x"/);
    assert.equal((await runCli(["config", "--json"], cleanEnv())).code, 2);
    assert.equal((await runCli(["config", "--valeus"], cleanEnv())).code, 2);
  });
});

describe("configuration errors", () => {
  test("invalid config → exit 2 with one line per bad field", async () => {
    const res = await runCli(["api"], cleanEnv({ PORT: "x", LOG_LEVEL: "loud" }));
    assert.equal(res.code, 2);
    const lines = res.stderr.trim().split("\n");
    assert.equal(lines[0], "invalid configuration:");
    assert.deepEqual(
      lines.slice(1).map((l) => l.trim()),
      [
        'PORT="x": must be integer',
        'LOG_LEVEL="loud": must be one of fatal, error, warn, info, debug, trace, silent',
      ],
    );
  });

  test("a bad option → exit 2 with the reason", async () => {
    const res = await runCli(["worker", "--concurrency", "0"], env());
    assert.equal(res.code, 2);
    assert.match(res.stderr, /--concurrency must be an integer/);
  });
});

describe("migrate", () => {
  test("applies migrations to an empty database, and again is a no-op", async () => {
    const empty = await createTestDatabase();
    try {
      await empty.sql`drop schema public cascade`;
      await empty.sql`drop schema drizzle cascade`;
      await empty.sql`create schema public`;
      const first = await runCli(["migrate"], cleanEnv({ DATABASE_URL: empty.url }));
      assert.equal(first.code, 0, first.stderr);
      const all = expectedMigrationCount();
      assert.equal(first.stdout.trim(), `applied ${all} migrations: the database has all ${all}`);
      const [row] = await empty.sql`select to_regclass('public.files') is not null as ok`;
      assert.equal(row?.ok, true);
      const again = await runCli(["migrate"], cleanEnv({ DATABASE_URL: empty.url }));
      assert.equal(again.code, 0, again.stderr);
      assert.equal(again.stdout.trim(), `nothing to apply: the database has all ${all} migrations`);
      // A newer release migrated it further (a rolling deploy, or this one rolled back): left alone,
      // and said so — "applied" hid that nothing was.
      await empty.sql`
        insert into drizzle.__drizzle_migrations (hash, created_at)
        values ('from a newer release', (select max(created_at) + 1 from drizzle.__drizzle_migrations))`;
      const newer = await runCli(["migrate"], cleanEnv({ DATABASE_URL: empty.url }));
      assert.equal(newer.code, 0, newer.stderr);
      assert.equal(
        newer.stdout.trim(),
        `nothing applied: the database has ${all + 1} migrations, more than this release's ${all} (a newer release migrated it)`,
      );
    } finally {
      await empty.drop();
    }
  });

  test("a migration PostgreSQL refuses → exit 1 with PostgreSQL's own error and its SQLSTATE", async () => {
    const clash = await createTestDatabase();
    try {
      await clash.sql`drop schema public cascade`;
      await clash.sql`drop schema drizzle cascade`;
      await clash.sql`create schema public`;
      // Another application's table where the first migration creates Assay's.
      await clash.sql`create table users (x int)`;
      const res = await runCli(["migrate"], cleanEnv({ DATABASE_URL: clash.url }));
      assert.equal(res.code, 1, res.stderr);
      assert.match(res.stderr, /Failed query:/);
      assert.match(res.stderr, /caused by: relation "users" already exists \(SQLSTATE 42P07\)/);
    } finally {
      await clash.drop();
    }
  });

  test("an unreachable database → non-zero exit with the cause", async () => {
    const res = await runCli(["migrate"], cleanEnv({ DATABASE_URL: "postgres://x:y@127.0.0.1:1/none" }));
    assert.notEqual(res.code, 0);
    assert.match(res.stderr, /ECONNREFUSED|connect/i);
  });
});

describe("token", () => {
  test("create prints the token as the last stdout line; it authenticates; list hides it; revoke disables it", async () => {
    const created = await runCli(["token", "create", "--user", "gina", "--role", "admin"], env());
    assert.equal(created.code, 0, created.stderr);
    const token = created.stdout.trim().split("\n").at(-1) ?? "";
    assert.match(token, /^assay_[A-Za-z0-9_-]{43}$/);

    const listed = await runCli(["token", "list"], env());
    assert.equal(listed.code, 0, listed.stderr);
    assert.match(listed.stdout, /\tgina\tadmin\t/);
    assert.ok(!listed.stdout.includes(token));
    const id = /^(\d+)\tgina/m.exec(listed.stdout)?.[1];
    assert.ok(id);

    const server = spawnCli(["api"], env({ PORT: "0", LOG_LEVEL: "info" }));
    const out = watch(server);
    const done = collect(server);
    try {
      const [, port] = await out.waitFor(/Server listening at http:\/\/127\.0\.0\.1:(\d+)/);
      const get = (t: string) =>
        fetch(`http://127.0.0.1:${port}/api/files/1`, { headers: { authorization: `Bearer ${t}` } });
      assert.equal((await get(token)).status, 404, "a valid token reaches the handler");
      const revoked = await runCli(["token", "revoke", id], env());
      assert.equal(revoked.code, 0, revoked.stderr);
      // The revoke reaches the API's token cache by a notification, on a connection of its own: a
      // request on another may come first by a few milliseconds (it did under load). Well within the
      // cache's lifetime (TOKEN_CACHE_TTL_MS, 5 s), and never a second 404 once it came.
      const deadline = Date.now() + 2_000;
      let status = (await get(token)).status;
      while (status === 404 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 20));
        status = (await get(token)).status;
      }
      assert.equal(status, 401);
      assert.equal((await get(token)).status, 401);
    } finally {
      server.kill("SIGTERM");
    }
    const exit = await done;
    assert.equal(exit.code, 0, exit.stderr);
    assert.ok(!exit.stdout.includes(token), "the token never appears in the server's logs");
  });

  test("bad arguments → exit 2", async () => {
    assert.equal((await runCli(["token", "create"], env())).code, 2);
    assert.equal((await runCli(["token", "create", "--user", "x", "--role", "root"], env())).code, 2);
    assert.equal((await runCli(["token", "revoke", "abc"], env())).code, 2);
    const missing = await runCli(["token", "revoke", "987654"], env());
    assert.equal(missing.code, 1);
    assert.match(missing.stderr, /no live token/);
  });
});
