// A statement that names a table or column the database lacks (42P01, 42703): 503 NOT_READY only when
// the database is not migrated for this release (test/e2e/upgrade-schema.test.ts has that side, with
// real processes); with every migration applied it is a bug's 500, not passed off as "not migrated"
// (which clients retry for seconds, and follow for minutes).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { bearer, startTestApp, type TestApp } from "../helpers/app.ts";
import { waitFor } from "../helpers/queue.ts";

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

test("while migrations are missing: 503 NOT_READY for many requests at once; a 500 again once the count is whole", async () => {
  // An app of its own: one that has seen every migration applied keeps that answer for good (a
  // release's migrations never go away under a running process).
  const t = await startTestApp();
  after(() => t.close());
  const token = await t.token("schema-behind");
  const [last] = await t.db.sql<{ id: number; hash: string; created_at: string }[]>`
    select id, hash, created_at::text from drizzle.__drizzle_migrations order by created_at desc limit 1`;
  assert.ok(last);
  await t.db.sql`delete from drizzle.__drizzle_migrations where id = ${last.id}`;
  await t.db.sql`alter table api_tokens rename column expires_at to expires_at_elsewhere`;
  try {
    const answers = await Promise.all(
      Array.from({ length: 40 }, () => t.app.inject({ url: "/api/me", headers: bearer(token) })),
    );
    assert.deepEqual([...new Set(answers.map((r) => `${r.statusCode} ${r.json().code}`))], ["503 NOT_READY"]);
    // The migration recorded again (the column still missing: a bug now): a 500, once the answer
    // "behind" is no longer reused (a second).
    await t.db
      .sql`insert into drizzle.__drizzle_migrations (id, hash, created_at) values (${last.id}, ${last.hash}, ${last.created_at}::bigint)`;
    await waitFor(
      async () => (await t.app.inject({ url: "/api/me", headers: bearer(token) })).statusCode === 500,
      10_000,
      "a 500 once every migration is applied",
    );
  } finally {
    await t.db.sql`alter table api_tokens rename column expires_at_elsewhere to expires_at`;
    await t.db.sql`
      insert into drizzle.__drizzle_migrations (id, hash, created_at)
      values (${last.id}, ${last.hash}, ${last.created_at}::bigint) on conflict do nothing`;
  }
});
