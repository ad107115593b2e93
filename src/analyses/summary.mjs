#!/usr/bin/env node
// summary: a CSV with a header → rows, columns, per-column type, non-null count, and min/max/mean of
// numeric columns → summary.json. Node.js only, no dependencies; streams its input.
// Protocol: JSON Lines on stdout (progress, one result); exit 2 bad parameters, 3 unusable data.
import fs from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";

const emit = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);
const die = (code, message) => {
  process.stderr.write(`${message}\n`);
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

/** A streaming CSV record splitter (RFC 4180: quotes, doubled quotes, CRLF, newlines in quotes). */
function* records(text, state) {
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (state.quoted) {
      if (ch === '"') {
        if (text[i + 1] === '"') {
          state.field += '"';
          i++;
        } else if (i + 1 === text.length) {
          state.pendingQuote = true;
          state.quoted = false;
        } else state.quoted = false;
      } else state.field += ch;
      continue;
    }
    if (state.pendingQuote) {
      state.pendingQuote = false;
      if (ch === '"') {
        state.field += '"';
        state.quoted = true;
        continue;
      }
    }
    if (ch === '"' && state.field === "") state.quoted = true;
    else if (ch === ",") {
      state.row.push(state.field);
      state.field = "";
    } else if (ch === "\n") {
      state.row.push(state.field.endsWith("\r") ? state.field.slice(0, -1) : state.field);
      state.field = "";
      yield state.row;
      state.row = [];
    } else state.field += ch;
  }
}

const size = fs.statSync(args.input).size;
const state = { quoted: false, pendingQuote: false, field: "", row: [] };
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
    header = record.map((h) => h.trim());
    if (header.length === 0 || header.some((h) => h === "")) die(3, "the first line is not a CSV header");
    columns = header.map((name) => ({
      name,
      nonNull: 0,
      numeric: 0,
      text: 0,
      min: Infinity,
      max: -Infinity,
      sum: 0,
    }));
    return;
  }
  if (record.length === 1 && record[0] === "") return;
  if (record.length !== header.length)
    die(3, `line ${rows + 2}: ${record.length} fields, the header has ${header.length}`);
  rows++;
  for (let c = 0; c < record.length; c++) {
    const raw = record[c].trim();
    if (raw === "" || raw.toUpperCase() === "NA") continue;
    const col = columns[c];
    col.nonNull++;
    const n = Number(raw);
    if (Number.isFinite(n)) {
      col.numeric++;
      col.sum += n;
      if (n < col.min) col.min = n;
      if (n > col.max) col.max = n;
    } else col.text++;
  }
}

const stream = fs.createReadStream(args.input);
try {
  for await (const chunk of stream) {
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
if (state.quoted) die(3, "unterminated quoted field");
if (state.field !== "" || state.row.length > 0) consume([...state.row, state.field.replace(/\r$/, "")]);
if (!header) die(3, "the input is empty");
if (!columns.some((c) => c.numeric > 0 && c.text === 0)) die(3, "no numeric column");

const summary = {
  rows,
  columns: columns.map((c) => {
    const type = c.nonNull === 0 ? "empty" : c.text === 0 ? "number" : c.numeric === 0 ? "string" : "mixed";
    const base = { name: c.name, type, nonNull: c.nonNull };
    return type === "number" ? { ...base, min: c.min, max: c.max, mean: c.sum / c.numeric } : base;
  }),
};
emit({ type: "progress", percent: 95, message: "writing summary.json" });
fs.writeFileSync(path.join(args["output-dir"], "summary.json"), `${JSON.stringify(summary, null, 2)}\n`);
emit({
  type: "result",
  outputFileName: "summary.json",
  metrics: {
    rows,
    columns: columns.length,
    numericColumns: summary.columns.filter((c) => c.type === "number").length,
  },
});
