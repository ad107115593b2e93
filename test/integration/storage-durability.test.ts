// A local store's put must be on disk before it returns: the upload's row is committed right after,
// and a power loss then must not leave the key empty or missing (a new file's bytes and its rename sit
// in the page cache for seconds). Watched from outside, with strace, on a real process doing the puts:
// the file is flushed before it is renamed into place, and the folder after.
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { LocalStore, publishFolder } from "../../src/storage/local.ts";
import { ROOT } from "../helpers/cli.ts";

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "assay-durable-"));
after(() => fs.rmSync(scratch, { recursive: true, force: true }));

const strace = (() => {
  try {
    execFileSync("strace", ["-o", "/dev/null", "true"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
})();

/** Runs `body` (an ES module's code, given `store`) in a process of its own under strace; its calls. */
async function traced(root: string, body: string): Promise<string[]> {
  const log = path.join(scratch, `strace-${path.basename(root)}.txt`);
  const code = `import { LocalStore } from ${JSON.stringify(path.join(ROOT, "src/storage/local.ts"))};
import { Readable } from "node:stream";
const store = new LocalStore(${JSON.stringify(root)});
${body}`;
  const child = spawn(
    "strace",
    [
      "-f",
      "-y",
      "-e",
      "trace=fsync,fdatasync,rename,renameat,renameat2",
      "-o",
      log,
      process.execPath,
      "--input-type=module",
      "-e",
      code,
    ],
    { stdio: ["ignore", "inherit", "pipe"] },
  );
  let stderr = "";
  child.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
  const status = await new Promise<number | null>((resolve) => child.on("close", resolve));
  assert.equal(status, 0, stderr);
  return fs
    .readFileSync(log, "utf8")
    .split("\n")
    .filter((l) => / (fsync|fdatasync|rename\w*)\(/.test(l) && / = 0$/.test(l));
}

/** The index of the first call matching `pattern` at or after `from`; fails when there is none. */
function find(calls: string[], pattern: RegExp, from = 0, what = String(pattern)): number {
  const i = calls.findIndex((c, j) => j >= from && pattern.test(c));
  assert.ok(i >= 0, `${what} after call ${from} of:\n${calls.join("\n")}`);
  return i;
}

const literal = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/**
 * The rename that publishes `target` from a source matching `source` (a pattern): a rename to it, or,
 * when its folders were missing, the rename of a staging folder of the source's to the highest
 * missing one (renameInto).
 */
const publishing = (source: string, target: string) => {
  const above: string[] = [];
  for (let d = path.dirname(target); d !== path.dirname(d); d = path.dirname(d)) above.push(literal(d));
  return new RegExp(
    `rename\\w*\\(.*"(?:${source}", .*"${literal(target)}|${source}\\.stage\\d+", .*"(?:${above.join("|")}))"`,
  );
};

test("local put and putFile flush the bytes before the rename, and the folder after it", {
  // Under CI (.ci/run installs strace) a missing strace fails the test instead of skipping it.
  skip: strace || process.env.CI === "true" ? false : "strace is not installed",
}, async () => {
  const root = path.join(scratch, "data");
  const input = path.join(scratch, "output.csv");
  fs.writeFileSync(input, "a,b\n1,2\n");
  const attempt = "outputs/100000007/10000000011.1.0e0e0e0e-0000-4000-8000-00000000000a";
  const calls = await traced(
    root,
    `await store.put("files/1000000", Readable.from([Buffer.from("x,y\\n3,4\\n")]));
await store.putFile(${JSON.stringify(`${attempt}/report.csv`)}, ${JSON.stringify(input)});`,
  );
  const partial = literal(path.join(root, ".partial"));
  for (const [key, folders] of [
    // Folders made for it: each one's entry is flushed too, in order, up to the root.
    ["files/1000000", ["files", ""]],
    [`${attempt}/report.csv`, [attempt, "outputs/100000007", "outputs", ""]],
  ] as const) {
    const renamed = find(calls, publishing(`${partial}/[^"/]+?`, path.join(root, key)), 0, `${key}'s rename`);
    const tmp = (
      /"([^"]+\/\.partial\/[^"/]+?)(?:\.stage\d+)?"/.exec(calls[renamed] as string) as RegExpExecArray
    )[1] as string;
    const flushed = calls.findIndex((c) => new RegExp(`f(data)?sync\\(\\d+<${literal(tmp)}>`).test(c));
    assert.ok(flushed >= 0 && flushed < renamed, `${key} is flushed before its rename:\n${calls.join("\n")}`);
    let at = renamed;
    for (const folder of folders) {
      at = find(
        calls,
        new RegExp(`fsync\\(\\d+<${literal(path.join(root, folder))}>`),
        at,
        `${folder || "the root"} flushed after ${key}'s rename`,
      );
    }
  }
  assert.equal(fs.readFileSync(path.join(root, "files/1000000"), "utf8"), "x,y\n3,4\n");
});

test("a run's outputs are flushed where they are published, before the completion could name them", {
  skip: strace || process.env.CI === "true" ? false : "strace is not installed",
}, async () => {
  const root = path.join(scratch, "data-outputs");
  const out = (n: number) => path.join(scratch, `attempt-${n}`, "out");
  for (const n of [1, 2]) {
    fs.mkdirSync(out(n), { recursive: true });
    fs.writeFileSync(path.join(out(n), "stats.json"), "{}");
    fs.writeFileSync(path.join(out(n), "stats.csv"), `a,${n}\n`);
  }
  const key = (n: number) => `outputs/100000009/1000000009${n}.2.0e0e0e0e-0000-4000-8000-00000000000b`;
  fs.mkdirSync(out(3), { recursive: true });
  fs.writeFileSync(path.join(out(3), "stats.json"), "{}");
  // Two runs of one task, published one after the other by one process; then the task's folder is
  // pruned and made again (as another worker's publish would), and a third run is published into it.
  const calls = await traced(
    root,
    `const { publishFolder } = await import(${JSON.stringify(path.join(ROOT, "src/storage/local.ts"))});
const fs = await import("node:fs");
for (const [from, to] of ${JSON.stringify([1, 2].map((n) => [out(n), key(n)]))})
  await publishFolder(store.root, from, store.localPath(to), ["stats.json", "stats.csv"]);
const task = store.localPath("outputs/100000009");
fs.rmSync(task, { recursive: true });
fs.mkdirSync(task);
await publishFolder(store.root, ${JSON.stringify(out(3))}, store.localPath(${JSON.stringify(key(3))}), ["stats.json"]);`,
  );
  let at = 0;
  for (const n of [1, 2]) {
    const target = path.join(root, key(n));
    const renamed = find(calls, publishing(literal(out(n)), target), at, `run ${n}'s rename`);
    // Its files and its folder, where they now are; then the task's folder; and for the first run,
    // whose rename made the task's folder and outputs/, those up to the root.
    at = renamed;
    const folders = n === 1 ? ["outputs/100000009", "outputs", ""] : ["outputs/100000009"];
    for (const p of [path.join(target, "stats.json"), path.join(target, "stats.csv"), target])
      at = find(calls, new RegExp(`f(data)?sync\\(\\d+<${literal(p)}>`), at, `${p} flushed`);
    for (const folder of folders)
      at = find(
        calls,
        new RegExp(`fsync\\(\\d+<${literal(path.join(root, folder))}>`),
        at,
        `${folder || "the root"} flushed after run ${n}`,
      );
  }
  // The second run's publish flushed outputs/ no more: its entry for the task's folder already was.
  // The third's did: the folder made again since is another folder.
  const outputsFlushes = calls.filter((c) =>
    new RegExp(`fsync\\(\\d+<${literal(path.join(root, "outputs"))}>`).test(c),
  );
  assert.equal(outputsFlushes.length, 2, calls.join("\n"));
  assert.equal(fs.readFileSync(path.join(root, key(3), "stats.json"), "utf8"), "{}");
});

test("a publish whose flush fails after the rename leaves nothing published", async () => {
  const root = path.join(scratch, "data-failing");
  const from = path.join(scratch, "attempt-failing", "out");
  fs.mkdirSync(from, { recursive: true });
  fs.writeFileSync(path.join(from, "stats.json"), "{}");
  const store = new LocalStore(root);
  const to = store.localPath("outputs/100000010/10000000101.1.0e0e0e0e-0000-4000-8000-00000000000c");
  // A file the caller names that is not there: its flush fails after the folder was renamed.
  await assert.rejects(publishFolder(store.root, from, to, ["stats.json", "gone.json"]), /ENOENT/);
  assert.equal(fs.existsSync(to), false, "the renamed folder is removed");
});
