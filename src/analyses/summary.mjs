#!/usr/bin/env node
// summary: a CSV with a header → rows, columns, per-column type, non-null count, and min/max/mean of
// numeric columns → summary.json. Node.js only, no dependencies; streams its input.
// Protocol: JSON Lines on stdout (progress, one result); exit 2 bad parameters, 3 unusable data.
// CSV rules shared with python_stats.py and r_report.R (test/e2e/programs.test.ts has the table):
// UTF-8 only (a leading byte-order mark is dropped), RFC 4180 quoting, LF or CRLF line ends, blank
// lines ignored, every record as long as the header; cells are trimmed of spaces, tabs, CR and LF;
// "" and NA are missing; NaN/Inf/Infinity (any case, signed) and numbers beyond the double range are
// missing too and counted in a note; a column is numeric when it has a number and no text. A
// statistic that a double cannot hold is null, with the note "<statistic> overflows" in its column.
// summary.json must fit in an output file (the runner's limit, OUTPUT_LIMITS in src/runner/outputs.ts):
// a header that would make it larger (too many columns, too long names) is unusable data, exit 3.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { getSystemErrorMessage, parseArgs } from "node:util";

const emit = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);
/** The most of a failure's message the runner keeps (MAX_MESSAGE_CHARS in src/runner/jsonl.ts). */
const ERROR_CHARS = 500;
/**
 * Exit `code` (2 bad parameters, 3 unusable data), saying why: on stderr, and in an error event whose
 * message the run's errorMessage shows to the user (stdout is a pipe: written before the exit).
 */
const die = (code, message) => {
  process.stderr.write(`${message}\n`);
  emit({ type: "error", message: Array.from(message).slice(0, ERROR_CHARS).join("") });
  process.exit(code);
};

let args;
try {
  args = parseArgs({
    options: { input: { type: "string" }, "output-dir": { type: "string" }, params: { type: "string" } },
    strict: true,
  }).values;
} catch (err) {
  die(2, `bad arguments: ${err.message}`);
}
if (!args.input || !args["output-dir"]) die(2, "--input and --output-dir are required");
let params;
try {
  params = JSON.parse(args.params ?? "{}");
} catch {
  die(2, "--params is not JSON");
}
if (
  typeof params !== "object" ||
  params === null ||
  Array.isArray(params) ||
  Object.keys(params).length > 0
) {
  die(2, "summary takes no parameters");
}

/**
 * A streaming CSV record splitter (RFC 4180: quotes, doubled quotes, newlines in quotes; LF or CRLF
 * line ends). A quote opens a quoted field only as its first character, elsewhere it is literal; after
 * a closing quote only a comma or a line end may follow; a CR must be followed by LF (exit 3 if not).
 */
const FIELD_START = 0;
const UNQUOTED = 1;
const QUOTED = 2;
const QUOTE_IN_QUOTED = 3; // a quote inside a quoted field: the end of the field, or the first of ""
const AFTER_CR = 4;

function* records(text, state) {
  // Fields are built from slices of `text` (a field that spans chunks from a slice of each): appending
  // one character at a time made a 100 MB field a chain of 100 million one-character strings (~3.5 GB).
  const n = text.length;
  let i = 0;
  while (i < n) {
    switch (state.mode) {
      case QUOTED: {
        const q = text.indexOf('"', i);
        if (q === -1) {
          state.field += text.slice(i);
          return;
        }
        if (q > i) state.field += text.slice(i, q);
        state.mode = QUOTE_IN_QUOTED;
        i = q + 1;
        continue;
      }
      case AFTER_CR:
        if (text[i] !== "\n") die(3, "malformed CSV: a CR not followed by LF");
        i++;
        yield endRecord(state);
        continue;
      case QUOTE_IN_QUOTED: {
        const ch = text[i];
        if (ch === '"') {
          state.field += '"';
          state.mode = QUOTED;
          i++;
          continue;
        }
        if (ch !== "," && ch !== "\n" && ch !== "\r") die(3, "malformed CSV: text after a closing quote");
        break;
      }
      default:
        if (text[i] === '"' && state.mode === FIELD_START) {
          state.mode = QUOTED;
          i++;
          continue;
        }
    }
    const ch = text[i];
    if (ch === ",") {
      state.row.push(state.field);
      state.field = "";
      state.mode = FIELD_START;
      i++;
    } else if (ch === "\n") {
      i++;
      yield endRecord(state);
    } else if (ch === "\r") {
      state.mode = AFTER_CR;
      i++;
    } else {
      // unquoted text (a quote here is a literal character) up to the next comma, LF or CR
      let j = i + 1;
      while (j < n) {
        const c = text.charCodeAt(j);
        if (c === 44 || c === 10 || c === 13) break;
        j++;
      }
      state.field += text.slice(i, j);
      state.mode = UNQUOTED;
      i = j;
    }
  }
}

function endRecord(state) {
  const row = state.row;
  row.push(state.field);
  state.row = [];
  state.field = "";
  state.mode = FIELD_START;
  return row;
}

// Spaces, tabs, CR and LF off both ends, found by scanning indexes (the regular expression
// /[ \t\r\n]+$/ retried at every space of a run inside a cell: O(n²) on 50,000 spaces).
const isSpace = (c) => c === 32 || c === 9 || c === 13 || c === 10;
function trim(s) {
  let start = 0;
  let end = s.length;
  while (start < end && isSpace(s.charCodeAt(start))) start++;
  while (end > start && isSpace(s.charCodeAt(end - 1))) end--;
  return start === 0 && end === s.length ? s : s.slice(start, end);
}
// Unambiguous: the digits before a dot can be split only one way (the old [0-9]+\.?[0-9]* could split
// a run of n digits n ways, so a long digit run that is not a number took O(n²) to refuse).
const NUMBER = /^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$/;
const NON_FINITE = /^[+-]?(nan|inf|infinity)$/i;

/** A power of two near |x|, so that x / scale is exact and at least 1, below 2 (x ≠ 0). */
function scaleOf(x) {
  const e = Math.min(Math.max(Math.floor(Math.log2(Math.abs(x))), -1074), 1023);
  let scale = 2 ** e;
  if (Math.abs(x) / scale >= 2 && e < 1023) scale *= 2;
  else if (Math.abs(x) / scale < 1 && e > -1074) scale /= 2;
  return scale;
}

/**
 * Adds y to a column's compensated sum (Neumaier's variant of Kahan's summation): `compensation` gathers
 * what each addition to `scaledSum` rounded off (exactly: the error of a double addition is a double),
 * so that `scaledSum + compensation` is the sum as if added in twice the precision, then rounded. In
 * plain doubles a mean of ten 0.1s was 0.09999999999999999 and of a million 0.1000000000013329.
 * python_stats.py (Column.add) and r_report.R (compensated_sums) add in the same order, alike.
 */
function addScaled(col, y) {
  const s = col.scaledSum;
  const t = s + y;
  col.compensation += Math.abs(s) >= Math.abs(y) ? s - t + y : y - t + s;
  col.scaledSum = t;
}

/** The most an output file may be (OUTPUT_LIMITS.maxFileBytes in src/runner/outputs.ts). */
const MAX_OUTPUT_BYTES = 100 * 1024 * 1024;
// What a column takes in summary.json at least, besides its name: an "empty" column's 72 bytes.
const MIN_COLUMN_BYTES = 72;
const tooLarge = (bytes) =>
  die(
    3,
    `summary.json would be at least ${Math.floor(bytes / 1024 / 1024)} MiB, ` +
      "more than the 100 MiB an output file may be: too many columns or too long column names",
  );

let size;
try {
  size = fs.statSync(args.input).size;
} catch (err) {
  die(2, `cannot read the input: ${err.code ?? err.message}`);
}
const state = { mode: FIELD_START, field: "", row: [] };
const decoder = new TextDecoder("utf-8", { fatal: true });
let header;
let rows = 0;
let columns;
let read = 0;
let nextProgress = 5;
emit({ type: "progress", percent: 0, message: "reading input" });

function consume(record) {
  if (record.length === 1 && record[0] === "" && !header) return;
  if (!header) {
    header = record.map(trim);
    const unnamed = header.indexOf("");
    if (unnamed >= 0) die(3, `the first line is not a CSV header: its column ${unnamed + 1} has no name`);
    const seen = new Set(); // (indexOf per name was O(n²): 38 s for 200,000 columns)
    for (const h of header) {
      if (seen.has(h)) die(3, `duplicate column name: ${h}`);
      seen.add(h);
    }
    // Known from the header alone: refused before any row is read (1.2 million columns took 1.1 GB).
    let atLeast = 0;
    for (const h of header) atLeast += MIN_COLUMN_BYTES + Buffer.byteLength(JSON.stringify(h)) - 2;
    if (atLeast > MAX_OUTPUT_BYTES) tooLarge(atLeast);
    // The sum is kept divided by `scale`, a power of two near the largest magnitude seen: exact, and
    // it cannot overflow where the mean is representable (1.7e308 twice has the mean 1.7e308). It is
    // a compensated (Neumaier) sum, `scaledSum + compensation` (see addScaled), as python-stats and
    // r-report add theirs.
    columns = header.map((name) => ({
      name,
      nonNull: 0,
      numeric: 0,
      text: 0,
      nonFinite: 0,
      firstText: null,
      min: Infinity,
      max: -Infinity,
      scale: 0,
      scaledSum: 0,
      compensation: 0,
    }));
    return;
  }
  if (record.length === 1 && record[0] === "") return;
  if (record.length !== header.length)
    die(3, `record ${rows + 2}: ${record.length} fields, the header has ${header.length}${separatorHint()}`);
  rows++;
  for (let c = 0; c < record.length; c++) {
    const raw = trim(record[c]);
    if (raw === "" || (raw.length <= 2 && raw.toUpperCase() === "NA")) continue; // (toUpperCase copies)
    const col = columns[c];
    const n = NUMBER.test(raw) ? Number(raw) : Number.NaN;
    if (Number.isFinite(n)) {
      col.nonNull++;
      col.numeric++;
      if (n !== 0 && (col.scale === 0 || Math.abs(n) >= 2 * col.scale)) {
        const scale = scaleOf(n);
        col.scaledSum *= col.scale / scale;
        col.compensation *= col.scale / scale;
        col.scale = scale;
      }
      if (n !== 0) addScaled(col, n / col.scale);
      if (n < col.min) col.min = n;
      if (n > col.max) col.max = n;
    } else if (NUMBER.test(raw) || NON_FINITE.test(raw)) col.nonFinite++;
    else {
      // Its first text cell says why a column with numbers is not numeric (record numbers as
      // python-stats and r-report count them: the header is 1, blank lines are not counted).
      if (col.text === 0) col.firstText = [rows + 1, raw];
      col.nonNull++;
      col.text++;
    }
  }
}

/**
 * Why a file of one column may not be one: its header holds tabs or semicolons and no comma (a TSV, or
 * a spreadsheet's export where the comma is the decimal mark). Said after an error such a file meets.
 */
function separatorHint() {
  if (header.length !== 1) return "";
  const [name] = header;
  const by = name.includes("\t") ? "tabs" : name.includes(";") ? "semicolons" : undefined;
  return by ? ` (the header is split by ${by}, not commas: only comma-separated files are read)` : "";
}

/**
 * UTF-16 without a byte-order mark, by its first bytes (up to 64): no zero in the low bytes (every
 * other byte: the even ones little-endian, the odd ones big-endian), and a zero in at least half of
 * the high bytes, as text mostly of Latin letters is (it read "the input is binary"; python_stats.py
 * and r_report.R look alike).
 */
function utf16WithoutMark(start) {
  const n = Math.min(start.length, 64) & ~1;
  if (n < 4) return false;
  return [1, 0].some((high) => {
    let zeros = 0;
    for (let i = 0; i < n; i++) {
      if (i % 2 !== high) {
        if (start[i] === 0) return false;
      } else if (start[i] === 0) zeros++;
    }
    return 2 * zeros >= n / 2;
  });
}

/** What a file that is no UTF-8 text is, by its first bytes, for the message that refuses it. */
function notText(start) {
  if ((start[0] === 0xff && start[1] === 0xfe) || (start[0] === 0xfe && start[1] === 0xff))
    return 'the input is UTF-16 text, not UTF-8: save it as UTF-8 ("CSV UTF-8")';
  if (utf16WithoutMark(start))
    return 'the input is UTF-16 text (without a byte-order mark), not UTF-8: save it as UTF-8 ("CSV UTF-8")';
  if (start[0] === 0x1f && start[1] === 0x8b) return "the input is gzip-compressed: decompress it first";
  if (start[0] === 0x50 && start[1] === 0x4b && start[2] === 0x03 && start[3] === 0x04)
    return "the input is a zip archive (an Excel .xlsx workbook is one), not CSV: export it as CSV";
  return undefined;
}

const stream = fs.createReadStream(args.input);
try {
  for await (const chunk of stream) {
    if (read === 0) {
      const why = notText(chunk);
      if (why) die(3, why);
    }
    read += chunk.length;
    if (chunk.includes(0)) die(3, "the input is binary, not CSV");
    let text;
    try {
      text = decoder.decode(chunk, { stream: true });
    } catch {
      die(3, "the input is not UTF-8 text");
    }
    for (const record of records(text, state)) consume(record);
    const percent = Math.floor((read / Math.max(size, 1)) * 90);
    if (percent >= nextProgress) {
      emit({ type: "progress", percent, message: `read ${rows} rows` });
      nextProgress = percent + 5;
    }
  }
} catch (err) {
  die(2, `cannot read the input: ${err.code ?? err.message}`);
}
let rest;
try {
  rest = decoder.decode(); // the end of the input: an incomplete UTF-8 sequence is an error
} catch {
  die(3, "the input is not UTF-8 text");
}
for (const record of records(rest, state)) consume(record);
if (state.mode === QUOTED) die(3, "unterminated quoted field");
if (state.mode !== FIELD_START || state.row.length > 0) consume(endRecord(state));
if (!header) die(3, "the input is empty");
if (rows === 0) die(3, "the input has a header and no rows");
if (!columns.some((c) => c.numeric > 0 && c.text === 0)) die(3, `no numeric column${separatorHint()}`);

const summary = {
  rows,
  columns: columns.map((c) => {
    const type = c.nonNull === 0 ? "empty" : c.text === 0 ? "number" : c.numeric === 0 ? "string" : "mixed";
    const base = { name: c.name, type, nonNull: c.nonNull };
    const notes = [];
    let stats = {};
    if (type === "number") {
      // Within [min, max] whatever the rounding (a constant column's mean is its value).
      const sum = c.scaledSum + c.compensation;
      const mean = Math.min(Math.max((sum / c.numeric) * (c.scale || 1), c.min), c.max);
      if (!Number.isFinite(mean)) notes.push("mean overflows");
      stats = { min: c.min, max: c.max, mean: Number.isFinite(mean) ? mean : null };
    }
    if (type === "mixed" && c.firstText)
      notes.push(
        `not numeric: record ${c.firstText[0]} holds ${JSON.stringify([...c.firstText[1]].slice(0, 40).join(""))}`,
      );
    if (c.nonFinite > 0) notes.push(`${c.nonFinite} NaN/Infinity values treated as missing`);
    return { ...base, ...stats, ...(notes.length > 0 ? { notes } : {}) };
  }),
};
const json = `${JSON.stringify(summary, null, 2)}\n`;
if (Buffer.byteLength(json) > MAX_OUTPUT_BYTES) tooLarge(Buffer.byteLength(json));
emit({ type: "progress", percent: 95, message: "writing summary.json" });
try {
  fs.writeFileSync(path.join(args["output-dir"], "summary.json"), json);
} catch (err) {
  // A full disk or a quota: the worker's to mend, so exit 4 (retried), not a crash (exit 1, for good).
  // The system's reason without the path (util.getSystemErrorMessage: "no space left on device").
  // libuv has no name for EDQUOT (its message would be "Unknown system error -122").
  const reason =
    err?.errno === -os.constants.errno.EDQUOT
      ? "disk quota exceeded"
      : typeof err?.errno === "number"
        ? getSystemErrorMessage(err.errno)
        : "an error";
  die(4, `could not write summary.json: ${reason}`);
}
emit({
  type: "result",
  outputFileName: "summary.json",
  metrics: {
    rows,
    columns: columns.length,
    numericColumns: summary.columns.filter((c) => c.type === "number").length,
  },
});
