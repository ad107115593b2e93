// Per-attempt output folders, without a database: each attempt owns its folder even when attempt
// numbers repeat, discarding an attempt removes its own folder only, and once a run's outcome is
// recorded the folders of its other attempts go.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import {
  attemptOutput,
  checkOutputs,
  discardOutputs,
  OUTPUT_LIMITS,
  removeOtherAttempts,
} from "../../src/runner/outputs.ts";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-outputs-"));
after(() => fs.rmSync(root, { recursive: true, force: true }));

const TOKEN_A = "aaaaaaaa-0000-4000-8000-000000000001";
const TOKEN_B = "bbbbbbbb-0000-4000-8000-000000000002";
const TOKEN_C = "cccccccc-0000-4000-8000-000000000003";

function write(dir: string, name: string, content: string) {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, name), content);
}

test("the same attempt number under two leases: two folders; discarding one leaves the other", async () => {
  // A claim lost in a database crash: run 7 is claimed again as attempt 1 while the first process runs.
  const old = attemptOutput(root, 1, 7, 1, TOKEN_A);
  const current = attemptOutput(root, 1, 7, 1, TOKEN_B);
  assert.notEqual(old.dir, current.dir);
  assert.equal(current.key, `1/7.1.${TOKEN_B}`);
  assert.equal(current.dir, path.join(root, current.key));
  write(old.dir, "result.json", "old");
  write(current.dir, "result.json", "new");
  await discardOutputs(old); // the old attempt's completion was fenced off
  assert.equal(fs.readFileSync(path.join(current.dir, "result.json"), "utf8"), "new");
  assert.ok(!fs.existsSync(old.dir));
});

test("removeOtherAttempts removes the run's other attempts, keeps the recorded one, touches nothing else", async () => {
  const first = attemptOutput(root, 2, 8, 1, TOKEN_A); // left by a killed worker
  const second = attemptOutput(root, 2, 8, 2, TOKEN_B); // the recorded success
  const stale = attemptOutput(root, 2, 8, 2, TOKEN_C); // a fenced-off attempt still writing
  const otherRun = attemptOutput(root, 2, 80, 1, TOKEN_A); // run 80 starts with "8" too
  const legacy = path.join(root, "2", "81"); // published before output keys existed
  for (const dir of [first.dir, second.dir, stale.dir, otherRun.dir, legacy]) write(dir, "result.json", "x");
  await removeOtherAttempts(root, 2, 8, second.key);
  assert.deepEqual(
    fs.readdirSync(path.join(root, "2")).sort(),
    ["80.1.aaaaaaaa-0000-4000-8000-000000000001", "8.2.bbbbbbbb-0000-4000-8000-000000000002", "81"].sort(),
  );
  await removeOtherAttempts(root, 2, 80, null); // a failed run: all of its folders go
  assert.ok(!fs.existsSync(otherRun.dir));
  await removeOtherAttempts(root, 3, 1, null); // no folder at all: nothing to do
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
    files: ["stats.csv", "stats.json"],
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
  const withLink = folder({ "a.json": 1 });
  fs.symlinkSync("/etc/passwd", path.join(withLink, "p.json"));
  assert.equal(fails(withLink, "a.json"), "outputs must be regular files (no links or folders)");
  const withFolder = folder({ "a.json": 1 });
  fs.mkdirSync(path.join(withFolder, "sub"));
  assert.equal(fails(withFolder, "a.json"), "outputs must be regular files (no links or folders)");
});
