// src/db/wire.ts: a pool connection's conversation followed message by message — the backend's pid,
// each ReadyForQuery, the answers owed — whatever way the bytes are cut into chunks.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Conversation } from "../../src/db/wire.ts";

/** A typed message: its type byte, its int32 length (counting itself) and its body. */
function msg(type: string, body: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(5);
  head.write(type, 0, "latin1");
  head.writeUInt32BE(4 + body.length, 1);
  return Buffer.concat([head, body]);
}

/** An untyped message of the client's first: its length, its code and the rest. */
function untyped(code: number, rest: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(8 + rest.length, 0);
  head.writeUInt32BE(code, 4);
  return Buffer.concat([head, rest]);
}

const int32s = (...n: number[]) => {
  const b = Buffer.alloc(4 * n.length);
  n.forEach((v, i) => void b.writeInt32BE(v, 4 * i));
  return b;
};

const STARTUP = untyped(196_608, Buffer.from("user\0assay\0database\0assay\0\0"));
const SSL_REQUEST = untyped(80_877_103);
const PID = 2_147_000_123;
/** What a server answers a start-up with: authentication done, parameters, its key, ready. */
const STARTED = Buffer.concat([
  msg("R", int32s(0)),
  msg("S", Buffer.from("server_version\x0017.1\0")),
  msg("K", int32s(PID, 987_654_321)),
  msg("Z", Buffer.from("I")),
]);
/** An extended-protocol statement as postgres.js writes one: Parse, Bind, Describe, Execute, Sync. */
const STATEMENT = Buffer.concat([
  msg("P", Buffer.from("s1\0select $1\0\0\0")),
  msg("B", Buffer.from("\0s1\0\0\0\0\x01\0\0\0\x01S")),
  msg("D", Buffer.from("P\0")),
  msg("E", Buffer.from("\0\0\0\0\0")),
  msg("S"),
]);
/** Its answer: a row whose bytes end like a ReadyForQuery, then the real one. */
const ROW_LIKE_READY = msg("D", Buffer.concat([Buffer.from([0, 1]), int32s(6), Buffer.from("Z\0\0\0\x05I")]));
const ANSWER = Buffer.concat([
  msg("1"),
  msg("2"),
  ROW_LIKE_READY,
  msg("C", Buffer.from("SELECT 1\0")),
  msg("Z", Buffer.from("I")),
]);

/** `bytes` cut into chunks at `cuts` (offsets). */
function cut(bytes: Buffer, cuts: number[]): Buffer[] {
  const at = [0, ...cuts.filter((c) => c > 0 && c < bytes.length).sort((a, b) => a - b), bytes.length];
  return at.slice(1).map((end, i) => bytes.subarray(at[i], end));
}

test("a start-up and two statements, cut at every offset: the pid, each answer owed and read", () => {
  const reads = Buffer.concat([STARTED, ANSWER, ANSWER]);
  for (let at = 0; at <= reads.length; at++) {
    let ready = 0;
    const talk = new Conversation(() => void ready++);
    for (const c of cut(STARTUP, [at % STARTUP.length])) talk.wrote(c);
    assert.equal(talk.owed, 1, "the start-up is owed its ReadyForQuery");
    for (const c of cut(STARTED, [at])) talk.got(c);
    assert.equal(talk.pid, PID);
    assert.deepEqual([talk.owed, ready], [0, 1]);
    for (const c of cut(Buffer.concat([STATEMENT, STATEMENT]), [at])) talk.wrote(c);
    assert.equal(talk.owed, 2);
    for (const c of cut(Buffer.concat([ANSWER, ANSWER]), [at])) talk.got(c);
    assert.deepEqual([talk.owed, ready, talk.lost], [0, 3, false], `cut at ${at}`);
  }
});

test("byte by byte, the same", () => {
  let ready = 0;
  const talk = new Conversation(() => void ready++);
  const each = (b: Buffer, f: (c: Buffer) => void) => {
    for (let i = 0; i < b.length; i++) f(b.subarray(i, i + 1));
  };
  each(STARTUP, (c) => talk.wrote(c));
  each(STARTED, (c) => talk.got(c));
  each(Buffer.concat([STATEMENT, msg("Q", Buffer.from("select 1\0"))]), (c) => talk.wrote(c));
  assert.equal(talk.owed, 2, "a Sync and a simple query");
  each(ANSWER, (c) => talk.got(c));
  assert.deepEqual([talk.pid, talk.owed, ready], [PID, 1, 2]);
});

test("a row whose bytes end like a ReadyForQuery is no answer", () => {
  let ready = 0;
  const talk = new Conversation(() => void ready++);
  talk.wrote(STARTUP);
  talk.got(STARTED);
  talk.wrote(STATEMENT);
  talk.got(Buffer.concat([msg("1"), msg("2"), ROW_LIKE_READY]));
  assert.deepEqual([talk.owed, ready], [1, 1]);
});

test("sslmode=prefer refused: the server's one-byte 'N', then the start-up in the clear", () => {
  const talk = new Conversation(() => {});
  talk.wrote(SSL_REQUEST);
  assert.equal(talk.owed, 0, "an SSLRequest is answered with a byte, not a ReadyForQuery");
  talk.got(Buffer.from("N"));
  talk.wrote(STARTUP);
  talk.got(STARTED);
  assert.deepEqual([talk.pid, talk.owed, talk.lost], [PID, 0, false]);
});

test("a CancelRequest is owed nothing", () => {
  const talk = new Conversation(() => {});
  talk.wrote(untyped(80_877_102, int32s(PID, 1)));
  assert.equal(talk.owed, 0);
});

test("a length out of range: the conversation is lost, and never followed again", () => {
  const talk = new Conversation(() => {});
  talk.wrote(STARTUP);
  const bad = Buffer.from([0x52, 0, 0, 0, 2]);
  talk.got(Buffer.concat([bad, STARTED]));
  assert.equal(talk.lost, true);
  assert.equal(talk.pid, undefined);
  assert.equal(talk.owed, 1);
  const written = new Conversation(() => {});
  written.lose();
  assert.equal(written.lost, true);
});

test("movedAt: set by the first ask after none was owed, and by each byte read while owed", async () => {
  const talk = new Conversation(() => {});
  talk.wrote(STARTUP);
  talk.got(STARTED);
  const idle = talk.movedAt;
  await new Promise((r) => setTimeout(r, 5));
  talk.got(msg("N", Buffer.from("notice\0")));
  assert.equal(talk.movedAt, idle, "a byte read while nothing is owed is no move");
  talk.wrote(STATEMENT);
  const asked = talk.movedAt;
  assert.ok(asked > idle);
  await new Promise((r) => setTimeout(r, 5));
  talk.wrote(STATEMENT);
  assert.equal(talk.movedAt, asked, "a second ask while one is owed is no move");
  talk.got(msg("1"));
  assert.ok(talk.movedAt > asked);
});

test("a Flush without a Sync (a statement's first Parse and Describe, a cursor's next page) waits until a message is read", () => {
  const talk = new Conversation(() => {});
  talk.wrote(STARTUP);
  talk.got(STARTED);
  talk.wrote(
    Buffer.concat([msg("P", Buffer.from("s2\0select $1\0\0\0")), msg("D", Buffer.from("Ss2\0")), msg("H")]),
  );
  assert.deepEqual([talk.owed, talk.waiting], [0, true]);
  talk.got(msg("1"));
  assert.equal(talk.waiting, false, "answered: ParseComplete");
  talk.wrote(Buffer.concat([msg("E", Buffer.from("\0\0\0\0\x64")), msg("H")]));
  assert.equal(talk.waiting, true);
  talk.got(msg("s"));
  assert.deepEqual([talk.owed, talk.waiting], [0, false]);
});

test("pacedSocket.silent: a connection waiting inside a transaction is listed like one outside", async () => {
  const { pacedSocket } = await import("../../src/db/client.ts");
  const net = await import("node:net");
  // A server that answers a start-up with its key and ReadyForQuery (status by the connection), then
  // reads what comes and answers nothing more.
  const statuses = ["T", "I"];
  const server = net.createServer((socket) => {
    const status = statuses.shift() ?? "I";
    socket.once("data", () =>
      socket.write(Buffer.concat([msg("K", int32s(PID, 1)), msg("Z", Buffer.from(status))])),
    );
    socket.on("error", () => {});
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as import("node:net").AddressInfo;
  const pacer = pacedSocket();
  const sockets: import("node:net").Socket[] = [];
  try {
    for (let i = 0; i < 2; i++) {
      const socket = await pacer({ host: ["127.0.0.1"], port: [port] });
      sockets.push(socket);
      await new Promise((resolve) => socket.once("connect", resolve));
      const ready = new Promise((resolve) => socket.once("data", resolve));
      socket.write(STARTUP);
      await ready;
      socket.write(msg("Q", Buffer.from("select 1\0")));
    }
    const silent = pacer.silent(0);
    assert.deepEqual(
      silent.map((c) => c.socket),
      sockets,
      "the one inside a transaction and the one outside (bin/patch-deps.js makes closing either safe)",
    );
  } finally {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
