// A statement that names a table or column the database lacks (42P01, 42703): 503 NOT_READY only when
// the database is not migrated for this release (test/e2e/upgrade-schema.test.ts has that side, with
// real processes); with every migration applied it is a bug's 500, not passed off as "not migrated"
// (which clients retry for seconds, and follow for minutes).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { bearer, startTestApp, type TestApp } from "../helpers/app.ts";

let t: TestApp;
before(async () => {
  t = await startTestApp();
});
after(() => t.close());

test("a missing column with every migration applied is a 500 INTERNAL_ERROR, not NOT_READY", async () => {
  const token = await t.token("schema-bug");
  // What a mistyped column in the code looks like to PostgreSQL: the token check names a column the
  // table does not have, though the migrations say the schema is current.
  await t.db.sql`alter table api_tokens rename column expires_at to expires_at_elsewhere`;
  try {
    const res = await t.app.inject({ url: "/api/me", headers: bearer(token) });
    assert.equal(res.statusCode, 500);
    assert.deepEqual(res.json(), { code: "INTERNAL_ERROR", message: "An internal error occurred." });
    assert.ok(
      t.logs.some((l) => l.msg === "request failed" && JSON.stringify(l.err).includes("42703")),
      "the cause is logged",
    );
  } finally {
    await t.db.sql`alter table api_tokens rename column expires_at_elsewhere to expires_at`;
  }
  // Once whole again, as before.
  assert.equal((await t.app.inject({ url: "/api/me", headers: bearer(token) })).statusCode, 200);
});
