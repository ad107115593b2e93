// The name an upload is stored under: one rule (src/files/file-name.ts) for the
// server (storedFileName) and the client's prediction of it (serverName), which must agree on hostile
// names — C1 controls, emoji, accents and flags at the 255-character cut, white space at the cut,
// lone surrogates.
import assert from "node:assert/strict";
import { test } from "node:test";
import { serverName } from "../../src/client/inputs.ts";
import { MAX_FILE_NAME_LENGTH, storedFileName } from "../../src/files/file-name.ts";

/** What the server's multipart parser hands over for a filename the client sent: UTF-8 decoded. */
const overTheWire = (name: string) => Buffer.from(name, "utf8").toString("utf8");

/** What no stored name holds: control characters, a slash. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: asserting no control characters
const UNSAFE = /[\u0000-\u001f\u007f-\u009f/]/;

const LONE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

test("C1 control characters are stripped by the client's prediction as by the server", () => {
  // U+009B is CSI: `\u009b2J` clears a terminal that prints the name.
  const label = "dir/a\u009b2J\u0085b\u0080\u009f.csv";
  assert.equal(storedFileName(label), "a2Jb.csv");
  assert.equal(serverName(label), "a2Jb.csv");
  assert.equal(serverName("\u001b[31mred\u007f.csv"), "[31mred.csv");
});

test("an emoji at the 255-character cut is dropped whole, never split", () => {
  // 254 + 2 code units: the cut falls inside the emoji.
  const split = `${"x".repeat(254)}😀.csv`;
  assert.equal(storedFileName(split), "x".repeat(254));
  assert.equal(serverName(split), "x".repeat(254));
  assert.ok(!LONE.test(serverName(split)), "no half of a surrogate pair");
  // 253 + 2: the emoji fits exactly.
  assert.equal(serverName(`${"x".repeat(253)}😀.csv`), `${"x".repeat(253)}😀`);
  assert.equal(serverName(`${"x".repeat(253)}😀.csv`).length, MAX_FILE_NAME_LENGTH);
  // Quotes travel as %22 and are stored as quotes (as %22 until 2026-12-07): the cut counts each as
  // one character, as the name on disk does.
  const quoted = `${'"'.repeat(80)}${"x".repeat(14)}😀.csv`;
  assert.equal(serverName(quoted), quoted);
  assert.equal(storedFileName(quoted.replaceAll('"', "%22")), quoted, "as the server reads it off the wire");
});

test("a backslash is part of a name but in a Windows path; %22 is a quote", () => {
  assert.equal(storedFileName("back\\slash.csv"), "back\\slash.csv");
  assert.equal(storedFileName("C:\\Users\\ann\\data.csv"), "data.csv");
  assert.equal(storedFileName("..\\..\\windows\\win.ini"), "win.ini");
  assert.equal(storedFileName(".\\data.csv"), "data.csv");
  assert.equal(storedFileName("...\\x.csv"), "...\\x.csv");
  assert.equal(storedFileName("\\\\server\\share\\data.csv"), "data.csv");
  // As the multipart parser hands a browser's UNC path over (its `\\` read as one backslash).
  assert.equal(storedFileName("\\server\\share\\data.csv"), "data.csv");
  assert.equal(storedFileName("report %22final%22 v2.csv"), 'report "final" v2.csv');
  assert.equal(serverName('dir/report "final" v2.csv'), 'report "final" v2.csv');
});

test("a character of several code points at the 255-character cut is dropped whole, never split", () => {
  const cases = [
    // A family emoji, woman ZWJ woman ZWJ girl (8 code units) at 248-255: the cut at 255 falls
    // inside the girl; cut before her, the name would end in a joiner.
    { label: `${"x".repeat(248)}👩‍👩‍👧.csv`, stored: "x".repeat(248), what: "a family emoji" },
    {
      label: `${"x".repeat(247)}👩‍👩‍👧.csv`,
      stored: `${"x".repeat(247)}👩‍👩‍👧`,
      what: "a family emoji that fits",
    },
    // e and a combining acute accent at 254-255: the accent is past the cut.
    { label: `${"x".repeat(254)}e\u0301.csv`, stored: "x".repeat(254), what: "an accented letter" },
    {
      label: `${"x".repeat(253)}e\u0301.csv`,
      stored: `${"x".repeat(253)}e\u0301`,
      what: "an accent that fits",
    },
    // A flag, two regional indicators (2 code units each), at 253-256: half a flag is another flag's
    // letter, or none.
    { label: `${"x".repeat(253)}🇫🇷.csv`, stored: "x".repeat(253), what: "a flag" },
    { label: `${"x".repeat(249)}🇫🇷🇫🇷.csv`, stored: `${"x".repeat(249)}🇫🇷`, what: "a second flag" },
    // White space before the dropped character is trimmed, as a second pass would.
    {
      label: `${"x".repeat(250)} e\u0301e\u0301e\u0301`,
      stored: `${"x".repeat(250)} e\u0301e\u0301`,
      what: "accents after a space",
    },
    { label: `${"x".repeat(252)} 👩‍👩‍👧`, stored: "x".repeat(252), what: "a space before a family emoji" },
  ];
  for (const { label, stored, what } of cases) {
    assert.equal(storedFileName(label), stored, what);
    assert.equal(serverName(label), stored, what);
    assert.equal(storedFileName(overTheWire(stored)), stored, `${what}: the server keeps the client's name`);
    assert.equal(storedFileName(stored), stored, `${what}: idempotent`);
  }
  // One character longer than the limit by itself (a letter under 300 accents) is cut between its
  // code points rather than lost.
  const zalgo = storedFileName(`a${"\u0301".repeat(300)}.csv`);
  assert.equal(zalgo, `a${"\u0301".repeat(254)}`);
  assert.equal(storedFileName(zalgo), zalgo);
});

test("white space and dots left at the cut are handled as a second pass would", () => {
  // Cut to 255, the name would end in a space, which the server's second pass (over what the
  // client sent) would trim: the rule trims it at once.
  assert.equal(storedFileName(`${"x".repeat(254)} y.csv`), "x".repeat(254));
  assert.equal(storedFileName(`.${" ".repeat(300)}x`), "upload");
  assert.equal(storedFileName(" .. "), "upload");
  // After the last slash; a backslash is a name's, but in a Windows path.
  assert.equal(storedFileName("a\\b/..\\c.csv"), "c.csv");
  assert.equal(storedFileName("a/b/ \u0007\\\\server\\..\\ c.csv"), "c.csv");
  assert.equal(storedFileName("\ud800x.csv"), "\ufffdx.csv", "a lone surrogate is what UTF-8 makes of it");
});

/** A deterministic pseudo-random generator (mulberry32). */
function random(seed: number) {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PIECES = [
  "a",
  "é",
  "漢",
  "😀",
  "👩‍👩‍👧",
  "🇫🇷",
  "e\u0301",
  " ",
  "\u00a0",
  "\u3000",
  ".",
  "..",
  "/",
  "\\",
  '"',
  "%22",
  "\u0000",
  "\u0007",
  "\r\n",
  "\u001b[2J",
  "\u007f",
  "\u0085",
  "\u009b",
  "\u202e",
  "\ud83d",
  "\ude00",
  "\ufeff",
  "x".repeat(100),
];

test("the client's name is the server's for every name, and the rule is idempotent", () => {
  const next = random(20_261_201);
  for (let i = 0; i < 5_000; i++) {
    const parts: string[] = [];
    const n = Math.floor(next() * 12);
    for (let k = 0; k < n; k++) parts.push(PIECES[Math.floor(next() * PIECES.length)] as string);
    const label = parts.join("");
    const predicted = serverName(label);
    // What the server stores is the rule applied to what arrives: the client's name, as UTF-8.
    const stored = storedFileName(overTheWire(predicted));
    assert.equal(stored, predicted, `label ${JSON.stringify(label)}`);
    assert.equal(storedFileName(predicted), predicted, "idempotent");
    assert.ok(predicted.length >= 1 && predicted.length <= MAX_FILE_NAME_LENGTH);
    assert.ok(!LONE.test(predicted), "well-formed");
    assert.ok(!UNSAFE.test(predicted), `nothing unsafe in ${JSON.stringify(predicted)}`);
  }
});
