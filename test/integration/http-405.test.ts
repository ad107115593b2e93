// A method a path has no route for: 405 METHOD_NOT_ALLOWED in the envelope, with `Allow` naming the
// methods the path does have (HEAD only where it is served, not where its route only refuses it).
// A path no route has stays 404 NOT_FOUND, and so does a route's own "not found" (a /ui/ file).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { bearer, startTestApp, type TestApp } from "../helpers/app.ts";

let t: TestApp;
let alice: string;

before(async () => {
  t = await startTestApp();
  alice = await t.token("alice");
});
after(() => t.close());

const METHOD_NOT_ALLOWED = { code: "METHOD_NOT_ALLOWED", message: "The route does not take this method." };

test("a method the path has no route for → 405 with Allow, in the envelope", async () => {
  const cases: [string, string, string][] = [
    ["DELETE", "/api/analysis-tasks/1", "GET, HEAD"],
    ["PUT", "/api/files", "GET, HEAD, POST"],
    ["PATCH", "/api/files/12", "GET, HEAD, DELETE"],
    ["GET", "/api/analysis-tasks/1/cancel", "POST"],
    ["OPTIONS", "/api/analysis-types", "GET, HEAD"],
    ["POST", "/api/analysis-tasks/1/runs?limit=5", "GET, HEAD"],
    // Decoded as the router decodes it.
    ["DELETE", "/%61pi/analysis-tasks/1", "GET, HEAD"],
    ["POST", "/healthz", "GET, HEAD"],
    ["DELETE", "/", "GET, HEAD"],
  ];
  for (const [method, url, allow] of cases) {
    const res = await t.app.inject({ method: method as "GET", url, headers: bearer(alice) });
    assert.equal(res.statusCode, 405, `${method} ${url}: ${res.body}`);
    assert.equal(res.headers.allow, allow, `${method} ${url}`);
    assert.deepEqual(res.json(), METHOD_NOT_ALLOWED, `${method} ${url}`);
    assert.match(String(res.headers["content-type"]), /^application\/json/);
  }
  // Under /api it is no-store like every /api answer.
  const api = await t.app.inject({ method: "DELETE", url: "/api/analysis-tasks/1", headers: bearer(alice) });
  assert.equal(api.headers["cache-control"], "no-store");
});

test("HEAD is left out of Allow where its route only refuses it (streams, downloads, links)", async () => {
  for (const url of [
    "/api/analysis-tasks/1/events",
    "/api/analysis-tasks/1/download",
    "/api/analysis-tasks/1/results.csv",
    "/api/analysis-tasks/1/runs/2/download",
    "/api/analysis-tasks/1/runs/2/outputs/out.json",
    "/view/abc/out.json",
    "/view/download/abc/out.json",
  ]) {
    const res = await t.app.inject({ method: "DELETE", url, headers: bearer(alice) });
    assert.equal(res.statusCode, 405, url);
    assert.equal(res.headers.allow, "GET", url);
    // The HEAD those routes refuse says the same.
    const head = await t.app.inject({ method: "HEAD", url, headers: bearer(alice) });
    assert.equal(head.statusCode, 405, url);
    assert.equal(head.headers.allow, "GET", url);
  }
});

test("HEAD where only POST is served → 405 without a body", async () => {
  const res = await t.app.inject({
    method: "HEAD",
    url: "/api/analysis-tasks/1/cancel",
    headers: bearer(alice),
  });
  assert.equal(res.statusCode, 405);
  assert.equal(res.headers.allow, "POST");
  assert.equal(res.body, "");
});

test("a path no route has stays 404 NOT_FOUND, without Allow", async () => {
  for (const [method, url] of [
    ["DELETE", "/api/nope"],
    ["GET", "/api/analysis-tasks/1/nope"],
    ["PUT", "/no/such/route"],
    ["POST", "//api/files"],
    ["OPTIONS", "*"],
  ] as const) {
    const res = await t.app.inject({ method, url, headers: bearer(alice) });
    assert.equal(res.statusCode, 404, `${method} ${url}`);
    assert.equal(res.headers.allow, undefined, `${method} ${url}`);
    assert.deepEqual(res.json(), { code: "NOT_FOUND", message: "No such route." });
  }
});

test("a route's own not-found for the method it serves stays 404", async () => {
  for (const url of ["/ui/no-such-module.js", "/ui/vendor/no-such.js"]) {
    const res = await t.app.inject({ url });
    assert.equal(res.statusCode, 404, url);
    assert.equal(res.headers.allow, undefined, url);
    assert.equal(res.json().code, "NOT_FOUND");
  }
});

test("the 405 needs no token, as the 404 does not (the routes are public, in /docs)", async () => {
  const res = await t.app.inject({ method: "DELETE", url: "/api/analysis-tasks/1" });
  assert.equal(res.statusCode, 405);
  assert.equal(res.headers.allow, "GET, HEAD");
});
