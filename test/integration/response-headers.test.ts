// What the API and the dashboard tell a browser and the caches between about their answers: the API's
// answers (a user's tasks, files, outputs; its refusals) are never stored (`no-store`) and never
// sniffed (`nosniff`); the event stream keeps its `no-cache`; the dashboard's page carries its policy,
// `no-referrer` and `X-Frame-Options` under every address it is served at, /ui/index.html included.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { DASHBOARD_CSP } from "../../src/http/routes/dashboard.ts";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";
import { idsCrossPowerOfTen } from "../helpers/queue.ts";

let t: TestApp;
let token: string;
let base: string;
let fileId: string;
let taskId: string;

before(async () => {
  t = await startTestApp();
  token = await t.token("zoë \u202eexe.csv");
  await idsCrossPowerOfTen(t.db.sql, "files", 1);
  const body = multipart("file", "a,b\n1,2\n", "<img src=x onerror=alert(1)>\u202evsc.exe");
  const upload = await t.app.inject({
    method: "POST",
    url: "/api/files",
    payload: body.payload,
    headers: { ...body.headers, ...bearer(token) },
  });
  assert.equal(upload.statusCode, 201);
  fileId = upload.json().data.fileId;
  const created = await t.app.inject({
    method: "POST",
    url: "/api/analysis-tasks",
    headers: bearer(token),
    payload: { analysisType: "summary", inputFileIds: [fileId] },
  });
  assert.equal(created.statusCode, 201, created.body);
  assert.equal(created.headers["cache-control"], "no-store");
  taskId = created.json().data.taskId;
  await t.app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
});
after(() => t.close());

test("every /api answer, a success, a refusal or an unknown path, is no-store and nosniff", async () => {
  const asked: [string, string, Record<string, string>, number][] = [
    ["GET", "/api/me", bearer(token), 200],
    ["GET", "/api/files?limit=5", bearer(token), 200],
    ["GET", `/api/files/${fileId}`, bearer(token), 200],
    ["GET", "/api/analysis-tasks", bearer(token), 200],
    ["GET", `/api/analysis-tasks/${taskId}`, bearer(token), 200],
    ["GET", `/api/analysis-tasks/${taskId}/runs`, bearer(token), 200],
    ["GET", "/api/analysis-types", bearer(token), 200],
    // Escaped in the address, routed to /api all the same (the router decodes it).
    ["GET", "/%61pi/me", bearer(token), 200],
    ["GET", `/%61pi/analysis-tasks/${taskId}`, bearer(token), 200],
    ["GET", "/api/analysis-tasks", {}, 401],
    ["GET", "/api/analysis-tasks?status=nope", bearer(token), 400],
    ["GET", "/api/analysis-tasks/10000000", bearer(token), 404],
    ["GET", "/api/no-such-route", bearer(token), 404],
    ["POST", `/api/analysis-tasks/${taskId}/download/link`, bearer(token), 409],
  ];
  for (const [method, url, headers, status] of asked) {
    const res = await t.app.inject({ method: method as "GET", url, headers });
    assert.equal(res.statusCode, status, `${method} ${url}: ${res.body}`);
    assert.equal(res.headers["cache-control"], "no-store", `${method} ${url}: cache-control`);
    assert.equal(res.headers["x-content-type-options"], "nosniff", `${method} ${url}: nosniff`);
  }
  // Answers outside /api are sniffed by no browser either; their caching is their own.
  for (const url of ["/healthz", "/no-such-page", "/metrics"]) {
    const res = await t.app.inject({ url });
    assert.equal(res.headers["x-content-type-options"], "nosniff", `${url}: nosniff`);
    assert.notEqual(res.headers["cache-control"], "no-store", `${url}: not /api`);
  }
});

test("a task's event stream keeps its own no-cache", async () => {
  const ctrl = new AbortController();
  const res = await fetch(`${base}/api/analysis-tasks/${taskId}/events`, {
    headers: { ...bearer(token), accept: "text/event-stream" },
    signal: ctrl.signal,
  });
  try {
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-type"), "text/event-stream");
    assert.equal(res.headers.get("cache-control"), "no-cache");
  } finally {
    ctrl.abort();
    await res.body?.cancel().catch(() => {});
  }
});

test("the dashboard's page carries its policy, no-referrer and DENY at / and at /ui/index.html", async () => {
  for (const url of ["/", "/ui/index.html", "/ui/app.js", "/ui/style.css", "/ui/vendor/preact.js"]) {
    const res = await t.app.inject({ url });
    assert.equal(res.statusCode, 200, url);
    assert.equal(res.headers["content-security-policy"], DASHBOARD_CSP, `${url}: policy`);
    assert.equal(res.headers["x-content-type-options"], "nosniff", `${url}: nosniff`);
    assert.equal(res.headers["referrer-policy"], "no-referrer", `${url}: referrer-policy`);
    assert.equal(res.headers["x-frame-options"], "DENY", `${url}: x-frame-options`);
  }
});

test("a dashboard file that is not there — a folder, a path out of /ui/, a missing file — is 404 NOT_FOUND", async () => {
  for (const url of [
    "/ui/",
    "/ui/vendor/",
    "/ui/../package.json",
    "/ui/%2e%2e/package.json",
    "/ui/%5c..%5cpackage.json",
    "/ui/nope.js",
  ]) {
    const res = await t.app.inject({ url });
    // Until 2026-12-07 the first five were 403 BAD_REQUEST (the file server's refusal).
    assert.equal(res.statusCode, 404, url);
    assert.deepEqual(res.json(), { code: "NOT_FOUND", message: "No such route." }, url);
  }
});

test("the Swagger UI may not be framed by another site, and sends no Referer", async () => {
  for (const url of [
    "/docs",
    "/docs/static/index.html",
    "/docs/static/swagger-initializer.js",
    "/docs/json",
  ]) {
    const res = await t.app.inject({ url });
    assert.ok(res.statusCode < 400, `${url}: ${res.statusCode}`);
    assert.equal(res.headers["x-frame-options"], "DENY", `${url}: x-frame-options`);
    assert.equal(res.headers["content-security-policy"], "frame-ancestors 'none'", `${url}: policy`);
    assert.equal(res.headers["referrer-policy"], "no-referrer", `${url}: referrer-policy`);
  }
});
