import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { after, test } from "node:test";
import { storedFileName } from "../../src/files/file-name.ts";
import { SAFE_NAME } from "../../src/runner/outputs.ts";
import { LocalStore, type RenameCalls, renameInto, SYNC_CALLS } from "../../src/storage/local.ts";
import { checkKey, outputObjectKey } from "../../src/storage/store.ts";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-storage-"));
after(() => fs.rmSync(root, { recursive: true, force: true }));
const storage = new LocalStore(root);

test("keys are resolved under the root; escapes are refused", () => {
  assert.equal(storage.localPath("files/7"), path.join(root, "files", "7"));
  for (const bad of ["../x", "files/../../etc/passwd", "/etc/passwd", "files/./7", "", "files\\7"]) {
    assert.throws(() => storage.localPath(bad), /storage key/, bad);
  }
});

test("abortIncompleteUploads removes only old partial uploads", async () => {
  const dir = path.join(root, ".partial");
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "old"), "x");
  fs.writeFileSync(path.join(dir, "new"), "x");
  const past = new Date(Date.now() - 2 * 3600_000);
  fs.utimesSync(path.join(dir, "old"), past, past);
  assert.equal(await storage.abortIncompleteUploads(new Date(Date.now() - 3600_000)), 1);
  assert.deepEqual(fs.readdirSync(dir), ["new"]);
  fs.rmSync(path.join(dir, "new"));
});

test("abortIncompleteUploads removes an old put's staging folder (its process killed while it made the key's folder)", async () => {
  const dir = path.join(root, ".partial");
  const stage = path.join(dir, "1700000000000-00112233aabbccdd.stage1");
  fs.mkdirSync(stage, { recursive: true });
  fs.writeFileSync(path.join(stage, "9"), "x");
  const past = new Date(Date.now() - 2 * 3600_000);
  fs.utimesSync(stage, past, past);
  assert.equal(await storage.abortIncompleteUploads(new Date(Date.now() - 3600_000)), 1);
  assert.deepEqual(fs.readdirSync(dir), []);
});

test("a put into a missing folder makes it with the object in it; one into a folder there renames into it", async () => {
  await storage.put("outputs/1000000/a.json", Readable.from([Buffer.from("a")]));
  assert.equal(fs.readFileSync(path.join(root, "outputs/1000000/a.json"), "utf8"), "a");
  fs.mkdirSync(path.join(root, "outputs/1000001"));
  const empty = fs.statSync(path.join(root, "outputs/1000001")).ino;
  await storage.put("outputs/1000001/b.json", Readable.from([Buffer.from("b")]));
  assert.equal(fs.readFileSync(path.join(root, "outputs/1000001/b.json"), "utf8"), "b");
  // A folder that is there is renamed into: only a missing one is staged.
  assert.equal(fs.statSync(path.join(root, "outputs/1000001")).ino, empty);
  await storage.put("outputs/1000001/c.json", Readable.from([Buffer.from("c")]));
  assert.deepEqual(fs.readdirSync(path.join(root, "outputs/1000001")).sort(), ["b.json", "c.json"]);
  assert.deepEqual(fs.readdirSync(path.join(root, ".partial")), [], "no staging folder left");
  await storage.deletePrefix("outputs/1000000/");
  await storage.deletePrefix("outputs/1000001/");
});

test("a rename whose folders cannot be made fails with the cause, its source back in place and no stage left", async () => {
  const base = fs.mkdtempSync(path.join(root, "dangling-"));
  // `outputs` a link to nothing: each missing folder is staged up to it, whose rename fails ENOTDIR.
  fs.symlinkSync(path.join(base, "nowhere"), path.join(base, "outputs"));
  const from = path.join(base, "out");
  fs.mkdirSync(from);
  fs.writeFileSync(path.join(from, "stats.json"), "{}");
  await assert.rejects(renameInto(from, path.join(base, "outputs", "1000000", "10000001.1.x")), {
    code: "ENOTDIR",
  });
  assert.equal(fs.readFileSync(path.join(from, "stats.json"), "utf8"), "{}");
  assert.deepEqual(fs.readdirSync(base).sort(), ["out", "outputs"]);
  // Made three folders deep at once where nothing was: the new folders hold the source.
  const to = path.join(base, "made", "1000000", "10000001.1.x");
  assert.equal(await renameInto(from, to), true);
  assert.equal(fs.readFileSync(path.join(to, "stats.json"), "utf8"), "{}");
  assert.deepEqual(fs.readdirSync(base).sort(), ["made", "outputs"]);
});

test("a folder back with something in it at the staged rename is renamed into, and flushed; a staged rename's failure keeps its code", async () => {
  const base = fs.mkdtempSync(path.join(root, "raced-"));
  const from = path.join(base, "out");
  fs.mkdirSync(from);
  fs.writeFileSync(path.join(from, "stats.json"), "{}");
  const task = path.join(base, "outputs", "1000000");
  fs.mkdirSync(path.dirname(task));
  // Another worker makes the task's folder with its own attempt in it just before the staged rename.
  let raced = false;
  const racing: RenameCalls = {
    ...SYNC_CALLS,
    rename: (a, b) => {
      if (b === task && !raced) {
        raced = true;
        fs.mkdirSync(path.join(task, "10000002.1.y"), { recursive: true });
      }
      return SYNC_CALLS.rename(a, b);
    },
  };
  const to = path.join(task, "10000001.1.x");
  assert.equal(await renameInto(from, to, racing), true, "its folder's entry is flushed");
  assert.ok(raced);
  assert.deepEqual(fs.readdirSync(task).sort(), ["10000001.1.x", "10000002.1.y"]);
  assert.deepEqual(fs.readdirSync(base).sort(), ["outputs"], "no stage left");
  // A full disk at the staged rename: ENOSPC as it was (a 507, not a 500), the source back in place.
  const again = path.join(base, "again");
  fs.mkdirSync(again);
  const full: RenameCalls = {
    ...SYNC_CALLS,
    rename: (a, b) => {
      if (a.endsWith(".stage1"))
        throw Object.assign(new Error("no space left on device"), { code: "ENOSPC" });
      return SYNC_CALLS.rename(a, b);
    },
  };
  await assert.rejects(renameInto(again, path.join(base, "outputs", "1000001", "x"), full), {
    code: "ENOSPC",
  });
  assert.deepEqual(fs.readdirSync(base).sort(), ["again", "outputs"]);
});

test("storedFileName keeps only a safe base name", () => {
  assert.equal(storedFileName("../../etc/passwd"), "passwd");
  assert.equal(storedFileName("C:\\data\\x.csv"), "x.csv");
  assert.equal(storedFileName("a\u0007b.csv"), "ab.csv");
  assert.equal(storedFileName(""), "upload");
  assert.equal(storedFileName(undefined), "upload");
  assert.equal(storedFileName(".."), "upload");
  assert.equal(storedFileName("x".repeat(300)).length, 255);
  // C1 controls too: U+009B is a terminal's CSI ("\u009b31m" would turn a CLI's output red).
  assert.equal(storedFileName("a\u0085b\u009b[31mred.csv"), "ab[31mred.csv");
  // Cut before a character, never inside one: an emoji is two UTF-16 units.
  const emoji = storedFileName(`${"x".repeat(254)}😀.csv`);
  assert.equal(emoji, "x".repeat(254));
  assert.ok(Buffer.from(emoji, "utf8").toString("utf8") === emoji, "well formed");
  assert.equal(storedFileName(`${"x".repeat(253)}😀.csv`), `${"x".repeat(253)}😀`);
});

test("a source that failed before the store read it leaves no partial file", async () => {
  const own = new LocalStore(fs.mkdtempSync(path.join(root, "failed-")));
  for (let i = 0; i < 100; i++) {
    const source = new Readable({ read() {} });
    source.on("error", () => {}); // its owner (the multipart parser) listens, as here
    source.destroy(new Error("the body ended early"));
    await assert.rejects(own.put(`files/${i}`, source), /ended early/);
  }
  assert.deepEqual(fs.readdirSync(path.join(own.root, ".partial")), []);
});

test("every output name the runner accepts makes a valid storage key", () => {
  const alphabet = "ABCXYZabcxyz0189._-";
  let checked = 0;
  for (let i = 0; i < 5000; i++) {
    let name = "";
    const length = 1 + (i % 40);
    for (let j = 0; j < length; j++) name += alphabet[(i * 7 + j * 13 + j * j) % alphabet.length];
    if (!SAFE_NAME.test(name)) continue;
    assert.equal(
      checkKey(outputObjectKey("1000/10000000000.2.abc", name)),
      `outputs/1000/10000000000.2.abc/${name}`,
    );
    checked++;
  }
  assert.ok(checked > 1000, `only ${checked} names checked`);
});

test("the local store lists in S3's order, by UTF-8 bytes, in pages that start anywhere", async () => {
  // A file before the keys of a folder its name begins (`a.b` < `a.b.c/…`); `-` and `.` before `/`
  // (`a-/…` < `a.b` < `a/…`), where a folder-by-folder walk would put `a/…` first.
  const keys = [
    "outputs/6/7.1.aa/r.json",
    "outputs/6/a-/y",
    "outputs/6/a.b",
    "outputs/6/a.b.c/x",
    "outputs/6/a/x",
    "outputs/6/a/z/deep",
  ];
  for (const key of [...keys].reverse()) await storage.put(key, Readable.from([Buffer.from(key)]));
  assert.deepEqual(
    (await storage.list("outputs/6/")).map((o) => o.key),
    keys,
  );
  for (let i = 0; i < keys.length; i++) {
    const page = await storage.list("outputs/6/", { after: keys[i] as string, limit: 2 });
    assert.deepEqual(
      page.map((o) => o.key),
      keys.slice(i + 1, i + 3),
    );
  }
  assert.deepEqual(
    (await storage.list("outputs/6/a.")).map((o) => o.key),
    keys.slice(2, 4),
  );
});

test("a large folder's kept listing goes with the folder, and once it has gone unused a while", async () => {
  // Kept so that paging through a task's 100,000 run folders reads and sorts them once; it was kept
  // after the task's deletion, and after the last page, until another large folder replaced it.
  class QuickStore extends LocalStore {
    protected override keptIdleMs = 200;
  }
  const store = new QuickStore(fs.mkdtempSync(path.join(root, "kept-")));
  const kept = () => (store as unknown as { top?: { dir: string } }).top;
  const task = async (id: string) => {
    const dir = store.localPath(`outputs/${id}`);
    for (let i = 0; i < 1_000; i++) {
      fs.mkdirSync(path.join(dir, `${100_000 + i}.1.z`), { recursive: true });
      fs.writeFileSync(path.join(dir, `${100_000 + i}.1.z`, "r.json"), "{}");
    }
    // Only a folder unchanged for a second is kept (a change in the same clock tick must not be missed).
    const past = new Date(Date.now() - 60_000);
    fs.utimesSync(dir, past, past);
    return dir;
  };
  const first = await task("900000001");
  assert.equal((await store.list("outputs/900000001/", { limit: 10 })).length, 10);
  assert.equal(kept()?.dir, first);
  assert.equal(await store.deletePrefix("outputs/900000001/"), 1_000);
  assert.equal(kept(), undefined, "the deleted folder's listing is not kept");
  const second = await task("900000002");
  assert.equal((await store.list("outputs/900000002/", { limit: 10 })).length, 10);
  assert.equal(kept()?.dir, second);
  // Used again, it stays — the same listing, not one read again; unused for keptIdleMs, it goes.
  const listing = kept();
  const started = performance.now();
  while (performance.now() - started < 400) {
    assert.equal(kept(), listing, "a listing in use is kept");
    assert.equal((await store.list("outputs/900000002/", { limit: 1 })).length, 1);
    await new Promise((r) => setTimeout(r, 20));
  }
  const idleFrom = performance.now();
  while (kept() !== undefined && performance.now() - idleFrom < 5_000)
    await new Promise((r) => setTimeout(r, 20));
  assert.equal(kept(), undefined, "an unused listing goes");
});
