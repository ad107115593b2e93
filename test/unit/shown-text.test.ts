// How the dashboard (web/format.js: shownName) and the CLI (src/client/output.ts: shown, jsonLine,
// fitName) show text users and programs control: a character that is not seen as itself — a control,
// a bidirectional control, a zero-width or other default-ignorable character — is shown as its code
// point, ⟨U+202E⟩, by one rule in both, so a name never reads as another name; the characters that are
// part of a character that is seen (an emoji sequence, a joining script, a flag) stay.
import assert from "node:assert/strict";
import path from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";
import { problemLine } from "../../src/cli/client-follow.ts";
import { displayWidth, fitName, jsonLine, shown } from "../../src/client/output.ts";

const format = (await import(
  pathToFileURL(path.resolve(import.meta.dirname, "..", "..", "web", "format.js")).href
)) as { shownName(name: unknown): string };
const { shownName } = format;

test("a name with an invisible or bidi character reads as neither another name nor reversed", () => {
  const cases: [string, string][] = [
    // Reads "invoicepdf.csv" where the override is obeyed.
    ["invoice\u202efdp.csv", "invoice⟨U+202E⟩fdp.csv"],
    // Read "ab.csv", another file's name.
    ["a\u200bb.csv", "a⟨U+200B⟩b.csv"],
    ["a\u200cb.csv", "a⟨U+200C⟩b.csv"],
    ["a\u200db.csv", "a⟨U+200D⟩b.csv"],
    ["a\u2060b.csv", "a⟨U+2060⟩b.csv"],
    ["\ufeffab.csv", "⟨U+FEFF⟩ab.csv"],
    ["ab\u00ad.csv", "ab⟨U+00AD⟩.csv"],
    ["a\ufe0fb.csv", "a⟨U+FE0F⟩b.csv"],
    ["report1\ufe0f.csv", "report1⟨U+FE0F⟩.csv"],
    ["a\u{e0067}b.csv", "a⟨U+E0067⟩b.csv"],
    ["\u3164.csv", "⟨U+3164⟩.csv"],
    // Bidi marks and isolates: they reorder the neutral characters beside them.
    ["x\u200f.csv\u200e", "x⟨U+200F⟩.csv⟨U+200E⟩"],
    ["\u061c\u2066\u2067\u2068\u2069", "⟨U+061C⟩⟨U+2066⟩⟨U+2067⟩⟨U+2068⟩⟨U+2069⟩"],
    // Controls and separators (a program's message may hold them).
    [
      "evil\u001b]8;;http://x\u0007link\u001b]8;;\u0007",
      "evil⟨U+001B⟩]8;;http://x⟨U+0007⟩link⟨U+001B⟩]8;;⟨U+0007⟩",
    ],
    ["a\rb\bc\u009b2J\u2028d\n", "a⟨U+000D⟩b⟨U+0008⟩c⟨U+009B⟩2J⟨U+2028⟩d⟨U+000A⟩"],
  ];
  for (const [name, want] of cases) {
    assert.equal(shownName(name), want, `dashboard: ${JSON.stringify(name)}`);
    assert.equal(shown(name), want, `CLI: ${JSON.stringify(name)}`);
  }
  // A name that is already shown is shown the same again; nothing shown holds an unseen character.
  for (const [, want] of cases) assert.equal(shownName(want), want);
});

test("what is part of a character that is seen stays: emoji sequences, joining scripts, flags, accents", () => {
  const kept = [
    "👩\u200d💻 notes.csv",
    "👨\u200d👩\u200d👧.csv",
    "👩🏽\u200d🔬.csv",
    "🏳\ufe0f\u200d🌈.csv",
    "❤\ufe0f.csv",
    "1\ufe0f\u20e3.csv",
    "🏴\u{e0067}\u{e0062}\u{e0073}\u{e0063}\u{e0074}\u{e007f}.csv",
    // Persian (a zero-width non-joiner between letters), Hindi (a joiner after a virama).
    "می\u200cخواهم.csv",
    "क्\u200dष.csv",
    "葛\u{e0100}城.csv",
    "re\u0301sume\u0301 données β 漢字.csv",
  ];
  for (const name of kept) {
    assert.equal(shownName(name), name, `dashboard: ${JSON.stringify(name)}`);
    assert.equal(shown(name), name, `CLI: ${JSON.stringify(name)}`);
  }
});

test("the dashboard and the CLI show every code point alike, alone and between letters", () => {
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    const c = String.fromCodePoint(cp);
    for (const s of [c, `a${c}b`, `👩${c}💻`, `ب${c}ب`]) {
      const web = shownName(s);
      if (web !== shown(s)) assert.fail(`U+${cp.toString(16)} in ${JSON.stringify(s)}: ${web} / ${shown(s)}`);
    }
  }
});

test("JSON lines escape the unseen characters too, and parse to the same value", () => {
  const value = { kind: "file", name: "a\u200bb\u202e\u{e0067}\u2060\ufeff\u009b👩\u200d💻.csv" };
  const line = jsonLine(value);
  assert.equal(
    line,
    '{"kind":"file","name":"a\\u200bb\\u202e\\udb40\\udc67\\u2060\\ufeff\\u009b👩\\u200d💻.csv"}',
  );
  assert.deepEqual(JSON.parse(line), value);
});

test("a long name cut to fit a terminal keeps its end: the extension stays in view", () => {
  const name = `invoice-2026-${"x".repeat(60)}.pdf.exe`;
  const cut = fitName(name, 40);
  assert.equal(displayWidth(cut), 40);
  assert.match(cut, /^invoice-2026-x+…x+\.pdf\.exe$/);
  // Two names that differ only at the end stay apart.
  assert.notEqual(fitName(`${"r".repeat(60)}.csv`, 30), fitName(`${"r".repeat(60)}.csv.exe`, 30));
  // Wide characters and emoji are whole and counted as two columns.
  assert.equal(fitName("漢字漢字漢字漢字漢字漢字.csv", 11), "漢字漢….csv");
  assert.equal(fitName("😀😀😀😀😀😀", 7), "😀😀…😀");
  assert.equal(fitName("short.csv", 40), "short.csv");
  assert.equal(fitName("abcdef", 2), "a…");
  assert.equal(fitName("abcdef", 1), "…");
});

test("a failed run's line above the bars keeps a long name's end: x.csv.exe does not read as x.csv", () => {
  const name = `quarterly-report-${"x".repeat(80)}.csv.exe`;
  const line = problemLine(
    { runId: "10000000001", name, status: "failed", attempt: 1, errorCode: "ANALYSIS_FAILED" },
    false,
    80,
  );
  assert.ok(displayWidth(line) < 80, line);
  assert.match(line, /^failed {5}quarterly-report\S*…x+\.csv\.exe \(run 10000000001\): ANALYSIS_FAILED$/);
});

test("long runs of tags or marks take linear time (a previewed cell of 128,000 tags froze the page)", () => {
  // Unbounded lookbehinds scanned back over every earlier tag for each one: 64,000 took 8.6 s, so
  // 128,000 would take ~35 s. Bounded, well under a second (a hang guard, not a benchmark).
  const tags = String.fromCodePoint(0x1f3f4) + String.fromCodePoint(0xe0067).repeat(128_000);
  const marks = `ب${"\u0651".repeat(128_000)}\u200cب`;
  for (const [what, text] of [
    ["tags", tags],
    ["marks", marks],
  ] as const) {
    const started = performance.now();
    const out = shownName(text);
    const ms = performance.now() - started;
    assert.ok(ms < 5_000, `${what}: ${Math.round(ms)} ms`);
    assert.ok(out.length >= text.length, what);
  }
});
