// The runner's pure parts, without a process or a database.
import assert from "node:assert/strict";
import { test } from "node:test";
import { JsonLinesReader, ProtocolError } from "../../src/runner/jsonl.ts";
import { RingBuffer } from "../../src/runner/ring-buffer.ts";

const b = (s: string) => Buffer.from(s);

test("JSON Lines: a line split across chunks is one event; CRLF, blank lines and a last unterminated line", () => {
  const r = new JsonLinesReader({ maxLineBytes: 1024, maxTotalBytes: 4096 });
  assert.deepEqual(r.push(b('{"type":"prog')), []);
  assert.deepEqual(r.push(b('ress","percent":5}\r\n\n{"type":"progress","percent":6,"message":"m"}\n')), [
    { type: "progress", percent: 5 },
    { type: "progress", percent: 6, message: "m" },
  ]);
  assert.deepEqual(r.push(b('{"type":"result","outputFileName":"a.json","metrics":{"rows":2}}')), []);
  assert.deepEqual(r.end(), [{ type: "result", outputFileName: "a.json", metrics: { rows: 2 } }]);
});

test("JSON Lines: an error event keeps its message, trimmed and cut at 500 characters", () => {
  const r = new JsonLinesReader({ maxLineBytes: 4096, maxTotalBytes: 8192 });
  assert.deepEqual(r.push(b('{"type":"error","message":"  column \\"é\\" is missing \\n"}\n')), [
    { type: "error", message: 'column "é" is missing' },
  ]);
  const [long] = r.push(b(`${JSON.stringify({ type: "error", message: "x".repeat(600) })}\n`));
  assert.equal(long?.type === "error" && long.message.length, 500);
  // Never half a character: 499 "x" and an emoji (two UTF-16 units) keep the 499 only.
  const [astral] = r.push(
    b(`${JSON.stringify({ type: "progress", percent: 1, message: `${"x".repeat(499)}😀` })}\n`),
  );
  assert.equal(astral?.type === "progress" && astral.message, "x".repeat(499));
});

test("JSON Lines: protocol violations", () => {
  const bad = (input: string, reason: ProtocolError["reason"]) => {
    const r = new JsonLinesReader({ maxLineBytes: 64, maxTotalBytes: 256 });
    assert.throws(
      () => r.push(b(input)),
      (err) => err instanceof ProtocolError && err.reason === reason,
      input,
    );
  };
  bad("not json\n", "invalid-json");
  bad("[1]\n", "invalid-event");
  bad('{"type":"log"}\n', "invalid-event");
  bad('{"type":"progress","percent":101}\n', "invalid-event");
  bad('{"type":"error"}\n', "invalid-event");
  bad('{"type":"error","message":" "}\n', "invalid-event");
  bad('{"type":"result","outputFileName":"x","metrics":{"a":"1"}}\n', "invalid-event");
  bad(`${"x".repeat(65)}`, "line-too-long");
  bad(`${'{"type":"progress","percent":1}\n'.repeat(10)}`, "output-too-large");
});

test("JSON Lines: UTF-8 only — a character split across chunks is one character, invalid bytes are a protocol error", () => {
  const r = new JsonLinesReader({ maxLineBytes: 1024, maxTotalBytes: 4096 });
  const line = b('{"type":"progress","percent":5,"message":"é€😀"}\n');
  const cut = line.indexOf(0xe2) + 1; // inside the three bytes of €
  assert.deepEqual(r.push(line.subarray(0, cut)), []);
  assert.deepEqual(r.push(line.subarray(cut)), [{ type: "progress", percent: 5, message: "é€😀" }]);
  const invalid = (...chunks: Buffer[]) => {
    const reader = new JsonLinesReader({ maxLineBytes: 1024, maxTotalBytes: 4096 });
    assert.throws(
      () => {
        for (const c of chunks) reader.push(c);
        reader.end();
      },
      (err) => err instanceof ProtocolError && err.reason === "invalid-json" && /UTF-8/.test(err.message),
    );
  };
  const progress = (bytes: number[]) =>
    Buffer.concat([b('{"type":"progress","percent":5,"message":"'), Buffer.from(bytes), b('"}')]);
  invalid(progress([0xff, 0xfe]), b("\n"));
  invalid(progress([0xc3])); // a character cut by the end of the stream, on the last line
  invalid(progress([0xed, 0xa0, 0x80]), b("\n")); // a surrogate encoded as UTF-8 (CESU-8)
});

test("ring buffer keeps the last bytes, oldest first, across wraps", () => {
  const ring = new RingBuffer(8);
  assert.equal(ring.contents().length, 0, "nothing written, nothing kept");
  assert.equal(ring.tail(3), "");
  ring.write(b(""));
  assert.equal(ring.contents().length, 0);
  ring.write(b("abc"));
  assert.equal(ring.contents().toString(), "abc");
  ring.write(b("defgh"));
  assert.equal(ring.contents().toString(), "abcdefgh");
  ring.write(b("ij"));
  assert.equal(ring.contents().toString(), "cdefghij");
  ring.write(b("0123456789"));
  assert.equal(ring.contents().toString(), "23456789");
  assert.equal(ring.tail(3), "789");
});
