// `assay storage migrate` on what a real data directory may hold — an empty file, a name no program
// could have given, an object the bucket already holds with another size, a run cut short — and on a
// directory that is not an installation's.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import { cleanEnv, collect, runCli, spawnCli } from "../helpers/cli.ts";
import { createTestBucket, type TestBucket } from "../helpers/s3.ts";

let bucket: TestBucket;
let scratch: string;
before(async () => {
  bucket = await createTestBucket();
  // A data directory whose own path is not ASCII.
  scratch = fs.mkdtempSync(path.join(os.tmpdir(), "assay-migrate-données-"));
});
after(async () => {
  await bucket.drop();
  fs.rmSync(scratch, { recursive: true, force: true });
});

const summaryOf = (stdout: string) => JSON.parse(stdout.trim().split("\n").at(-1) as string);

/** A data directory holding these keys (their contents as given). */
function dataDir(name: string, objects: Record<string, string>): string {
  const root = path.join(scratch, name);
  fs.mkdirSync(root, { recursive: true });
  for (const [key, content] of Object.entries(objects)) {
    fs.mkdirSync(path.dirname(path.join(root, key)), { recursive: true });
    fs.writeFileSync(path.join(root, key), content);
  }
  return root;
}

const ATTEMPT = "outputs/100000007/10000000011.1.0e0e0e0e-0000-4000-8000-00000000000a";

test("a source directory that does not exist, or holds no installation, is refused: nothing reported as migrated", async () => {
  const env = cleanEnv({ ...bucket.env, ASSAY_S3_PREFIX: "refused/" });
  const missing = path.join(scratch, "typo");
  const r = await runCli(["storage", "migrate", "--from", missing], env);
  assert.equal(r.code, 2, r.stdout);
  assert.match(r.stderr, /does not exist/);
  assert.ok(r.stderr.includes(missing), r.stderr);
  assert.equal(r.stdout, "", "no summary that reads as a migration done");

  const file = path.join(scratch, "a-file");
  fs.writeFileSync(file, "x");
  const notDir = await runCli(["storage", "migrate", "--from", file], env);
  assert.equal(notDir.code, 2, notDir.stdout);
  assert.match(notDir.stderr, /not a directory/);

  // The default source ($ASSAY_DATA_DIR) too: run from the wrong folder, it names a folder that is not there.
  const unset = await runCli(["storage", "migrate"], { ...env, ASSAY_DATA_DIR: missing });
  assert.equal(unset.code, 2, unset.stdout);

  const elsewhere = dataDir("not-an-installation", { "notes.txt": "hello" });
  const empty = await runCli(["storage", "migrate", "--from", elsewhere], env);
  assert.equal(empty.code, 2, empty.stdout);
  assert.match(empty.stderr, /neither files\/ nor outputs\//);
  assert.deepEqual(await bucket.store("refused/").list(""), []);
});

test("an empty file, a key of another size in the bucket, and a name Assay never makes", async () => {
  const env = cleanEnv({ ...bucket.env, ASSAY_S3_PREFIX: "mixed/" });
  const root = dataDir("mixed", {
    "files/1000000": "",
    "files/1000001": "a,b\n1,2\n",
    [`${ATTEMPT}/report.csv`]: "x\n",
    // Put there by hand (a note, a file copied from a desktop): no row can reference it.
    [`${ATTEMPT}/résumé.csv`]: "y\n",
    "files/notes 1.txt": "z",
  });
  const store = bucket.store("mixed/");
  // Left by an earlier attempt at copying, cut short: another size, so copied again.
  await store.put("files/1000001", Readable.from([Buffer.from("a,")]));

  const r = await runCli(["storage", "migrate", "--from", root], env);
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(
    { ...summaryOf(r.stdout), from: undefined },
    { from: undefined, storage: "s3", copied: 3, skipped: 0, ignored: 2, notCopied: 0, bytes: 10 },
  );
  assert.match(r.stderr, /"files\/notes 1\.txt"/, "each key left out is named");
  assert.match(r.stderr, /résumé\.csv/);
  const listed = Object.fromEntries((await store.list("")).map((o) => [o.key, o.size]));
  assert.deepEqual(listed, { "files/1000000": 0, "files/1000001": 8, [`${ATTEMPT}/report.csv`]: 2 });
  const body = await store.open("files/1000001");
  const chunks: Buffer[] = [];
  for await (const c of body.stream) chunks.push(c as Buffer);
  assert.equal(Buffer.concat(chunks).toString(), "a,b\n1,2\n");

  const again = await runCli(["storage", "migrate", "--from", root], env);
  assert.equal(again.code, 0, again.stderr);
  assert.deepEqual(
    { ...summaryOf(again.stdout), from: undefined },
    { from: undefined, storage: "s3", copied: 0, skipped: 3, ignored: 2, notCopied: 0, bytes: 0 },
  );
});

test("a run killed mid-way resumes: what it copied is skipped, the rest copied, nothing lost", async () => {
  const env = cleanEnv({ ...bucket.env, ASSAY_S3_PREFIX: "resumed/" });
  const objects: Record<string, string> = {};
  // Past a page (1,000), across a digit boundary of the ids, with an empty file among them.
  for (let id = 999_500; id < 1_000_700; id++) objects[`files/${id}`] = id === 999_999 ? "" : `${id}\n`;
  const root = dataDir("resumed", objects);
  const keys = Object.keys(objects);

  // Killed outright once its first page is copied (it says so on stderr), in the middle of the next.
  const first = spawnCli(["storage", "migrate", "--from", root], env);
  const killed = collect(first);
  first.stderr?.on("data", (c: Buffer) => {
    if (c.toString().includes("files/: ")) first.kill("SIGKILL");
  });
  assert.equal((await killed).signal, "SIGKILL");
  const store = bucket.store("resumed/");
  const listAll = async () => {
    let listed: { key: string; size: number }[] = [];
    for (let after: string | undefined; ; ) {
      const page = await store.list("files/", after === undefined ? {} : { after });
      listed = listed.concat(page);
      if (page.length < 1000) return listed;
      after = page.at(-1)?.key;
    }
  };
  const before = (await listAll()).length;
  assert.ok(before >= 1000 && before < keys.length, `${before} copied before the kill`);

  const r = await runCli(["storage", "migrate", "--from", root], env);
  assert.equal(r.code, 0, r.stderr);
  const s = summaryOf(r.stdout);
  assert.deepEqual([s.copied, s.skipped, s.ignored], [keys.length - before, before, 0]);
  const listed = await listAll();
  assert.deepEqual(
    Object.fromEntries(listed.map((o) => [o.key, o.size])),
    Object.fromEntries(keys.map((k) => [k, Buffer.byteLength(objects[k] as string)])),
  );
});

test("links and FIFOs inside files/ and outputs/ are named, never followed, and fail the command; linked files/ is followed", async () => {
  const env = cleanEnv({ ...bucket.env, ASSAY_S3_PREFIX: "linked/" });
  // Outside the data directory: what a link must never carry into the bucket.
  const outside = path.join(scratch, "outside-ünïcode");
  fs.mkdirSync(path.join(outside, "run"), { recursive: true });
  fs.writeFileSync(path.join(outside, "secret"), "s3cr3t\n");
  fs.writeFileSync(path.join(outside, "run", "report.csv"), "r\n");
  const root = dataDir("linked", {
    "files/1000000": "kept\n",
    [`${ATTEMPT}/report.csv`]: "x\n",
  });
  // An input moved to another disk and linked back; a run folder likewise; a loop; a FIFO; a link by
  // hand under a name Assay never makes.
  fs.symlinkSync(path.join(outside, "secret"), path.join(root, "files", "999999999"));
  fs.symlinkSync(path.join(outside, "run"), path.join(root, "outputs", "100000007", "9999999999"));
  fs.symlinkSync("..", path.join(root, "outputs", "100000007", "loop"));
  execFileSync("mkfifo", [path.join(root, "files", "1000001")]);
  fs.symlinkSync("1000000", path.join(root, "files", "dernière version"));

  const r = await runCli(["storage", "migrate", "--from", root], env);
  assert.equal(r.code, 1, r.stderr);
  assert.deepEqual(
    { ...summaryOf(r.stdout), from: undefined },
    { from: undefined, storage: "s3", copied: 2, skipped: 0, ignored: 1, notCopied: 4, bytes: 7 },
  );
  for (const key of [
    "files/999999999",
    "files/1000001",
    "outputs/100000007/9999999999",
    "outputs/100000007/loop",
    "files/dernière version",
  ]) {
    assert.ok(r.stderr.includes(JSON.stringify(key)), `${key} is named: ${r.stderr}`);
  }
  assert.ok(r.stderr.includes(JSON.stringify(path.join(outside, "secret"))), "a link's target is named");
  assert.match(r.stderr, /a FIFO/);
  assert.match(r.stderr, /4 links or special files were not copied/);
  const store = bucket.store("linked/");
  const listed = Object.fromEntries((await store.list("")).map((o) => [o.key, o.size]));
  assert.deepEqual(listed, { "files/1000000": 5, [`${ATTEMPT}/report.csv`]: 2 }, "nothing through a link");

  // Once the files themselves are in place, a second run copies them and succeeds.
  for (const k of [
    "files/999999999",
    "outputs/100000007/9999999999",
    "outputs/100000007/loop",
    "files/1000001",
  ])
    fs.rmSync(path.join(root, k));
  fs.copyFileSync(path.join(outside, "secret"), path.join(root, "files", "999999999"));
  const again = await runCli(["storage", "migrate", "--from", root], env);
  assert.equal(again.code, 0, again.stderr);
  assert.deepEqual(
    [summaryOf(again.stdout).copied, summaryOf(again.stdout).notCopied, summaryOf(again.stdout).ignored],
    [1, 0, 1],
  );

  // files/ itself on another disk, linked into the data directory: that is the installation's layout,
  // and it is followed.
  const moved = dataDir("moved-files", {});
  fs.symlinkSync(path.join(root, "files"), path.join(moved, "files"));
  const viaLink = await runCli(["storage", "migrate", "--from", moved], {
    ...env,
    ASSAY_S3_PREFIX: "linked-top/",
  });
  assert.equal(viaLink.code, 0, viaLink.stderr);
  assert.deepEqual(
    Object.keys(Object.fromEntries((await bucket.store("linked-top/").list("")).map((o) => [o.key, 1]))),
    ["files/1000000", "files/999999999"],
  );
});
