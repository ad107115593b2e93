// Integer query fields (`limit` of every list) are decimal digits within their documented range:
// anything else JavaScript reads as a number (Ajv's coercion took `1e1` as 10, `0x10` as 16, `+5`,
// ` 5` and `5.0` as 5) is 400 VALIDATION_FAILED naming the field. The other numeric inputs (`after`,
// `cursor`, Last-Event-ID) are strings of digits already.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";

let t: TestApp;
let alice: string;
let taskId: string;

before(async () => {
  t = await startTestApp();
  alice = await t.token("alice");
  const { payload, headers } = multipart("file", "a,b\n1,2\n");
  const file = await t.app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { ...headers, ...bearer(alice) },
  });
  assert.equal(file.statusCode, 201, file.body);
  const task = await t.app.inject({
    method: "POST",
    url: "/api/analysis-tasks",
    headers: bearer(alice),
    payload: { analysisType: "summary", inputFileId: file.json().data.fileId },
  });
  assert.equal(task.statusCode, 201, task.body);
  taskId = task.json().data.taskId;
});
after(() => t.close());

const get = (url: string, headers: Record<string, string> = {}) =>
  t.app.inject({ url, headers: { ...bearer(alice), ...headers } });

const lists = () => [
  { url: "/api/files", max: 100 },
  { url: "/api/analysis-tasks", max: 100 },
  { url: `/api/analysis-tasks/${taskId}/runs`, max: 100 },
  { url: `/api/analysis-tasks/${taskId}/logs`, max: 1000 },
];

test("a limit that is not decimal digits → 400 VALIDATION_FAILED naming the field", async () => {
  for (const { url } of lists()) {
    for (const value of [
      "1e1",
      "0x10",
      "0b11",
      "0o7",
      "%2B5",
      "%205",
      "5%20",
      "5.0",
      "1.5",
      "-1",
      "",
      "Infinity",
      "ten",
    ]) {
      const res = await get(`${url}?limit=${value}`);
      assert.equal(res.statusCode, 400, `${url}?limit=${value}: ${res.body}`);
      assert.deepEqual(
        res.json(),
        { code: "VALIDATION_FAILED", message: "querystring/limit must be an integer in decimal digits." },
        `${url}?limit=${value}`,
      );
    }
  }
});

test("decimal digits within the range are taken; outside it, 400 naming the bound", async () => {
  for (const { url, max } of lists()) {
    for (const value of ["1", "5", "007", String(max)]) {
      const res = await get(`${url}?limit=${value}`);
      assert.equal(res.statusCode, 200, `${url}?limit=${value}: ${res.body}`);
    }
    for (const [value, message] of [
      ["0", "querystring/limit must be >= 1"],
      [String(max + 1), `querystring/limit must be <= ${max}`],
      ["99999999999999999999999", `querystring/limit must be <= ${max}`],
    ]) {
      const res = await get(`${url}?limit=${value}`);
      assert.equal(res.statusCode, 400, `${url}?limit=${value}`);
      assert.deepEqual(res.json(), { code: "VALIDATION_FAILED", message }, `${url}?limit=${value}`);
    }
    // Given twice: said as such, whatever the values.
    const twice = await get(`${url}?limit=1e1&limit=2`);
    assert.equal(twice.json().message, "querystring/limit may be given only once.");
  }
});

test("a limit in digits is used, not only checked", async () => {
  const res = await get(`/api/analysis-tasks/${taskId}/logs?limit=1`);
  assert.equal(res.statusCode, 200);
  assert.equal(res.json().data.items.length, 1);
});

test("the other numeric inputs take decimal digits only", async () => {
  for (const url of [
    `/api/analysis-tasks/${taskId}/logs?after=1e1`,
    `/api/analysis-tasks/${taskId}/logs?after=0x10`,
    "/api/files?cursor=1e1",
    "/api/analysis-tasks?cursor=0x10",
    `/api/analysis-tasks/${taskId}/runs?cursor=%2B5`,
  ]) {
    const res = await get(url);
    assert.equal(res.statusCode, 400, url);
    assert.equal(res.json().code, "VALIDATION_FAILED", url);
    assert.match(res.json().message, /^querystring\/(after|cursor) /, url);
  }
  for (const id of ["1e1", "0x10", "+5", "5.0"]) {
    const res = await get(`/api/analysis-tasks/${taskId}/events`, { "last-event-id": id });
    assert.equal(res.statusCode, 400, id);
    assert.deepEqual(res.json(), {
      code: "VALIDATION_FAILED",
      message: "Last-Event-ID must be an event id.",
    });
  }
});
