// `assay token` refuses what a subcommand does not take, and names that break its own output, before
// touching the database: ignored, `token revoke 5 6` revoked 5 only and exited 0.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { tokenCreate, tokenList } from "../../src/auth/tokens.ts";
import { cleanEnv, runCli } from "../helpers/cli.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";

let db: TestDatabase;
let dataDir: string;
before(async () => {
  db = await createTestDatabase();
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-token-cli-"));
});
after(async () => {
  await db.drop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});
const env = () => cleanEnv({ DATABASE_URL: db.url, ASSAY_DATA_DIR: dataDir });

test("token revoke with two ids is a usage error and revokes neither", async () => {
  const a = await tokenCreate(db.sql, "Åsa");
  const b = await tokenCreate(db.sql, "Åsa");
  const res = await runCli(["token", "revoke", String(a.tokenId), String(b.tokenId)], env());
  assert.equal(res.code, 2, res.stderr);
  assert.match(res.stderr, /^assay: too many arguments; usage: assay token revoke <id>/);
  assert.equal(res.stdout, "");
  const live = (await tokenList(db.sql)).filter((t) => t.revokedAt === null).map((t) => t.id);
  assert.ok(live.includes(a.tokenId) && live.includes(b.tokenId), "neither token was revoked");
  // One at a time works.
  assert.equal((await runCli(["token", "revoke", String(b.tokenId)], env())).code, 0);
});

test("an option or argument a subcommand does not take is a usage error, and nothing is written", async () => {
  const earlier = await tokenList(db.sql);
  for (const [args, message] of [
    [["token", "list", "--user", "Åsa"], /token list does not take --user/],
    [["token", "list", "extra"], /too many arguments; usage: assay token list$/m],
    [["token", "revoke", "--role", "admin", "10001"], /token revoke does not take --role/],
    [["token", "create", "--user", "bjørn", "--role", "admin", "bjørn2"], /too many arguments/],
  ] as const) {
    const res = await runCli([...args], env());
    assert.equal(res.code, 2, `${args.join(" ")}: ${res.stderr}`);
    assert.match(res.stderr, message, args.join(" "));
    assert.equal(res.stdout, "", args.join(" "));
  }
  assert.deepEqual(await tokenList(db.sql), earlier, "no token created or revoked");
  const [users] = await db.sql`select count(*)::int as n from users where name like 'bjørn%'`;
  assert.equal(users?.n, 0);
});

test("a user name with a control character or a line break is refused; other Unicode is kept", async () => {
  for (const name of [
    "tab\there",
    "two\nlines",
    "cr\rname",
    "soh\u0001x",
    "del\u007fx",
    "c1\u0085x",
    "ls\u2028x",
  ]) {
    const res = await runCli(["token", "create", "--user", name], env());
    assert.equal(res.code, 2, JSON.stringify(name));
    assert.match(res.stderr, /--user must not contain control characters or line breaks/);
    assert.equal(res.stdout, "");
  }
  const [users] = await db.sql`select count(*)::int as n from users where name ~ '[[:cntrl:]]'`;
  assert.equal(users?.n, 0);

  const name = "Zoë «ops» 李";
  const created = await runCli(["token", "create", "--user", name], env());
  assert.equal(created.code, 0, created.stderr);
  const listed = await runCli(["token", "list"], env());
  assert.equal(listed.code, 0, listed.stderr);
  const line = listed.stdout.split("\n").find((l) => l.split("\t")[1] === name);
  assert.ok(line, listed.stdout);
  assert.equal(line.split("\t").length, 7, "one row, seven columns");
});

test("token commands against a database `assay migrate` has not set up say to run it, and write nothing", async () => {
  const empty = await createTestDatabase();
  try {
    await empty.sql`drop schema public cascade`;
    await empty.sql`drop schema drizzle cascade`;
    await empty.sql`create schema public`;
    const unmigrated = cleanEnv({ DATABASE_URL: empty.url, ASSAY_DATA_DIR: dataDir });
    for (const args of [["create", "--user", "Ōtani"], ["list"], ["revoke", "10000"]]) {
      const res = await runCli(["token", ...args], unmigrated);
      assert.equal(res.code, 1, `${args.join(" ")}: ${res.stderr}`);
      // Before: only `relation "users" does not exist`, on the first command of a new installation.
      assert.match(
        res.stderr,
        /^assay: the database is not migrated to this version: run `assay migrate` first\n {2}caused by: relation "[a-z_]+" does not exist \(SQLSTATE 42P01\)/,
        args.join(" "),
      );
      assert.equal(res.stdout, "", args.join(" "));
    }
    const [tables] = await empty.sql`select count(*)::int as n from pg_tables where schemaname = 'public'`;
    assert.equal(tables?.n, 0);
  } finally {
    await empty.drop();
  }
});

test("--user takes up to 100 characters, counted as characters: 𩸽 or 𠮷 is one, not two", async () => {
  const longest = `𩸽${"𠮷".repeat(98)}野`; // 100 characters, 199 UTF-16 units
  const created = await runCli(["token", "create", "--user", longest], env());
  assert.equal(created.code, 0, created.stderr);
  assert.equal((await tokenList(db.sql)).filter((t) => t.user === longest).length, 1);
  const over = await runCli(["token", "create", "--user", `${longest}x`], env());
  assert.equal(over.code, 2, over.stderr);
  assert.match(over.stderr, /^assay: --user must be at most 100 characters$/m);
  assert.equal(over.stdout, "");
});
