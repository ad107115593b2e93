// noRoomIn(): what the process handler reads from the scratch disk's statfs after a program ended, to
// tell a full disk (the run is retried as ANALYSIS_STORAGE_FULL) from a program's own failure. Each case
// is one a reviewer met on a real filesystem (a tmpfs without a size, ramfs, ext4 with blocks kept for
// root, a tmpfs out of inodes): the first three read as full and failed every good run.
import assert from "node:assert/strict";
import os from "node:os";
import { test } from "node:test";
import { noRoomIn } from "../../src/runner/handler.ts";
import { isNoSpace } from "../../src/storage/store.ts";

const roomy = { blocks: 14_073, bfree: 8_519, bavail: 7_000, files: 4_096, ffree: 4_000 };

test("a disk with blocks and inodes left has room, for root and for anyone", () => {
  assert.equal(noRoomIn(roomy, false), false);
  assert.equal(noRoomIn(roomy, true), false);
});

test("no block left for this process is full: the blocks kept for root count for root only", () => {
  const reserved = { ...roomy, bavail: 0 };
  assert.equal(noRoomIn(reserved, false), true);
  assert.equal(noRoomIn(reserved, true), false, "root may still write the 8,519 blocks kept for it");
  assert.equal(noRoomIn({ ...roomy, bavail: 0, bfree: 0 }, true), true);
});

test("no inode left is full, though blocks are left", () => {
  assert.equal(noRoomIn({ ...roomy, ffree: 0 }, false), true);
  assert.equal(noRoomIn({ ...roomy, ffree: 0 }, true), true);
});

test("a filesystem that counts nothing (ramfs, a tmpfs without a size, some FUSE ones) says nothing: room", () => {
  const uncounted = { blocks: 0, bfree: 0, bavail: 0, files: 0, ffree: 0 };
  assert.equal(noRoomIn(uncounted, false), false);
  assert.equal(noRoomIn(uncounted, true), false);
  // Blocks counted, inodes not (files 0): only the blocks say.
  assert.equal(noRoomIn({ ...roomy, files: 0, ffree: 0 }, false), false);
});

test("isNoSpace: ENOSPC, and EDQUOT by its name or as Node gives it (UNKNOWN, the system's errno)", () => {
  const edquot = os.constants.errno.EDQUOT as number;
  assert.equal(isNoSpace(Object.assign(new Error("full"), { code: "ENOSPC", errno: -28 })), true);
  assert.equal(isNoSpace(Object.assign(new Error("quota"), { code: "EDQUOT" })), true);
  assert.equal(isNoSpace(Object.assign(new Error("quota"), { code: "UNKNOWN", errno: -edquot })), true);
  assert.equal(isNoSpace(Object.assign(new Error("other"), { code: "UNKNOWN", errno: -5 })), false);
  assert.equal(isNoSpace(Object.assign(new Error("io"), { code: "EIO", errno: -5 })), false);
  assert.equal(isNoSpace(undefined), false);
  assert.equal(isNoSpace("ENOSPC"), false);
});
