import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { TOKEN_CACHE_TTL_MS } from "../../src/auth/token-cache.ts";
import { hashToken, tokenCreate, tokenRevoke } from "../../src/auth/tokens.ts";
import { createDatabase } from "../../src/db/client.ts";
import { expectedMigrationCount } from "../../src/db/migrate.ts";
import { buildServer, jsonBodyLimit } from "../../src/http/server.ts";
import { createLogger } from "../../src/log.ts";
import { bearer, startTestApp, type TestApp } from "../helpers/app.ts";
import { createTestDatabase } from "../helpers/db.ts";
import { waitFor } from "../helpers/queue.ts";

let t: TestApp;
let alice: string;

before(async () => {
  t = await startTestApp();
  alice = await t.token("alice");
});
after(() => t.close());

describe("health", () => {
  test("/healthz answers without auth", async () => {
    const res = await t.app.inject({ url: "/healthz" });
    assert.equal(res.statusCode, 200);
    assert.deepEqual(res.json(), { code: "OK", message: "OK", data: { status: "ok" } });
  });

  test("/readyz is 200 on a migrated database", async () => {
    const res = await t.app.inject({ url: "/readyz" });
    assert.equal(res.statusCode, 200);
    assert.equal(res.json().data.status, "ready");
  });

  test("/readyz is 503 on a database without migrations", async () => {
    const db = await createTestDatabase();
    try {
      await db.sql`drop schema drizzle cascade`;
      const app = await buildServer(
        { config: t.config, database: db, storage: t.storage, expectedMigrations: expectedMigrationCount() },
        createLogger({ level: "silent" }),
      );
      const res = await app.inject({ url: "/readyz" });
      assert.equal(res.statusCode, 503);
      assert.deepEqual(res.json(), { code: "NOT_READY", message: "The database is not migrated." });
      await app.close();
    } finally {
      await db.drop();
    }
  });

  test("/readyz is 503 when the database is unreachable", async () => {
    const database = createDatabase("postgres://nobody:x@127.0.0.1:1/none", { max: 1 });
    const app = await buildServer(
      { config: t.config, database, storage: t.storage, expectedMigrations: expectedMigrationCount() },
      createLogger({ level: "silent" }),
    );
    const res = await app.inject({ url: "/readyz" });
    assert.equal(res.statusCode, 503);
    assert.equal(res.json().code, "NOT_READY");
    await app.close();
    await database.close();
  });
});

describe("errors", () => {
  test("unknown route → 404 NOT_FOUND in the envelope", async () => {
    const res = await t.app.inject({ url: "/no/such/route" });
    assert.equal(res.statusCode, 404);
    assert.deepEqual(res.json(), { code: "NOT_FOUND", message: "No such route." });
  });

  test("malformed JSON → 400 INVALID_JSON", async () => {
    const res = await t.app.inject({
      method: "POST",
      url: "/api/files",
      payload: "{not json",
      headers: { "content-type": "application/json", ...bearer(alice) },
    });
    assert.equal(res.statusCode, 400);
    assert.equal(res.json().code, "INVALID_JSON");
  });

  test("JSON body over the limit (1 MiB + 32 bytes per ASSAY_MAX_TASK_RUNS) → 413 PAYLOAD_TOO_LARGE", async () => {
    const limit = jsonBodyLimit(t.config.maxTaskRuns);
    assert.ok(limit >= 1024 * 1024 + 19 * t.config.maxTaskRuns, "room for a task of the most file ids");
    const res = await t.app.inject({
      method: "POST",
      url: "/api/files",
      payload: JSON.stringify({ x: "y".repeat(limit) }),
      headers: { "content-type": "application/json", ...bearer(alice) },
    });
    assert.equal(res.statusCode, 413);
    // Said as a body's limit, with its size: until 2026-12-07 it said "The upload exceeds the size
    // limit", of a body that was no upload.
    assert.deepEqual(res.json(), {
      code: "PAYLOAD_TOO_LARGE",
      message: `The request body exceeds this server's limit of ${limit} bytes.`,
    });
    const create = await t.app.inject({
      method: "POST",
      url: "/api/analysis-tasks",
      payload: JSON.stringify({ analysisType: "summary", inputFileId: "1", x: "y".repeat(limit) }),
      headers: { "content-type": "application/json", ...bearer(alice) },
    });
    assert.equal(create.statusCode, 413);
    assert.match(create.json().message, /^The request body exceeds this server's limit of \d+ bytes\.$/);
  });

  test("unsupported content type → 415", async () => {
    const res = await t.app.inject({
      method: "POST",
      url: "/api/files",
      payload: "<x/>",
      headers: { "content-type": "application/xml", ...bearer(alice) },
    });
    assert.equal(res.statusCode, 415);
    assert.equal(res.json().code, "UNSUPPORTED_MEDIA_TYPE");
  });

  test("an unexpected failure → 500 INTERNAL_ERROR with no SQL or stack in the body, cause logged", async () => {
    const db = await createTestDatabase();
    const app = await buildServer(
      { config: t.config, database: db, storage: t.storage, expectedMigrations: expectedMigrationCount() },
      createLogger({ level: "silent" }),
    );
    try {
      const { token } = await tokenCreate(db.sql, "x");
      await db.sql`drop table files`;
      const res = await app.inject({ url: "/api/files/1", headers: bearer(token) });
      assert.equal(res.statusCode, 500);
      assert.deepEqual(res.json(), { code: "INTERNAL_ERROR", message: "An internal error occurred." });
      assert.doesNotMatch(res.body, /files|relation|select|at /i);
    } finally {
      await app.close();
      await db.drop();
    }
  });

  test("request ids: a sane X-Request-Id is kept in the logs, a hostile one replaced", async () => {
    await t.app.inject({ url: "/healthz", headers: { "x-request-id": "req-123" } });
    assert.ok(t.logs.some((l) => l.reqId === "req-123"));
    await t.app.inject({ url: "/healthz", headers: { "x-request-id": "bad id\nforged" } });
    assert.ok(!t.logs.some((l) => String(l.reqId).includes("forged")));
  });
});

describe("auth", () => {
  const cases: [string, Record<string, string>][] = [
    ["missing", {}],
    ["not bearer", { authorization: `Basic ${Buffer.from("a:b").toString("base64")}` }],
    ["malformed", { authorization: "Bearer" }],
    ["two tokens", { authorization: "Bearer a b" }],
    ["unknown", { authorization: `Bearer assay_${"A".repeat(43)}` }],
    ["garbage", { authorization: "Bearer ' OR 1=1 --" }],
  ];
  for (const [name, headers] of cases) {
    test(`${name} token → 401 UNAUTHORIZED`, async () => {
      const res = await t.app.inject({ url: "/api/files/1", headers });
      assert.equal(res.statusCode, 401);
      assert.deepEqual(res.json(), { code: "UNAUTHORIZED", message: "A valid bearer token is required." });
    });
  }

  test("the scheme is matched in any case and may be followed by several spaces (RFC 9110)", async () => {
    const token = await t.token("erin");
    for (const authorization of [`bearer ${token}`, `BEARER ${token}`, `Bearer   ${token}`]) {
      const res = await t.app.inject({ url: "/api/me", headers: { authorization } });
      assert.equal(res.statusCode, 200, authorization.replace(token, "<token>"));
      assert.equal(res.json().data.name, "erin");
    }
    // The token itself is still matched exactly: case matters there.
    const upper = `assay_${token.slice("assay_".length).toUpperCase()}`;
    if (upper !== token) {
      const res = await t.app.inject({ url: "/api/me", headers: { authorization: `bearer ${upper}` } });
      assert.equal(res.statusCode, 401);
    }
  });

  test("a revoked token → 401 at once (the API's token cache hears of it), the user's other tokens work", async () => {
    const first = await t.token("carol");
    const second = await t.token("carol");
    const [row] = await t.db.sql`select id from api_tokens where token_hash = ${hashToken(first)}`;
    // Twice: the second answer comes from the cache.
    for (let i = 0; i < 2; i++) {
      assert.equal((await t.app.inject({ url: "/api/files/1", headers: bearer(first) })).statusCode, 404);
    }
    assert.ok((t.app.services.tokens?.size ?? 0) > 0, "the token is cached");
    const revokedAt = Date.now();
    assert.equal(await tokenRevoke(t.db.sql, Number(row?.id)), true);
    // The revoke's NOTIFY empties the cache: well before the cache's own expiry.
    await waitFor(
      async () => (await t.app.inject({ url: "/api/files/1", headers: bearer(first) })).statusCode === 401,
      TOKEN_CACHE_TTL_MS / 2,
      "the revoked token to be refused",
    );
    assert.ok(Date.now() - revokedAt < TOKEN_CACHE_TTL_MS / 2);
    assert.equal((await t.app.inject({ url: "/api/files/1", headers: bearer(second) })).statusCode, 404);
  });

  test("a role change reaches cached tokens at once", async () => {
    const token = await t.token("dora");
    const me = async () => (await t.app.inject({ url: "/api/me", headers: bearer(token) })).json().data.role;
    assert.equal(await me(), "user");
    assert.equal(await me(), "user");
    await t.token("dora", "admin");
    await waitFor(async () => (await me()) === "admin", TOKEN_CACHE_TTL_MS / 2, "the new role");
  });

  test("the Authorization header and the token never reach the logs", async () => {
    await t.app.inject({ url: "/api/files/1", headers: bearer(alice) });
    const all = JSON.stringify(t.logs);
    assert.ok(!all.includes(alice));
    assert.ok(!all.includes(alice.slice(6)));
  });
});

describe("docs", () => {
  test("OpenAPI is generated from the route schemas", async () => {
    const res = await t.app.inject({ url: "/docs/json" });
    assert.equal(res.statusCode, 200);
    const doc = res.json();
    assert.equal(doc.openapi.startsWith("3."), true);
    assert.ok(doc.paths["/api/files"].post);
    assert.ok(doc.paths["/api/files/{fileId}"].get);
    assert.ok(doc.paths["/readyz"].get);
    // The routes that send bytes document them (a body, not an envelope), and what every route may
    // answer besides its own: 503 while the database does not answer, 415 for a POST's body type.
    const download = doc.paths["/api/analysis-tasks/{taskId}/runs/{runId}/download"].get.responses;
    assert.deepEqual(Object.keys(download["200"].content), ["application/octet-stream"]);
    assert.deepEqual(download["200"].content["application/octet-stream"].schema, {
      type: "string",
      format: "binary",
    });
    assert.ok(download["206"].content, "206 documented");
    assert.equal(download["304"].content, undefined, "a 304 has no body");
    assert.ok(download["416"]);
    const zip = doc.paths["/api/analysis-tasks/{taskId}/download"].get.responses["200"].content;
    assert.deepEqual(Object.keys(zip), ["application/octet-stream", "application/zip"]);
    const table = doc.paths["/api/analysis-tasks/{taskId}/results.csv"].get.responses;
    assert.deepEqual(Object.keys(table["200"].content), ["text/csv"]);
    assert.equal(table["206"], undefined, "the table is not resumable");
    const create = doc.paths["/api/analysis-tasks"].post.responses;
    assert.ok(create["415"] && create["503"], "a POST's 415 and 503");
    assert.equal(doc.paths["/api/analysis-tasks"].get.responses["415"], undefined, "no 415 on a GET");
    assert.ok(doc.paths["/api/analysis-tasks"].get.responses["503"]);
    const ui = await t.app.inject({ url: "/docs" });
    assert.ok([200, 302].includes(ui.statusCode));
  });
});
