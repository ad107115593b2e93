// Per-attempt output folders, without a database: each attempt owns its folder even when attempt
// numbers repeat, publishing replaces earlier attempts, and a late attempt never removes a newer one.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import {
  attemptDirs,
  checkOutputs,
  discardOutputs,
  OUTPUT_LIMITS,
  publishOutputs,
} from "../../src/runner/outputs.ts";
import { outputFiles } from "../../src/tasks/outputs.ts";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-outputs-"));
after(() => fs.rmSync(root, { recursive: true, force: true }));

const TOKEN_A = "aaaaaaaa-0000-4000-8000-000000000001";
const TOKEN_B = "bbbbbbbb-0000-4000-8000-000000000002";
const TOKEN_C = "cccccccc-0000-4000-8000-000000000003";

function write(dir: string, name: string, content: string) {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, name), content);
}

test("the same attempt number under two leases: two folders; the abandoned one's discard leaves the other's output", async () => {
  // A claim lost in a database crash: run 7 is claimed again as attempt 1 while the first process runs.
  const old = attemptDirs(root, 1, 7, 1, TOKEN_A);
  const current = attemptDirs(root, 1, 7, 1, TOKEN_B);
  assert.notEqual(old.tmp, current.tmp);
  write(old.tmp, "result.json", "old");
  write(current.tmp, "result.json", "new");
  await publishOutputs(current, "result.json");
  await discardOutputs(old); // the old attempt's completion was fenced off
  assert.equal(fs.readFileSync(path.join(current.final, "result.json"), "utf8"), "new");
  assert.ok(!fs.existsSync(old.tmp));
});

test("publishing attempt n removes earlier attempts' folders, never a later one's", async () => {
  const first = attemptDirs(root, 2, 8, 1, TOKEN_A); // left by a killed worker
  const second = attemptDirs(root, 2, 8, 2, TOKEN_B);
  const third = attemptDirs(root, 2, 8, 3, TOKEN_C); // a newer attempt, still running
  write(first.tmp, "result.json", "1");
  write(second.tmp, "result.json", "2");
  write(third.tmp, "partial.json", "3");
  await publishOutputs(second, "result.json");
  assert.ok(!fs.existsSync(first.tmp), "the earlier attempt's leftover is gone");
  assert.ok(fs.existsSync(third.tmp), "the later attempt's folder is untouched");
  assert.equal(fs.readFileSync(path.join(second.final, "result.json"), "utf8"), "2");
});

test("a late attempt's discard removes the published folder only when it published it", async () => {
  const late = attemptDirs(root, 3, 9, 1, TOKEN_A);
  const newer = attemptDirs(root, 3, 9, 2, TOKEN_B);
  write(late.tmp, "result.json", "late");
  await publishOutputs(late, "result.json");
  write(newer.tmp, "result.json", "newer");
  await publishOutputs(newer, "result.json");
  await discardOutputs(late);
  assert.equal(fs.readFileSync(path.join(newer.final, "result.json"), "utf8"), "newer");

  const fenced = attemptDirs(root, 3, 10, 1, TOKEN_C);
  write(fenced.tmp, "result.json", "fenced");
  await publishOutputs(fenced, "result.json");
  // The marker is a second name of the result file (no inode of its own), hidden from downloads.
  const marker = path.join(fenced.final, fenced.marker);
  assert.equal(fs.statSync(marker).ino, fs.statSync(path.join(fenced.final, "result.json")).ino);
  assert.deepEqual(await outputFiles(fenced.final), ["result.json"]);
  await discardOutputs(fenced); // its completion was fenced off after it published
  assert.ok(!fs.existsSync(fenced.final));
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
