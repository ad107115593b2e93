// Hostile and unusual requests, over real HTTP where the socket matters: each gets its documented
// status and an envelope with a stable code, and nothing is half-written.
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import net from "node:net";
import { Readable } from "node:stream";
import { after, before, describe, test } from "node:test";
import { outputObjectKey } from "../../src/storage/store.ts";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";

let t: TestApp;
let alice: string;
let bob: string;
let aliceFile: string;
let port: number;

before(async () => {
  t = await startTestApp();
  [alice, bob] = await Promise.all([t.token("alice"), t.token("bob")]);
  const { payload, headers } = multipart("file", "a,b\n1,2\n");
  const res = await t.app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { ...headers, ...bearer(alice) },
  });
  aliceFile = res.json().data.fileId;
  await t.app.listen({ port: 0, host: "127.0.0.1" });
  port = (t.app.server.address() as AddressInfo).port;
});
after(() => t.close());

/** Sends `head` (and `body`) as they are on a fresh connection; resolves with status, headers and body. */
function rawRequest(head: string, body = ""): Promise<{ status: number; headers: string; body: string }> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1", () => socket.end(`${head}\r\n\r\n${body}`));
    let out = "";
    socket.on("data", (d: Buffer) => {
      out += d.toString("latin1");
    });
    socket.on("error", reject);
    socket.on("close", () => {
      const at = out.indexOf("\r\n\r\n");
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(out)?.[1] ?? 0);
      resolve({ status, headers: out.slice(0, at), body: out.slice(at + 4) });
    });
  });
}

const counts = async () => {
  const [row] = await t.db
    .sql`select (select count(*) from tasks)::int as tasks, (select count(*) from runs)::int as runs`;
  return row;
};

describe("parameters PostgreSQL cannot store", () => {
  // jsonb refuses \u0000 and an unpaired surrogate: the insert failed and the client got a 500.
  const cases: [string, string, string][] = [
    ["a NUL in r-report's title", `"r-report"`, `{"title":"a\\u0000b"}`],
    ["an unpaired high surrogate in r-report's title", `"r-report"`, `{"title":"a\\ud800b"}`],
    ["an unpaired low surrogate at the end of the title", `"r-report"`, `{"title":"ab\\udc00"}`],
    ["a NUL in a python-stats column", `"python-stats"`, `{"method":"mean","columns":["x","\\u0000"]}`],
  ];
  for (const [name, type, parameters] of cases) {
    test(`${name} → 400 VALIDATION_FAILED naming the field; nothing is created`, async () => {
      const before = await counts();
      const res = await t.app.inject({
        method: "POST",
        url: "/api/analysis-tasks",
        payload: `{"analysisType":${type},"inputFileId":"${aliceFile}","parameters":${parameters}}`,
        headers: { "content-type": "application/json", ...bearer(alice) },
      });
      assert.equal(res.statusCode, 400, res.body);
      assert.equal(res.json().code, "VALIDATION_FAILED");
      assert.match(res.json().message, /^body\/parameters\/(title|columns\/1) /);
      assert.deepEqual(await counts(), before);
    });
  }

  test("a surrogate pair (an emoji) and other control characters are kept as they are", async () => {
    const title = "😀 tab\there \u2028 end";
    const res = await t.app.inject({
      method: "POST",
      url: "/api/analysis-tasks",
      payload: { analysisType: "r-report", inputFileId: aliceFile, parameters: { title } },
      headers: bearer(alice),
    });
    assert.equal(res.statusCode, 201, res.body);
    const task = await t.app.inject({
      url: `/api/analysis-tasks/${res.json().data.taskId}`,
      headers: bearer(alice),
    });
    assert.deepEqual(task.json().data.parameters, { title });
  });
});

describe("URLs Fastify's router refuses", () => {
  test("a path id longer than 100 characters is the resource's 404, in an envelope", async () => {
    for (const [url, code] of [
      [`/api/analysis-tasks/${"9".repeat(101)}`, "ANALYSIS_TASK_NOT_FOUND"],
      [`/api/analysis-tasks/${"a".repeat(5000)}/runs`, "ANALYSIS_TASK_NOT_FOUND"],
      [`/api/files/${"1".repeat(200)}`, "FILE_NOT_FOUND"],
    ] as const) {
      const res = await fetch(`http://127.0.0.1:${port}${url}`, { headers: bearer(alice) });
      assert.equal(res.status, 404, url.slice(0, 40));
      assert.deepEqual(await res.json(), {
        code,
        message: code === "FILE_NOT_FOUND" ? "The file does not exist." : "The analysis task does not exist.",
      });
    }
  });

  test("an output whose name is longer than 100 characters (up to 128 are allowed) can be fetched", async () => {
    const created = await t.app.inject({
      method: "POST",
      url: "/api/analysis-tasks",
      payload: { analysisType: "summary", inputFileId: aliceFile },
      headers: bearer(alice),
    });
    const taskId: string = created.json().data.taskId;
    const name = `${"r".repeat(118)}.json`;
    // As a worker would leave it (the state guards allow queued → starting → succeeded).
    await t.db.sql`update runs set status = 'starting' where task_id = ${taskId}`;
    const [run] = await t.db.sql<{ id: string }[]>`
      update runs set status = 'succeeded', output_key = task_id::text || '/' || id::text,
             result = ${t.db.sql.json({ outputFileName: name, files: [{ name, size: 2 }] })}
      where task_id = ${taskId} returning id::text`;
    await t.storage.put(outputObjectKey(`${taskId}/${run?.id}`, name), Readable.from([Buffer.from("{}")]));
    const res = await fetch(
      `http://127.0.0.1:${port}/api/analysis-tasks/${taskId}/runs/${run?.id}/outputs/${name}`,
      { headers: bearer(alice) },
    );
    assert.equal(res.status, 200, await res.clone().text());
    assert.equal(await res.text(), "{}");
  });

  test("a URL with a malformed percent-escape → 400 BAD_REQUEST in an envelope, the path not echoed", async () => {
    for (const path of ["/api/analysis-tasks/%zz", "/%zz", "/api/files/1%"]) {
      const res = await rawRequest(`GET ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${alice}`);
      assert.equal(res.status, 400, path);
      assert.deepEqual(JSON.parse(res.body), {
        code: "BAD_REQUEST",
        message: "The request could not be processed.",
      });
    }
  });

  test("a request head over Node's limit → 431 BAD_REQUEST in an envelope", async () => {
    const res = await rawRequest(`GET /api/analysis-tasks?x=${"a".repeat(20_000)} HTTP/1.1\r\nHost: x`);
    assert.equal(res.status, 431);
    assert.match(res.headers, /content-type: application\/json/i);
    assert.deepEqual(JSON.parse(res.body), {
      code: "BAD_REQUEST",
      message: "The request could not be processed.",
    });
  });

  test("a request that is not HTTP → 400 BAD_REQUEST in an envelope", async () => {
    const res = await rawRequest("GET / HTTP/1.1\r\nHost: x\r\nBad Header: y");
    assert.equal(res.status, 400);
    assert.deepEqual(JSON.parse(res.body), {
      code: "BAD_REQUEST",
      message: "The request could not be processed.",
    });
  });
});

describe("the Authorization header", () => {
  test("sent twice → 401 UNAUTHORIZED, whichever tokens it holds (a singleton field, RFC 9110)", async () => {
    for (const [first, second] of [
      [alice, bob],
      [alice, alice],
      ["nonsense", alice],
    ]) {
      const res = await rawRequest(
        `GET /api/me HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${first}\r\nAuthorization: Bearer ${second}`,
      );
      assert.equal(res.status, 401);
      assert.deepEqual(JSON.parse(res.body), {
        code: "UNAUTHORIZED",
        message: "A valid bearer token is required.",
      });
    }
    // Once is fine.
    const once = await rawRequest(`GET /api/me HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${alice}`);
    assert.equal(once.status, 200);
    assert.equal(JSON.parse(once.body).data.name, "alice");
  });

  test("sent twice, a create makes nothing", async () => {
    const before = await counts();
    const body = JSON.stringify({ analysisType: "summary", inputFileId: aliceFile });
    const res = await rawRequest(
      `POST /api/analysis-tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${alice}\r\n` +
        `authorization: Bearer ${alice}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}`,
      body,
    );
    assert.equal(res.status, 401);
    assert.deepEqual(await counts(), before);
  });
});

describe("Content-Encoding", () => {
  test("a body in an encoding is 415 UNSUPPORTED_MEDIA_TYPE and makes nothing; identity, or none on a GET, is as ever", async () => {
    const create = JSON.stringify({ analysisType: "summary", inputFileId: aliceFile });
    const gzipped = (await import("node:zlib")).gzipSync(create);
    const before = await counts();
    for (const [encoding, body] of [
      ["gzip", gzipped],
      ["gzip", Buffer.from(create)], // labelled gzip, sent as it is: it was taken (a 201)
      ["br, gzip", gzipped],
      ["x-unknown", Buffer.from(create)],
    ] as const) {
      const res = await t.app.inject({
        method: "POST",
        url: "/api/analysis-tasks",
        payload: body,
        headers: { ...bearer(alice), "content-type": "application/json", "content-encoding": encoding },
      });
      assert.equal(res.statusCode, 415, `${encoding}: ${res.body}`);
      assert.deepEqual(res.json(), {
        code: "UNSUPPORTED_MEDIA_TYPE",
        message: "A Content-Encoding is not supported: send the body as it is.",
      });
    }
    assert.deepEqual(await counts(), before);
    const identity = await t.app.inject({
      method: "POST",
      url: "/api/analysis-tasks",
      payload: create,
      headers: { ...bearer(alice), "content-type": "application/json", "content-encoding": "identity" },
    });
    assert.equal(identity.statusCode, 201, identity.body);
    const get = await t.app.inject({
      url: "/api/files",
      headers: { ...bearer(alice), "content-encoding": "gzip" },
    });
    assert.equal(get.statusCode, 200, get.body);
  });
});

describe("validation messages", () => {
  test("a value outside an enumeration is named once, with what is allowed", async () => {
    const list = await t.app.inject({ url: "/api/analysis-tasks?status=bogus", headers: bearer(alice) });
    assert.equal(list.statusCode, 400);
    assert.deepEqual(list.json(), {
      code: "VALIDATION_FAILED",
      message:
        "querystring/status must be one of queued, running, cancelling, succeeded, partially_succeeded, failed, timed_out, cancelled",
    });
    const twice = await t.app.inject({
      url: `/api/analysis-tasks/${aliceFile}/runs?status=queued&status=running`,
      headers: bearer(alice),
    });
    assert.equal(twice.statusCode, 400);
    // Said as what it is: the field given twice ("must be one of queued, …" named two allowed values).
    assert.deepEqual(twice.json(), {
      code: "VALIDATION_FAILED",
      message: "querystring/status may be given only once.",
    });
    const limits = await t.app.inject({ url: "/api/analysis-tasks?limit=1&limit=2", headers: bearer(alice) });
    assert.equal(limits.statusCode, 400);
    assert.equal(limits.json().message, "querystring/limit may be given only once.");
    const create = await t.app.inject({
      method: "POST",
      url: "/api/analysis-tasks",
      payload: { analysisType: "python-stats", inputFileId: aliceFile, parameters: { method: "MEAN" } },
      headers: bearer(alice),
    });
    assert.equal(create.statusCode, 400);
    assert.deepEqual(create.json(), {
      code: "VALIDATION_FAILED",
      message: "body/parameters/method must be one of mean, median, stdev, min, max",
    });
  });
});

describe("query fields", () => {
  test("a route that takes no query refuses any query field, like a list refuses an unknown one", async () => {
    const created = await t.app.inject({
      method: "POST",
      url: "/api/analysis-tasks",
      payload: { analysisType: "summary", inputFileId: aliceFile },
      headers: bearer(alice),
    });
    assert.equal(created.statusCode, 201, created.body);
    const task = created.json().data.taskId as string;
    const before = await counts();
    const routes: [string, string][] = [
      ["GET", "/api/me"],
      ["GET", "/api/analysis-types"],
      ["GET", `/api/files/${aliceFile}`],
      ["GET", `/api/analysis-tasks/${task}`],
      ["GET", `/api/analysis-tasks/${task}/events`],
      ["GET", `/api/analysis-tasks/${task}/download`],
      ["GET", `/api/analysis-tasks/${task}/results.csv`],
      ["POST", `/api/analysis-tasks/${task}/cancel`],
      ["POST", "/api/analysis-tasks"],
    ];
    for (const [method, url] of routes) {
      const res = await t.app.inject({
        method: method as "GET",
        url: `${url}?stauts=failed`,
        headers: bearer(alice),
        ...(url === "/api/analysis-tasks"
          ? { payload: { analysisType: "summary", inputFileId: aliceFile } }
          : {}),
      });
      assert.equal(res.statusCode, 400, `${method} ${url}: ${res.body}`);
      assert.deepEqual(
        res.json(),
        { code: "VALIDATION_FAILED", message: "querystring/stauts is not a known field." },
        `${method} ${url}`,
      );
    }
    assert.deepEqual(await counts(), before, "nothing was created");
    const [state] = await t.db.sql`select status from tasks where id = ${task}`;
    assert.equal(state?.status, "queued", "the cancel did not happen");
    // Without a token it is still the 401, before any validation.
    assert.equal((await t.app.inject({ url: `/api/me?x=1` })).statusCode, 401);
    // The routes answer as before without one.
    assert.equal(
      (await t.app.inject({ url: `/api/analysis-tasks/${task}`, headers: bearer(alice) })).statusCode,
      200,
    );
  });
});
