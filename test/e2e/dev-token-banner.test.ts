// `assay api --dev-token`'s banner: every URL it prints (the address, the docs, the dashboard link, the
// curl example) is one a user on this machine can open, whatever HOST is. With HOST=:: it printed
// `http://:::PORT/…`, no URL at all; a listen-on-all address (`0.0.0.0`, `::`) is no address to connect to.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { linkHost } from "../../src/cli/serve.ts";
import { cleanEnv, collect, ROOT, spawnCli, watch } from "../helpers/cli.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";

let db: TestDatabase;
let dataDir: string;
before(async () => {
  db = await createTestDatabase();
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-banner-"));
});
after(async () => {
  await db.drop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

test("the --dev-token banner prints working URLs for IPv6 and listen-on-all HOSTs", async () => {
  for (const [host, shown] of [
    ["::", "[::1]"],
    ["::1", "[::1]"],
    ["0:0:0:0:0:0:0:1", "[::1]"],
    ["0.0.0.0", "127.0.0.1"],
    ["127.0.0.1", "127.0.0.1"],
  ] as const) {
    const child = spawnCli(
      ["api", "--dev-token"],
      cleanEnv({ DATABASE_URL: db.url, ASSAY_DATA_DIR: dataDir, HOST: host, PORT: "0", LOG_LEVEL: "warn" }),
    );
    const out = watch(child);
    const done = collect(child);
    try {
      const [, address, docs] = await out.waitFor(/Assay is listening on (\S+) {2}\(docs: (\S+)\)/, 30_000);
      const [, link] = await out.waitFor(/^ {2}(http:\S+\/#token=\S+)$/m, 30_000);
      const [, token] = await out.waitFor(/export ASSAY_TOKEN=(\S+)/, 30_000);
      // A file the commands can upload as they are, run in the same folder (the checkout's sample;
      // until 2026-12-07 a data.csv that is nowhere).
      const [, sample, curlUrl] = await out.waitFor(/-F file=@(\S+) (\S+)$/m, 30_000);
      assert.equal(sample, "test/fixtures/csv/normal.csv");
      assert.ok(fs.existsSync(path.join(ROOT, sample)), sample);
      await out.waitFor(
        /^ {2}npx assay submit --type summary test\/fixtures\/csv\/normal\.csv --follow$/m,
        30_000,
      );
      // PORT=0: not the client commands' default server, so the banner names it for them.
      const [, clientUrl] = await out.waitFor(/^ {2}export ASSAY_URL=(\S+)$/m, 30_000);
      assert.equal(clientUrl, address);
      assert.match(address as string, new RegExp(`^http://${shown.replace(/[[\].]/g, "\\$&")}:\\d+$`), host);
      assert.equal(docs, `${address}/docs`, host);
      assert.equal(curlUrl, `${address}/api/files`, host);
      assert.ok((link as string).startsWith(`${address}/#token=`), host);
      // Each one opens.
      assert.equal((await fetch(`${address}/healthz`)).status, 200, host);
      assert.equal((await fetch(docs as string)).status, 200, host);
      assert.equal((await fetch(link as string)).status, 200, host);
      const listed = await fetch(curlUrl as string, { headers: { authorization: `Bearer ${token}` } });
      assert.equal(listed.status, 200, host);
      // Good for 30 days, not for ever (a start a day left an admin token a day that never expired).
      const [made] = await db.sql<{ days: number }[]>`
        select extract(epoch from expires_at - created_at)::float8 / 86400 as days
        from api_tokens order by id desc limit 1`;
      assert.ok(made && Math.abs(made.days - 30) < 0.01, `${host}: ${JSON.stringify(made)}`);
    } finally {
      child.kill("SIGTERM");
    }
    const exit = await done;
    assert.equal(exit.code, 0, `${host}: ${exit.stderr}`);
  }
});

test("--dev-token against a database where dev is a plain user: not made an admin, no token printed", async () => {
  const { tokenCreate } = await import("../../src/auth/tokens.ts");
  // (The test before made dev an admin: a user again, as someone's account would be.)
  await tokenCreate(db.sql, "dev", "user");
  const tokensBefore = await db.sql`select id from api_tokens`;
  const child = spawnCli(
    ["api", "--dev-token"],
    cleanEnv({
      DATABASE_URL: db.url,
      ASSAY_DATA_DIR: dataDir,
      HOST: "127.0.0.1",
      PORT: "0",
      LOG_LEVEL: "warn",
    }),
  );
  const out = watch(child);
  const done = collect(child);
  try {
    await out.waitFor(/--dev-token: a user named dev exists and is not an admin; it is not made one/, 30_000);
    const [dev] = await db.sql<{ role: string }[]>`select role from users where name = 'dev'`;
    assert.equal(dev?.role, "user");
    assert.equal((await db.sql`select id from api_tokens`).length, tokensBefore.length, "no token made");
    assert.doesNotMatch(out.stdout(), /#token=|export ASSAY_TOKEN/);
  } finally {
    child.kill("SIGTERM");
  }
  assert.equal((await done).code, 0);
});

test("linkHost: IPv6 in brackets (normalised, a zone percent-encoded), listen-on-all as the loopback, names as given", () => {
  for (const [host, shown] of [
    ["::", "[::1]"],
    ["0:0:0:0:0:0:0:0", "[::1]"],
    ["0.0.0.0", "127.0.0.1"],
    ["::1", "[::1]"],
    ["2001:DB8::1", "[2001:db8::1]"],
    ["fe80::1%eth0", "[fe80::1%25eth0]"],
    ["::ffff:10.0.0.1", "[::ffff:a00:1]"],
    ["10.0.0.1", "10.0.0.1"],
    ["localhost", "localhost"],
    ["assay-ünï.example", "assay-ünï.example"],
  ] as const) {
    assert.equal(linkHost(host), shown, host);
    // A zone is what curl reads; WHATWG URLs (browsers, fetch) take none at all.
    if (!shown.includes("%")) assert.doesNotThrow(() => new URL(`http://${shown}:3000/docs`), host);
  }
});
