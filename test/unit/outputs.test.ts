// Output checks, without a database: the named file among allowed files passes, and every limit is
// enforced. (Where outputs go, and who may remove them, is tested with the stores and the worker.)
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { attemptOutputKey, checkOutputs, OUTPUT_LIMITS } from "../../src/runner/outputs.ts";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-outputs-"));
after(() => fs.rmSync(root, { recursive: true, force: true }));

test("an attempt's output key names the task, the run, the attempt and its lease", () => {
  const token = "aaaaaaaa-0000-4000-8000-000000000001";
  assert.equal(attemptOutputKey(12, 345, 2, token), `12/345.2.${token}`);
  assert.notEqual(attemptOutputKey(12, 345, 1, token), attemptOutputKey(12, 345, 1, token.replace("a", "b")));
});

test("checkOutputs: the named file among allowed files passes; every limit is enforced", () => {
  let n = 0;
  /** A fresh attempt folder holding the given files (sizes made sparse: nothing is really written). */
  const folder = (files: Record<string, number>) => {
    const dir = path.join(root, `check-${n++}`);
    fs.mkdirSync(dir);
    for (const [name, size] of Object.entries(files)) {
      fs.writeFileSync(path.join(dir, name), "");
      fs.truncateSync(path.join(dir, name), size);
    }
    return dir;
  };
  const MiB = 1024 * 1024;
  assert.deepEqual(checkOutputs(folder({ "stats.json": 10, "stats.csv": 20 }), "stats.json"), {
    ok: true,
    files: [
      { name: "stats.csv", size: 20 },
      { name: "stats.json", size: 10 },
    ],
  });
  const fails = (dir: string, name: string) => {
    const r = checkOutputs(dir, name);
    assert.equal(r.ok, false);
    return r.ok ? "" : r.message;
  };
  assert.equal(fails(folder({ "a.json": 1 }), "b.json"), "the file named by the result does not exist");
  assert.equal(
    fails(folder({ "a.json": 1 }), "../a.json"),
    "the result names a file outside the output directory",
  );
  const many = Object.fromEntries(
    Array.from({ length: OUTPUT_LIMITS.maxFiles + 1 }, (_, i) => [`f${i}.json`, 1]),
  );
  assert.equal(fails(folder(many), "f0.json"), "too many output files");
  assert.equal(
    fails(folder({ "big.json": OUTPUT_LIMITS.maxFileBytes + 1 }), "big.json"),
    "an output file is too large",
  );
  assert.equal(
    fails(folder({ "a.csv": 90 * MiB, "b.csv": 90 * MiB, "c.json": 90 * MiB }), "c.json"),
    "the outputs are too large together",
  );
  assert.equal(
    fails(folder({ "a.json": 1, "run.sh": 1 }), "a.json"),
    "an output file has a type that is not allowed",
  );
  assert.equal(fails(folder({ "a.json": 1, "-x.json": 1 }), "a.json"), "an output file has an unsafe name");
  // Names Windows keeps for devices, which no zip or download of them could hold there.
  for (const reserved of ["con.json", "NUL.txt", "Com1.csv", "lpt9.md"])
    assert.equal(
      fails(folder({ "a.json": 1, [reserved]: 1 }), "a.json"),
      "an output file has an unsafe name",
    );
  assert.equal(fails(folder({ "con.json": 1 }), "con.json"), "the result names an unsafe output file");
  const withLink = folder({ "a.json": 1 });
  fs.symlinkSync("/etc/passwd", path.join(withLink, "p.json"));
  assert.equal(fails(withLink, "a.json"), "outputs must be regular files (no links or folders)");
  const withFolder = folder({ "a.json": 1 });
  fs.mkdirSync(path.join(withFolder, "sub"));
  assert.equal(fails(withFolder, "a.json"), "outputs must be regular files (no links or folders)");
});

test("checkOutputs: names that differ only in case (one file on macOS and Windows) are refused", () => {
  const dir = fs.mkdtempSync(path.join(root, "case-"));
  for (const name of ["report.json", "Report.json", "REPORT.json", "stats.csv"])
    fs.writeFileSync(path.join(dir, name), "{}");
  assert.deepEqual(checkOutputs(dir, "report.json"), {
    ok: false,
    message:
      "output files whose names differ only in case (REPORT.json, Report.json) are one file on macOS and Windows",
  });
  // The pair named is the first in code-unit order whatever order the folder lists them in; a name that
  // differs in more than case passes.
  const apart = fs.mkdtempSync(path.join(root, "apart-"));
  for (const name of ["report.json", "report.JSON.csv", "report_1.json"])
    fs.writeFileSync(path.join(apart, name), "{}");
  assert.equal(checkOutputs(apart, "report.json").ok, true);
  const twoExts = fs.mkdtempSync(path.join(root, "ext-"));
  for (const name of ["a.csv", "a.CSV"]) fs.writeFileSync(path.join(twoExts, name), "");
  assert.deepEqual(checkOutputs(twoExts, "a.csv"), {
    ok: false,
    message: "output files whose names differ only in case (a.CSV, a.csv) are one file on macOS and Windows",
  });
});
