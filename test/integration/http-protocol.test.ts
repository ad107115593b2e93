// HTTP/1.1 as real clients and proxies speak it, over raw sockets (`inject` skips Node's parser and
// the server's events): `Expect: 100-continue`, request targets and headers Node lets through.
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import net from "node:net";
import { after, before, describe, test } from "node:test";
import { MULTIPART_SLACK_BYTES } from "../../src/http/server.ts";
import { multipart, startTestApp, type TestApp } from "../helpers/app.ts";
import { createTask, idsCrossPowerOfTen, seedUser } from "../helpers/queue.ts";

let t: TestApp;
let alice: string;
let port: number;

before(async () => {
  t = await startTestApp();
  alice = await t.token("alice");
  await t.app.listen({ port: 0, host: "127.0.0.1" });
  port = (t.app.server.address() as AddressInfo).port;
});
after(() => t.close());

const fileCount = async () => (await t.db.sql`select count(*)::int as n from files`)[0]?.n as number;

interface Exchange {
  /** Everything received, as latin1. */
  received: () => string;
  /** Resolves once `pattern` is in what was received; rejects when the socket closes first or after 10 s. */
  waitFor(pattern: RegExp): Promise<void>;
  /** Resolves when the server closed the connection; rejects after 10 s. */
  closed: Promise<void>;
  socket: net.Socket;
}

/** A connection that sends `head` (and its blank line), and nothing more until told. */
function open(head: string): Exchange {
  const socket = net.connect(port, "127.0.0.1");
  let out = "";
  const waiters = new Set<() => void>();
  socket.on("data", (d: Buffer) => {
    out += d.toString("latin1");
    for (const w of waiters) w();
  });
  socket.on("error", () => {});
  const closed = new Promise<void>((resolve, reject) => {
    const limit = setTimeout(() => reject(new Error(`still open after 10 s; received ${out}`)), 10_000);
    socket.on("close", () => {
      clearTimeout(limit);
      for (const w of waiters) w();
      resolve();
    });
  });
  socket.write(`${head}\r\n\r\n`);
  return {
    socket,
    received: () => out,
    closed,
    waitFor: (pattern) =>
      new Promise((resolve, reject) => {
        const limit = setTimeout(
          () => reject(new Error(`no ${pattern} after 10 s; received ${out}`)),
          10_000,
        );
        const check = () => {
          if (pattern.test(out)) {
            clearTimeout(limit);
            waiters.delete(check);
            resolve();
          } else if (socket.destroyed) {
            clearTimeout(limit);
            waiters.delete(check);
            reject(new Error(`closed without ${pattern}; received ${out}`));
          }
        };
        waiters.add(check);
        check();
      }),
  };
}

const bodyOf = (answer: string) =>
  JSON.parse(Buffer.from(answer.slice(answer.lastIndexOf("\r\n\r\n") + 4), "latin1").toString("utf8"));

/** The head of a POST to `path` that asks for `100 Continue` before sending its `length` bytes. */
const expecting = (path: string, token: string, contentType: string, length: number) =>
  [
    `POST ${path} HTTP/1.1`,
    "Host: 127.0.0.1",
    `Authorization: Bearer ${token}`,
    `Content-Type: ${contentType}`,
    `Content-Length: ${length}`,
    "Expect: 100-continue",
  ].join("\r\n");

describe("Expect: 100-continue (curl sends it with every body over 1 MiB)", () => {
  test("a good token: 100 Continue, then the body is read and the upload stored", async () => {
    const first = await idsCrossPowerOfTen(t.db.sql, "files", 0);
    const { payload, headers } = multipart("file", "x,y\n1,2\n", "résumé 'x'; ✓.csv");
    const c = open(expecting("/api/files", alice, headers["content-type"] as string, payload.length));
    await c.waitFor(/^HTTP\/1\.1 100 Continue\r\n\r\n/);
    c.socket.write(payload);
    await c.waitFor(/HTTP\/1\.1 201 [\s\S]*\r\n\r\n\{.*\}$/);
    const answer = bodyOf(c.received());
    assert.equal(answer.data.fileId, String(first));
    assert.equal(answer.data.name, "résumé 'x'; ✓.csv");
    c.socket.destroy();
  });

  test("a bad token: 401 at once, without 100 Continue and without reading the body; the connection is closed", async () => {
    const before = await fileCount();
    const c = open(
      expecting("/api/files", "assay_not-a-token", "multipart/form-data; boundary=----x", 2 * 1024 ** 3),
    );
    await c.closed;
    const answer = c.received();
    assert.match(answer, /^HTTP\/1\.1 401 /, answer);
    assert.doesNotMatch(answer, /100 Continue/);
    assert.match(answer, /\r\nconnection: close\r\n/i);
    assert.equal(bodyOf(answer).code, "UNAUTHORIZED");
    assert.equal(await fileCount(), before);
  });

  test("a JSON body whose Content-Length is over the limit: 413 without 100 Continue", async () => {
    const c = open(expecting("/api/analysis-tasks", alice, "application/json", 50 * 1024 ** 2));
    await c.closed;
    const answer = c.received();
    assert.match(answer, /^HTTP\/1\.1 413 /, answer);
    assert.doesNotMatch(answer, /100 Continue/);
    assert.equal(bodyOf(answer).code, "PAYLOAD_TOO_LARGE");
  });

  test("an upload whose Content-Length cannot hold a file within the limit: 413 without 100 Continue, nothing stored", async () => {
    const before = await fileCount();
    const tooLong = t.config.maxUploadBytes + MULTIPART_SLACK_BYTES + 1;
    const c = open(expecting("/api/files", alice, "multipart/form-data; boundary=----x", tooLong));
    await c.closed;
    const answer = c.received();
    assert.match(answer, /^HTTP\/1\.1 413 /, answer);
    assert.doesNotMatch(answer, /100 Continue/);
    assert.equal(bodyOf(answer).code, "PAYLOAD_TOO_LARGE");
    assert.equal(await fileCount(), before);
    // One that may hold a file within the limit (the form's other fields take room) is asked for.
    const fits = open(expecting("/api/files", alice, "multipart/form-data; boundary=----x", tooLong - 1));
    await fits.waitFor(/^HTTP\/1\.1 100 Continue\r\n\r\n/);
    fits.socket.destroy();
  });

  test("another expectation: 417 in an envelope", async () => {
    const c = open(
      [
        "POST /api/analysis-tasks HTTP/1.1",
        "Host: 127.0.0.1",
        `Authorization: Bearer ${alice}`,
        "Content-Type: application/json",
        "Content-Length: 2",
        "Expect: 200-ok",
        "Connection: close",
      ].join("\r\n"),
    );
    await c.closed;
    const answer = c.received();
    assert.match(answer, /^HTTP\/1\.1 417 /, answer);
    assert.match(answer, /\r\ncontent-type: application\/json; charset=utf-8\r\n/i);
    assert.deepEqual(bodyOf(answer), { code: "BAD_REQUEST", message: "The request could not be processed." });
  });
});

describe("request targets and Host (RFC 9112)", () => {
  const refused = { code: "BAD_REQUEST", message: "The request could not be processed." };

  /** Sends `head` with `Connection: close` and resolves with everything the server answered. */
  async function send(head: string): Promise<string> {
    const c = open(`${head}\r\nConnection: close`);
    await c.closed;
    return c.received();
  }

  test("GET * (the asterisk form, OPTIONS's alone) → 400 in an envelope, not the dashboard", async () => {
    for (const method of ["GET", "HEAD", "POST", "DELETE"]) {
      const answer = await send(`${method} * HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${alice}`);
      assert.match(answer, /^HTTP\/1\.1 400 /, `${method}: ${answer}`);
      assert.match(answer, /\r\ncontent-type: application\/json; charset=utf-8\r\n/i);
      if (method !== "HEAD") assert.deepEqual(bodyOf(answer), refused);
    }
    // OPTIONS * is a valid request; no route answers OPTIONS.
    assert.match(await send("OPTIONS * HTTP/1.1\r\nHost: 127.0.0.1"), /^HTTP\/1\.1 404 /);
  });

  test("an HTTP/1.1 request without a Host → 400 in an envelope (Node's own had no body)", async () => {
    const answer = await send(`GET /api/me HTTP/1.1\r\nAuthorization: Bearer ${alice}`);
    assert.match(answer, /^HTTP\/1\.1 400 /, answer);
    assert.match(answer, /\r\ncontent-type: application\/json; charset=utf-8\r\n/i);
    assert.deepEqual(bodyOf(answer), refused);
  });

  test("a Host sent twice → 400; HTTP/1.0 without a Host, and an empty Host, are served", async () => {
    const twice = await send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example");
    assert.match(twice, /^HTTP\/1\.1 400 /, twice);
    assert.deepEqual(bodyOf(twice), refused);
    assert.match(await send("GET /healthz HTTP/1.0"), /^HTTP\/1\.1 200 /);
    assert.match(await send("GET /healthz HTTP/1.1\r\nHost:"), /^HTTP\/1\.1 200 /);
  });
});

test("a malformed request pipelined behind an answer under way is not written into that answer", async () => {
  const taskId = await createTask(t.db.sql, await seedUser(t.db.sql, "alice"), "summary", 1);
  const c = open(
    [
      `GET /api/analysis-tasks/${taskId}/events HTTP/1.1`,
      "Host: 127.0.0.1",
      `Authorization: Bearer ${alice}`,
      "Accept: text/event-stream",
    ].join("\r\n"),
  );
  await c.waitFor(/event: task\.queued\n/);
  // A head Node's parser refuses, behind the stream on the same connection.
  c.socket.write("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header: y\r\n\r\n");
  await c.closed;
  const answer = c.received();
  assert.match(answer, /^HTTP\/1\.1 200 /);
  assert.doesNotMatch(answer, /HTTP\/1\.1 400/, "the 400 was written into the event stream");
});

test("the answers made before any route (a bad %-escape, a head too long) carry nosniff, and no-store", async () => {
  const bad = open(
    `GET /api/files/%E0%A4%A HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${alice}\r\nConnection: close`,
  );
  await bad.closed;
  assert.match(bad.received(), /^HTTP\/1\.1 400 /);
  assert.match(bad.received(), /\r\nx-content-type-options: nosniff\r\n/i);
  assert.match(bad.received(), /\r\ncache-control: no-store\r\n/i);
  const long = open(`GET /api/files?cursor=${"1".repeat(20_000)} HTTP/1.1\r\nHost: 127.0.0.1`);
  await long.closed;
  assert.match(long.received(), /^HTTP\/1\.1 431 /);
  assert.match(long.received(), /\r\nx-content-type-options: nosniff\r\n/i);
});
