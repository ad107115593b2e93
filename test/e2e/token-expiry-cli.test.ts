// `assay token create --expires-in <duration>`: a token that stops working by itself. A duration that is
// not one (or is past ten years) is a usage error naming the option, before the database is touched;
// `token list` shows every token's expiry and whether it has passed.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { tokenAuthenticate, tokenList } from "../../src/auth/tokens.ts";
import { cleanEnv, runCli } from "../helpers/cli.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";

let db: TestDatabase;
let dataDir: string;
before(async () => {
  db = await createTestDatabase();
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-token-exp-cli-"));
  await db.sql`select setval('api_tokens_id_seq', 9999)`;
});
after(async () => {
  await db.drop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});
const env = () => cleanEnv({ DATABASE_URL: db.url, ASSAY_DATA_DIR: dataDir });
const NAME = "Ingrid «exp» 𝔘";

test("--expires-in that is not a duration of 1m to 3650d is a usage error naming it, and nothing is written", async () => {
  // A database nothing answers at: a usage error comes before any connection.
  const nowhere = cleanEnv({ DATABASE_URL: "postgres://assay:pw@127.0.0.1:1/assay_ünï" });
  for (const value of [
    "",
    "0m",
    "0d",
    "-5m",
    "30",
    "30s",
    "2w",
    "1.5h",
    "30M",
    "1h30m",
    " 30m",
    "3651d",
    "87601h",
    "5256001m",
    "99999999999d",
    "١٢h",
    "３０m",
  ]) {
    const res = await runCli(["token", "create", "--user", NAME, `--expires-in=${value}`], nowhere);
    assert.equal(res.code, 2, `${JSON.stringify(value)}: ${res.stderr}`);
    assert.match(
      res.stderr,
      /^assay: --expires-in must be a duration of minutes, hours or days such as 30m, 12h or 90d, from 1m to 3650d; got /,
      JSON.stringify(value),
    );
    assert.equal(res.stdout, "");
  }
  // A value missing, or one that reads as an option: parseArgs's own message names it.
  for (const args of [["--expires-in"], ["--expires-in", "-5m"]]) {
    const res = await runCli(["token", "create", "--user", NAME, ...args], nowhere);
    assert.equal(res.code, 2, res.stderr);
    assert.match(res.stderr, /^assay: Option '--expires-in/);
  }
  // Only create takes it.
  const list = await runCli(["token", "list", "--expires-in", "1d"], nowhere);
  assert.equal(list.code, 2, list.stderr);
  assert.match(list.stderr, /token list does not take --expires-in/);
});

test("token create --expires-in makes a token that expires then; token list shows expiries and which have passed", async () => {
  const made = await runCli(["token", "create", "--user", NAME, "--expires-in", "90d"], env());
  assert.equal(made.code, 0, made.stderr);
  const [first, token] = made.stdout.trimEnd().split("\n");
  const m = /^token (\d+) for user (.+) \(role user, expires (\S+)\); store it now/.exec(first ?? "");
  assert.ok(m, first);
  assert.equal(m[2], NAME);
  const id = Number(m[1]);
  assert.ok(id >= 10_000);
  const expires = Date.parse(m[3] as string);
  assert.ok(Math.abs(expires - (Date.now() + 90 * 86_400_000)) < 60_000, m[3]);
  assert.equal((await tokenAuthenticate(db.sql, token as string))?.tokenId, id);
  // The longest allowed, in each unit.
  for (const value of ["3650d", "87600h", "5256000m", "1m"]) {
    const res = await runCli(["token", "create", "--user", NAME, "--expires-in", value], env());
    assert.equal(res.code, 0, `${value}: ${res.stderr}`);
  }
  // Without it: no expiry, as before.
  const forever = await runCli(["token", "create", "--user", NAME], env());
  assert.match(forever.stdout, /^token \d+ for user .+ \(role user\); store it now/);

  await db.sql`update api_tokens set expires_at = now() - interval '1 minute' where id = ${id}`;
  assert.equal(await tokenAuthenticate(db.sql, token as string), undefined, "refused once expired");
  const listed = await runCli(["token", "list"], env());
  assert.equal(listed.code, 0, listed.stderr);
  const [head, ...lines] = listed.stdout.trimEnd().split("\n");
  assert.equal(head, "id\tuser\trole\tcreated\tlast used\trevoked\texpires");
  const row = (tokenId: number) => lines.find((l) => l.split("\t")[0] === String(tokenId))?.split("\t");
  const expired = row(id);
  assert.ok(expired, listed.stdout);
  assert.match(expired[6] as string, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \(expired\)$/);
  const all = await tokenList(db.sql);
  for (const t of all.filter((t) => t.id !== id)) {
    const cells = row(t.id);
    assert.ok(cells, String(t.id));
    assert.equal(cells.length, 7);
    assert.equal(cells[6], t.expiresAt === null ? "-" : new Date(t.expiresAt).toISOString());
  }
  assert.equal(all.find((t) => t.id === id)?.expired, true);
});
