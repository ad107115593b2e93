// The three production programs against the runner's limits on what a run may output (OUTPUT_LIMITS:
// 100 MiB a file). An output is about as large as the input's header can make it — a line per column
// in summary.json, each name twice in stats.json (escaped: "名" is "\u540d"), three times in the
// report (escaped: "&" is "&amp;") — so a CSV of a few MiB could make one larger than that. The program
// then exited 0, and the run failed ANALYSIS_OUTPUT_INVALID ("an output file is too large"), as if the
// program had broken the protocol; it is the data that cannot be analysed: exit 3, before writing.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { findPrograms, type Program } from "../../src/analyses/programs.ts";
import { OUTPUT_LIMITS } from "../../src/runner/outputs.ts";
import type { ProcessResult } from "../../src/runner/run-process.ts";
import { runProgram } from "../helpers/runner.ts";

const work = fs.mkdtempSync(path.join(os.tmpdir(), "assay-output-limits-"));
after(() => fs.rmSync(work, { recursive: true, force: true }));
const found = findPrograms({});
const program = (type: string) => found.available.find((p) => p.type === type);
const skipUnless = (type: string) =>
  program(type) || process.env.CI === "true" ? false : `${type} is not available on this machine`;

async function run(type: string, input: string, params: unknown): Promise<{ r: ProcessResult; out: string }> {
  const ran = await runProgram(program(type) as Program, work, input, params, { timeoutMs: 120_000 });
  assert.equal(ran.r.protocolError, undefined);
  return ran;
}

function assertRefused(r: ProcessResult, out: string) {
  assert.equal(r.exitCode, 3, r.stderrTail);
  assert.match(r.stderrTail, /more than the 100 MiB an output file may be/);
  assert.deepEqual(fs.readdirSync(out), [], "nothing written");
}

test("the programs' limit is the runner's", () => {
  assert.equal(OUTPUT_LIMITS.maxFileBytes, 100 * 1024 * 1024);
});

test("summary: 1,500,000 columns (a 25 MB CSV) → exit 3, not a summary.json over the limit", {
  skip: skipUnless("summary"),
}, async () => {
  const columns = 1_500_000;
  const names = Array.from({ length: columns }, (_, i) => `sensor_${String(i).padStart(7, "0")}`);
  const input = path.join(work, "wide.csv");
  fs.writeFileSync(input, `${names.join(",")}\n${names.map((_, i) => i % 10).join(",")}\n`);
  const { r, out } = await run("summary", input, {});
  assertRefused(r, out); // exited 0 with a 190 MB summary.json
});

test("summary: one column name of 18 MB of control characters (6 bytes each in JSON) → exit 3", {
  skip: skipUnless("summary"),
}, async () => {
  const input = path.join(work, "control-name.csv");
  fs.writeFileSync(input, `"${"\u0001".repeat(18_000_000)}",y\n1,2\n`);
  const { r, out } = await run("summary", input, {});
  assertRefused(r, out);
});

test("python-stats: a numeric column named by 9,000,000 CJK characters → exit 3", {
  skip: skipUnless("python-stats"),
}, async () => {
  // 27 MB of UTF-8; "\u540d" in stats.json, twice: 108 MB
  const input = path.join(work, "cjk-name.csv");
  fs.writeFileSync(input, `${"名".repeat(9_000_000)},y\n1,2\n3,4\n`);
  const { r, out } = await run("python-stats", input, { method: "mean" });
  assertRefused(r, out);
});

test("r-report: a numeric column named by 7,000,000 ampersands → exit 3", {
  skip: skipUnless("r-report"),
}, async () => {
  // "&amp;" in the table, the list of plotted columns and the image's alt text: 105 MB
  const input = path.join(work, "amp-name.csv");
  fs.writeFileSync(input, `${"&".repeat(7_000_000)},y\n1,2\n3,4\n`);
  const { r, out } = await run("r-report", input, {});
  assertRefused(r, out);
});
