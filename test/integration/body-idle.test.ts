// A request whose body stops coming is cut off after ASSAY_UPLOAD_IDLE_MS without progress (1 s here):
// before, an upload or a JSON body that stalled midway held its connection, and an upload its partial
// file, for as long as its client kept the socket open. Over real sockets: the timer is the socket's.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import net from "node:net";
import path from "node:path";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";
import { waitFor } from "../helpers/queue.ts";

const IDLE_MS = 1000;
let t: TestApp;
let alice: string;
let port: number;

before(async () => {
  t = await startTestApp({ ASSAY_UPLOAD_IDLE_MS: String(IDLE_MS) });
  alice = await t.token("alice");
  await t.app.listen({ host: "127.0.0.1", port: 0 });
  port = (t.app.server.address() as AddressInfo).port;
});
after(() => t.close());

const count = async (table: "files" | "tasks") =>
  (await t.db.sql`select count(*)::int as n from ${t.db.sql(table)}`)[0]?.n as number;

/**
 * Sends `head` and the first `sent` bytes of `body` on a fresh socket, then nothing more. Resolves
 * with what came back and how long after the last byte sent the server closed the socket; rejects
 * when it is still open after `limitMs`.
 */
function stall(head: string, body: Buffer, sent: number, limitMs = 15_000) {
  return new Promise<{ closedAfterMs: number; answer: string }>((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    let answer = "";
    let lastWrite = 0;
    socket.on("data", (d: Buffer) => {
      answer += d.toString("latin1");
    });
    socket.on("error", () => {});
    const limit = setTimeout(() => {
      socket.destroy();
      reject(new Error(`the server kept the stalled request's socket for ${limitMs} ms`));
    }, limitMs);
    socket.on("close", () => {
      clearTimeout(limit);
      resolve({ closedAfterMs: performance.now() - lastWrite, answer });
    });
    socket.write(`${head}\r\n\r\n`);
    socket.write(body.subarray(0, sent), () => {
      lastWrite = performance.now();
    });
  });
}

test("an upload whose body stops midway is cut off after the idle time; nothing is stored", async () => {
  const { payload, headers } = multipart("file", Buffer.alloc(256 * 1024, "7"), "naïve ✓.csv");
  const head = [
    "POST /api/files HTTP/1.1",
    "Host: 127.0.0.1",
    `Authorization: Bearer ${alice}`,
    `Content-Type: ${headers["content-type"]}`,
    `Content-Length: ${payload.length}`,
  ].join("\r\n");
  const before = t.logs.length;
  const { closedAfterMs, answer } = await stall(head, payload, 64 * 1024);
  assert.ok(closedAfterMs >= IDLE_MS - 50, `closed after ${closedAfterMs} ms, before the idle time`);
  assert.equal(answer, "", "no answer: the connection is closed");
  await waitFor(
    async () =>
      t.logs.slice(before).some((l) => l.msg === "request cut off: its body made no progress for too long"),
    5000,
    "the cut-off to be logged",
  );
  assert.equal(await count("files"), 0);
  await waitFor(
    async () =>
      !fs.existsSync(path.join(t.config.dataDir, ".partial")) ||
      fs.readdirSync(path.join(t.config.dataDir, ".partial")).length === 0,
    5000,
    "the partial upload to be removed",
  );
  assert.deepEqual(await t.storage.list("files/"), []);
});

test("a JSON body that stops midway is cut off too; nothing is created", async () => {
  const body = Buffer.from(JSON.stringify({ analysisType: "summary", inputFileIds: ["1000001", "1000002"] }));
  const head = [
    "POST /api/analysis-tasks HTTP/1.1",
    "Host: 127.0.0.1",
    `Authorization: Bearer ${alice}`,
    "Content-Type: application/json",
    `Content-Length: ${body.length}`,
  ].join("\r\n");
  const { closedAfterMs } = await stall(head, body, 20);
  assert.ok(closedAfterMs >= IDLE_MS - 50, `closed after ${closedAfterMs} ms`);
  assert.equal(await count("tasks"), 0);
});

test("a slow upload that keeps sending is not cut off, and the kept-alive socket outlives the idle time", async () => {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    const { payload, headers } = multipart("file", Buffer.alloc(8 * 1024, "5"));
    // Thirteen pieces 250 ms apart: 3 s in all, three idle times, never one without a byte (with room
    // for a loaded machine's late timers).
    const pieces = 13;
    const size = Math.ceil(payload.length / pieces);
    const first = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = http.request(`http://127.0.0.1:${port}/api/files`, {
        method: "POST",
        agent,
        headers: { ...bearer(alice), ...headers, "content-length": String(payload.length) },
      });
      req.on("response", (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => (text += c));
        res.on("end", () => resolve({ status: res.statusCode as number, body: text }));
      });
      req.on("error", reject);
      void (async () => {
        for (let i = 0; i < pieces; i++) {
          if (i > 0) await sleep(IDLE_MS * 0.25);
          req.write(payload.subarray(i * size, (i + 1) * size));
        }
        req.end();
      })();
    });
    assert.equal(first.status, 201, first.body);
    // Idle between requests for longer than the body's idle time: the timer ended with the body.
    await sleep(IDLE_MS * 1.5);
    const next = await new Promise<{ status: number; reused: boolean }>((resolve, reject) => {
      const req = http.get(`http://127.0.0.1:${port}/api/me`, { agent, headers: bearer(alice) }, (res) => {
        res.resume();
        res.on("end", () => resolve({ status: res.statusCode as number, reused: req.reusedSocket }));
      });
      req.on("error", reject);
    });
    assert.deepEqual(next, { status: 200, reused: true });
    assert.equal(await count("files"), 1);
  } finally {
    agent.destroy();
  }
});

test("a request whose body has come whole is not cut off while its handler waits longer than the idle time", async () => {
  const { payload, headers } = multipart("file", "a,b\n1,2\n");
  const file = await t.app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { ...headers, ...bearer(alice) },
  });
  const inputFileId = file.json().data.fileId as string;
  const tasksBefore = await count("tasks");
  let answered = false;
  // The create's insert waits on the lock for 1.5 idle times, its body read long before.
  const held = t.db.sql.begin(async (tx) => {
    await tx`lock table tasks in exclusive mode`;
    await sleep(IDLE_MS * 1.5);
    assert.equal(answered, false, "the create waited for the lock");
  });
  await sleep(50);
  const res = await fetch(`http://127.0.0.1:${port}/api/analysis-tasks`, {
    method: "POST",
    headers: { ...bearer(alice), "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileId }),
  });
  answered = true;
  await held;
  assert.equal(res.status, 201, await res.text());
  assert.equal(await count("tasks"), tasksBefore + 1);
});

/** Writes `data` on a fresh socket; resolves when the server closes it, or with null after `limitMs`. */
function closedWithin(data: string, limitMs: number) {
  return new Promise<{ closedAfterMs: number | null; answer: string }>((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    let answer = "";
    const began = performance.now();
    socket.on("data", (d: Buffer) => {
      answer += d.toString("latin1");
    });
    socket.on("error", () => {});
    const limit = setTimeout(() => {
      socket.destroy();
      resolve({ closedAfterMs: null, answer });
    }, limitMs);
    socket.on("close", () => {
      clearTimeout(limit);
      resolve({ closedAfterMs: performance.now() - began, answer });
    });
    socket.write(data);
  });
}

const jsonPost = (body: string, token: string, declared = Buffer.byteLength(body)) =>
  "POST /api/analysis-tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
  `Authorization: Bearer ${token}\r\nContent-Type: application/json\r\nContent-Length: ${declared}\r\n\r\n${body}`;

test("a stalled body pipelined behind a whole request is cut off too", async () => {
  const whole = jsonPost(JSON.stringify({ analysisType: "summary", inputFileId: "1000000001" }), alice);
  const stalled = jsonPost('{"analysisType":', alice, 100);
  const { closedAfterMs, answer } = await closedWithin(whole + stalled, 10_000);
  assert.notEqual(closedAfterMs, null, "the stalled body held the socket");
  assert.match(answer, /^HTTP\/1\.1 404 /, "the first request was answered");
});

test("an idle connection after an early answer (a 401 before the body) keeps its keep-alive timeout", async () => {
  // The body's timer must leave the socket's own alone: clearing it at the body's end left this
  // socket with no timeout at all once Node had armed its keep-alive one.
  const keepAlive = t.app.server.keepAliveTimeout;
  t.app.server.keepAliveTimeout = 500;
  try {
    for (const request of [
      jsonPost('{"analysisType":"summary"}', "assay_not-a-token"),
      "POST /api/analysis-tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
        `Authorization: Bearer ${alice}\r\nContent-Type: text/weird\r\nContent-Length: 5\r\n\r\nhello`,
    ]) {
      const { closedAfterMs, answer } = await closedWithin(request, 10_000);
      assert.match(answer, /^HTTP\/1\.1 (401|415) /);
      assert.notEqual(closedAfterMs, null, `the idle socket was never closed: ${answer.split("\r\n")[0]}`);
    }
  } finally {
    t.app.server.keepAliveTimeout = keepAlive;
  }
});
