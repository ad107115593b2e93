// The text a local file name's bytes are shown, labelled and stored under (nameText): UTF-8 as it
// is, each byte outside it as %XX — the same text for the same bytes, different text for different.
import assert from "node:assert/strict";
import { test } from "node:test";
import { nameText } from "../../src/client/inputs.ts";

const bytes = (...parts: (string | number[])[]) =>
  Buffer.concat(parts.map((p) => (typeof p === "string" ? Buffer.from(p) : Buffer.from(p))));

test("a name's bytes outside UTF-8 are %XX each, and UTF-8 around them is kept", () => {
  assert.equal(nameText(bytes("données ✓ 😀.csv")), "données ✓ 😀.csv");
  assert.equal(nameText(bytes("caf", [0xe9], ".csv")), "caf%E9.csv");
  assert.equal(nameText(bytes("é", [0xff, 0xfe], "😀")), "é%FF%FE😀");
  // An overlong encoding of "/", a surrogate (CESU-8), a sequence cut off at the end, a byte past
  // U+10FFFF's leads: none is UTF-8, each byte is shown.
  assert.equal(nameText(bytes([0xc0, 0xaf], "x")), "%C0%AFx");
  assert.equal(nameText(bytes([0xed, 0xa0, 0x80], "x")), "%ED%A0%80x");
  assert.equal(nameText(bytes("€", [0xe2, 0x82])), "€%E2%82");
  assert.equal(nameText(bytes([0xf5, 0x80, 0x80, 0x80])), "%F5%80%80%80");
  // A lead byte followed by an ASCII byte: the lead alone is shown, the ASCII byte kept.
  assert.equal(nameText(bytes([0xc3], "a.csv")), "%C3a.csv");
  // Names Node decodes alike stay apart.
  const decodedAlike = [bytes("caf", [0xe9]), bytes("caf", [0xea]), bytes("caf\ufffd")];
  assert.equal(new Set(decodedAlike.map((b) => b.toString())).size, 1);
  assert.equal(new Set(decodedAlike.map(nameText)).size, 3);
});
