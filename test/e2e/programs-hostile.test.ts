// Inputs that once made the three programs' time quadratic, run by the production registry through the
// process runner: a regular expression that backtracked over a long run of digits (the number pattern
// [0-9]+\.?[0-9]*, which can split n digits n ways) or of spaces (a trim's [ \t\r\n]+$, retried at
// every space of a run inside a cell), and duplicate-name checks that compared every column with every
// other. Each takes the programs a few seconds at most now. Measured on the old scripts: summary 175 s
// on the digits, over 300 s on the spaces, 198 s on the columns; python-stats 739 s on a 200,000-digit
// cell, 453 s on 200,000 columns; r-report 259 s on 200,000 spaces (its number pattern gave up on the
// digits: "PCRE error 'match limit exceeded'"). The time limit is a hang guard with a wide margin, not a
// timing assertion; each test checks the result too.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, describe, test } from "node:test";
import { findPrograms, type Program } from "../../src/analyses/programs.ts";
import type { ProcessResult } from "../../src/runner/run-process.ts";
import { runProgram } from "../helpers/runner.ts";

/** A run past this is a hang: the old scripts took minutes on these inputs, the new ones seconds. */
const HANG_GUARD_MS = 120_000;

const work = fs.mkdtempSync(path.join(os.tmpdir(), "assay-hostile-"));
after(() => fs.rmSync(work, { recursive: true, force: true }));
const found = findPrograms({});
const program = (type: string) => found.available.find((p) => p.type === type);

async function run(p: Program, input: string, params: unknown): Promise<{ r: ProcessResult; out: string }> {
  const ran = await runProgram(p, work, input, params, { timeoutMs: HANG_GUARD_MS });
  assert.equal(ran.r.timedOut, false, `${p.type} ran past ${HANG_GUARD_MS / 1000} s: a hang`);
  assert.equal(ran.r.protocolError, undefined);
  return ran;
}

function file(name: string, content: () => string): string {
  const p = path.join(work, name);
  if (!fs.existsSync(p)) fs.writeFileSync(p, content());
  return p;
}

const readJson = (out: string, name: string) => JSON.parse(fs.readFileSync(path.join(out, name), "utf8"));
const report = (out: string) => fs.readFileSync(path.join(out, "report.html"), "utf8");

const DIGITS = "1".repeat(200_000);
const SPACES = " ".repeat(600_000);
const COLUMNS = 400_000;
// 400,000 columns, one row: a number in every thousandth column (c0 = 0 … c399000 = 399), text elsewhere
const wide = (names: string[]) =>
  `${names.join(",")}\n${names.map((_, i) => (i % 1000 === 0 ? i / 1000 : "x")).join(",")}\n`;
const names = Array.from({ length: COLUMNS }, (_, i) => `c${i}`);

const inputs = {
  // a 200,000-digit run that is not a number (text), one that is (beyond the double range: missing,
  // and counted), and a number after them
  digits: () => file("digits.csv", () => `n,t,big\n1,${DIGITS}x,${DIGITS}\n2,y,5\n`),
  // a number padded with 600,000 spaces on each side, and a text cell with 600,000 spaces inside
  spaces: () => file("spaces.csv", () => `n,t\n${SPACES}5${SPACES},x${SPACES}y\n7,z\n`),
  wide: () => file("wide.csv", () => wide(names)),
  // the same, its last name repeating the first
  wideDuplicate: () => file("wide-duplicate.csv", () => wide([...names.slice(0, -1), "c0"])),
};
const skipUnless = (type: string) =>
  program(type) || process.env.CI === "true" ? false : `${type} is not available on this machine`;

describe("summary on inputs that were quadratic", { skip: skipUnless("summary") }, () => {
  const p = () => program("summary") as Program;
  test("a 200,000-digit cell: text with a letter after it, missing (beyond the double range) without", async () => {
    const { r, out } = await run(p(), inputs.digits(), {});
    assert.equal(r.exitCode, 0, r.stderrTail);
    const [n, t, big] = readJson(out, "summary.json").columns;
    assert.deepEqual(n, { name: "n", type: "number", nonNull: 2, min: 1, max: 2, mean: 1.5 });
    assert.deepEqual(t, { name: "t", type: "string", nonNull: 2 });
    assert.deepEqual(big, {
      name: "big",
      type: "number",
      nonNull: 1,
      min: 5,
      max: 5,
      mean: 5,
      notes: ["1 NaN/Infinity values treated as missing"],
    });
  });

  test("600,000 spaces around a number and inside a text cell", async () => {
    const { r, out } = await run(p(), inputs.spaces(), {});
    assert.equal(r.exitCode, 0, r.stderrTail);
    const [n, t] = readJson(out, "summary.json").columns;
    assert.deepEqual(n, { name: "n", type: "number", nonNull: 2, min: 5, max: 7, mean: 6 });
    assert.equal(t.type, "string");
  });

  test("a 400,000-column header: every column read; a repeated name → exit 3", async () => {
    const { r, out } = await run(p(), inputs.wide(), {});
    assert.equal(r.exitCode, 0, r.stderrTail);
    assert.deepEqual(r.result?.metrics, { rows: 1, columns: COLUMNS, numericColumns: COLUMNS / 1000 });
    const s = readJson(out, "summary.json");
    assert.deepEqual(s.columns[COLUMNS - 1000], {
      name: `c${COLUMNS - 1000}`,
      type: "number",
      nonNull: 1,
      min: 399,
      max: 399,
      mean: 399,
    });
    assert.deepEqual(s.columns[COLUMNS - 1], { name: `c${COLUMNS - 1}`, type: "string", nonNull: 1 });
    const dup = await run(p(), inputs.wideDuplicate(), {});
    assert.equal(dup.r.exitCode, 3);
    assert.match(dup.r.stderrTail, /duplicate column name: c0\b/);
  });
});

describe("python-stats on inputs that were quadratic", { skip: skipUnless("python-stats") }, () => {
  const p = () => program("python-stats") as Program;
  test("a 200,000-digit cell: text with a letter after it, missing (beyond the double range) without", async () => {
    const { r, out } = await run(p(), inputs.digits(), { method: "median" });
    assert.equal(r.exitCode, 0, r.stderrTail);
    const s = readJson(out, "stats.json");
    assert.deepEqual(s.columns, { n: 1.5, big: 5 });
    assert.deepEqual(s.counts, { n: 2, big: 1 });
    assert.deepEqual(s.notes, { big: ["1 NaN/Infinity values treated as missing"] });
  });

  test("600,000 spaces around a number and inside a text cell", async () => {
    const { r, out } = await run(p(), inputs.spaces(), { method: "mean" });
    assert.equal(r.exitCode, 0, r.stderrTail);
    assert.deepEqual(readJson(out, "stats.json").columns, { n: 6 });
  });

  test("a 400,000-column header: every column read; a repeated name → exit 3", async () => {
    const { r, out } = await run(p(), inputs.wide(), { method: "max" });
    assert.equal(r.exitCode, 0, r.stderrTail);
    const s = readJson(out, "stats.json");
    assert.equal(Object.keys(s.columns).length, COLUMNS / 1000);
    assert.equal(s.columns.c0, 0);
    assert.equal(s.columns[`c${COLUMNS - 1000}`], 399);
    // The columns left out, each with its first text cell.
    assert.equal(Object.keys(s.notNumeric).length, COLUMNS - COLUMNS / 1000);
    assert.deepEqual(s.notNumeric[`c${COLUMNS - 1}`], { record: 2, text: "x" });
    assert.equal(r.result?.metrics.notNumeric, COLUMNS - COLUMNS / 1000);
    const dup = await run(p(), inputs.wideDuplicate(), { method: "max" });
    assert.equal(dup.r.exitCode, 3);
    assert.match(dup.r.stderrTail, /duplicate column name: c0\n/);
  });
});

describe("r-report on inputs that were quadratic", { skip: skipUnless("r-report") }, () => {
  const p = () => program("r-report") as Program;
  test("a 200,000-digit cell: text with a letter after it, missing (beyond the double range) without", async () => {
    const { r, out } = await run(p(), inputs.digits(), {});
    assert.equal(r.exitCode, 0, r.stderrTail);
    assert.doesNotMatch(r.stderrTail, /PCRE|warning/i, "a regular expression gave up");
    const html = report(out);
    assert.match(html, /<p>2 rows, 3 columns, 2 numeric\.<\/p>/);
    assert.match(html, /<tr><td>n<\/td><td>2<\/td><td>1\.5<\/td>/);
    assert.match(html, /<tr><td>big<\/td><td>1<\/td><td>5<\/td>.*1 NaN\/Infinity values treated as missing/);
  });

  test("600,000 spaces around a number and inside a text cell", async () => {
    const { r, out } = await run(p(), inputs.spaces(), {});
    assert.equal(r.exitCode, 0, r.stderrTail);
    const html = report(out);
    assert.match(html, /<p>2 rows, 2 columns, 1 numeric\.<\/p>/);
    assert.match(html, /<tr><td>n<\/td><td>2<\/td><td>6<\/td>/);
  });

  test("a 400,000-column header: every column read; a repeated name → exit 3", async () => {
    const { r, out } = await run(p(), inputs.wide(), {});
    assert.equal(r.exitCode, 0, r.stderrTail);
    assert.deepEqual(r.result?.metrics, {
      rows: 1,
      numericColumns: COLUMNS / 1000,
      notNumeric: COLUMNS - COLUMNS / 1000,
    });
    const html = report(out);
    assert.match(html, /<p>1 rows, 400000 columns, 400 numeric\.<\/p>/);
    // The columns left out, the first hundred named with their text cell, the rest counted.
    const left = /<p class="not-numeric">Not numeric \(a text cell leaves a column out\): (.*)\.<\/p>/.exec(
      html,
    )?.[1];
    assert.ok(left, "the not-numeric line");
    assert.equal(left.split("; ").length, 101);
    assert.match(left, new RegExp(`; and ${COLUMNS - COLUMNS / 1000 - 100} more$`));
    const dup = await run(p(), inputs.wideDuplicate(), {});
    assert.equal(dup.r.exitCode, 3);
    assert.match(dup.r.stderrTail, /duplicate column name: c0/);
  });

  test("600,000 numeric columns of two values: the table is formatted a batch of columns at a time", async () => {
    // Formatting one column at a time (format() per figure, a sort per column) cost ~250 µs a column:
    // 2.5 minutes here, 4 for a million columns.
    const columns = 600_000;
    const input = file("wide-numeric.csv", () => {
      const names = Array.from({ length: columns }, (_, i) => `n${i}`);
      return `${names.join(",")}\n${names.map((_, i) => i % 10).join(",")}\n${names.map((_, i) => -(i % 7)).join(",")}\n`;
    });
    const { r, out } = await run(p(), input, {});
    assert.equal(r.exitCode, 0, r.stderrTail);
    assert.deepEqual(r.result?.metrics, { rows: 2, numericColumns: columns });
    const html = report(out);
    // n599999: 9 and -1; n599998: 8 and 0
    assert.ok(
      html.includes(
        "<tr><td>n599999</td><td>2</td><td>4</td><td>7.07107</td><td>-1</td><td>4</td><td>9</td><td></td></tr>",
      ),
    );
    assert.ok(
      html.includes(
        "<tr><td>n599998</td><td>2</td><td>4</td><td>5.65685</td><td>0</td><td>4</td><td>8</td><td></td></tr>",
      ),
    );
    assert.equal(html.match(/<tr><td>n\d+<\/td>/g)?.length, columns);
  });
});
