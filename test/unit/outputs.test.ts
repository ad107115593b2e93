// Per-attempt output folders, without a database: each attempt owns its folder even when attempt
// numbers repeat, publishing replaces earlier attempts, and a late attempt never removes a newer one.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { attemptDirs, discardOutputs, publishOutputs } from "../../src/runner/outputs.ts";

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
  await publishOutputs(current);
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
  await publishOutputs(second);
  assert.ok(!fs.existsSync(first.tmp), "the earlier attempt's leftover is gone");
  assert.ok(fs.existsSync(third.tmp), "the later attempt's folder is untouched");
  assert.equal(fs.readFileSync(path.join(second.final, "result.json"), "utf8"), "2");
});

test("a late attempt's discard removes the published folder only when it published it", async () => {
  const late = attemptDirs(root, 3, 9, 1, TOKEN_A);
  const newer = attemptDirs(root, 3, 9, 2, TOKEN_B);
  write(late.tmp, "result.json", "late");
  await publishOutputs(late);
  write(newer.tmp, "result.json", "newer");
  await publishOutputs(newer);
  await discardOutputs(late);
  assert.equal(fs.readFileSync(path.join(newer.final, "result.json"), "utf8"), "newer");

  const fenced = attemptDirs(root, 3, 10, 1, TOKEN_C);
  write(fenced.tmp, "result.json", "fenced");
  await publishOutputs(fenced);
  await discardOutputs(fenced); // its completion was fenced off after it published
  assert.ok(!fs.existsSync(fenced.final));
});
