import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { after, test } from "node:test";
import { sanitizeFileName } from "../../src/files/files.ts";
import { LocalStorage, PayloadTooLargeError } from "../../src/storage/local.ts";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-storage-"));
after(() => fs.rmSync(root, { recursive: true, force: true }));
const storage = new LocalStorage(root);

test("stage hashes and counts; commit publishes under the key; discard removes the bytes", async () => {
  const staged = await storage.stage(Readable.from([Buffer.from("hello "), Buffer.from("world")]), 100);
  assert.equal(staged.sizeBytes, 11);
  assert.equal(staged.sha256, "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9");
  await staged.commit("files/1");
  assert.equal(fs.readFileSync(path.join(root, "files", "1"), "utf8"), "hello world");
  assert.deepEqual(fs.readdirSync(path.join(root, ".partial")), []);

  const other = await storage.stage(Readable.from([Buffer.from("x")]), 100);
  await other.discard();
  assert.deepEqual(fs.readdirSync(path.join(root, ".partial")), []);
});

test("more than maxBytes → PayloadTooLargeError and no partial file left", async () => {
  await assert.rejects(
    storage.stage(Readable.from([Buffer.alloc(60), Buffer.alloc(60)]), 100),
    (err) => err instanceof PayloadTooLargeError,
  );
  assert.deepEqual(fs.readdirSync(path.join(root, ".partial")), []);
});

test("keys are resolved under the root; escapes are refused", () => {
  assert.equal(storage.resolve("files/7"), path.join(root, "files", "7"));
  for (const bad of [
    "../x",
    "files/../../etc/passwd",
    "/etc/passwd",
    "files/./7",
    "",
    "Files/7",
    "files\\7",
  ]) {
    assert.throws(() => storage.resolve(bad), /storage key/, bad);
  }
});

test("sweepPartials removes only old partial uploads", async () => {
  const dir = path.join(root, ".partial");
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "old"), "x");
  fs.writeFileSync(path.join(dir, "new"), "x");
  const past = new Date(Date.now() - 2 * 3600_000);
  fs.utimesSync(path.join(dir, "old"), past, past);
  assert.equal(await storage.sweepPartials(3600_000), 1);
  assert.deepEqual(fs.readdirSync(dir), ["new"]);
  fs.rmSync(path.join(dir, "new"));
});

test("sanitizeFileName keeps only a safe base name", () => {
  assert.equal(sanitizeFileName("../../etc/passwd"), "passwd");
  assert.equal(sanitizeFileName("C:\\data\\x.csv"), "x.csv");
  assert.equal(sanitizeFileName("a\u0007b.csv"), "ab.csv");
  assert.equal(sanitizeFileName(""), "upload");
  assert.equal(sanitizeFileName(undefined), "upload");
  assert.equal(sanitizeFileName(".."), "upload");
  assert.equal(sanitizeFileName("x".repeat(300)).length, 255);
});
