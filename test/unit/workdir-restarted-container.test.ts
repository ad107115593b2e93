// A container restarted in place comes back with the same hostname, boot and (a few seconds after the
// old one is gone) the same pid namespace inode — so the same machine tag — and its worker, started the
// same way, with the same pid. The killed worker's scratch folder then carries the live worker's own tag
// and pid: it must still be taken for a leftover, with the inputs it fetched from the store.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { machineTag, openWorkDir, sweepWorkDirs } from "../../src/runner/workdir.ts";

test("a killed worker's folder with this process's own tag and pid is removed; this process's open folders stay", async () => {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-work-"));
  try {
    const root = path.join(dataDir, "work");
    const attempt = path.join(root, `${machineTag()}.${process.pid}.0badc0de`, "1000000.2.4f1c0a5e-tok");
    fs.mkdirSync(path.join(attempt, "out"), { recursive: true });
    fs.writeFileSync(path.join(attempt, "input"), "naïve,\u202Ename\n1,2\n");
    const leftover = path.dirname(attempt);

    const first = await openWorkDir(dataDir);
    const second = await openWorkDir(dataDir);
    try {
      assert.equal(fs.existsSync(leftover), false, "the earlier process's folder is removed at start");
      // Two workers of one process (as in `assay all` or a test): neither sweeps the other's folder.
      assert.equal(await sweepWorkDirs(root), 0);
      assert.equal(fs.existsSync(first.dir), true);
      assert.equal(fs.existsSync(second.dir), true);
    } finally {
      await first.close();
    }
    // A closed folder is no longer this process's: if anything of it is left, a sweep takes it.
    fs.mkdirSync(first.dir);
    assert.equal(await sweepWorkDirs(root), 1);
    assert.equal(fs.existsSync(first.dir), false);
    assert.equal(fs.existsSync(second.dir), true);
    await second.close();
  } finally {
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
});
