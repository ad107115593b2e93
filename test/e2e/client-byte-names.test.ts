// File names as Linux has them — bytes, not always UTF-8 — through the real client against a real
// `assay all`: a folder copied from a Latin-1 system holds `caf\xE9.csv`, which Node decodes as
// `caf\uFFFD.csv`; such a name is uploaded from its own bytes, labelled with each byte outside UTF-8
// as `%XX`, and never taken for another file of the same decoded name.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { client, clientSuite, csv, errorOf, jsonLines, ofKind } from "../helpers/client.ts";

const suite = clientSuite({
  user: "jürgen «octets»",
  scratch: "assay-client-byte-names-",
  ids: { tasks: 0, runs: 1, files: 1 },
});

/** A path under `dir` whose last segments are raw bytes (a latin1 string: one byte per character). */
const bytePath = (dir: string, ...latin1: string[]) =>
  Buffer.concat([Buffer.from(dir), ...latin1.map((s) => Buffer.from(`/${s}`, "latin1"))]);

const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

type FileLine = { path: string; name: string; sha256: string; uploaded: boolean; fileId: string };

test("a folder with names that are not UTF-8 uploads each file from its own bytes under a name of its own", async () => {
  const dir = path.join(suite.work, "partage windows");
  fs.mkdirSync(dir);
  // Three names Node reads alike (caf\uFFFD.csv), each its own file with its own bytes; a folder
  // whose name is not UTF-8 either; beside them names a terminal or a shell would trip over.
  const contents: Record<string, string> = {
    "caf%E9.csv": csv(21, 3),
    "caf%EA.csv": csv(22, 4),
    "caf\ufffd.csv": csv(23, 5),
    "r%E9sum%E9/donn%E9es 2024.csv": csv(24, 6),
    "-rf.csv": csv(25, 7),
    "tab\there.csv": csv(26, 8),
    // A macOS copy beside the original: one name composed, one decomposed.
    "\u00e9t\u00e9.csv": csv(27, 9),
    "e\u0301te\u0301.csv": csv(28, 10),
  };
  fs.writeFileSync(bytePath(dir, "caf\xe9.csv"), contents["caf%E9.csv"] as string);
  fs.writeFileSync(bytePath(dir, "caf\xea.csv"), contents["caf%EA.csv"] as string);
  fs.writeFileSync(path.join(dir, "caf\ufffd.csv"), contents["caf\ufffd.csv"] as string);
  fs.mkdirSync(bytePath(dir, "r\xe9sum\xe9"));
  fs.writeFileSync(
    bytePath(dir, "r\xe9sum\xe9", "donn\xe9es 2024.csv"),
    contents["r%E9sum%E9/donn%E9es 2024.csv"] as string,
  );
  fs.writeFileSync(path.join(dir, "-rf.csv"), contents["-rf.csv"] as string);
  fs.writeFileSync(path.join(dir, "tab\there.csv"), contents["tab\there.csv"] as string);
  for (const name of ["\u00e9t\u00e9.csv", "e\u0301te\u0301.csv"])
    fs.writeFileSync(path.join(dir, name), contents[name] as string);
  const out = path.join(suite.work, "résultats");

  const r = await client(["submit", "--type", "summary", dir, "--out", out], suite.env());
  assert.equal(r.code, 0, r.stdout + r.stderr);
  const files = ofKind(jsonLines(r.stdout), "file") as unknown as FileLine[];
  assert.deepEqual(files.map((f) => f.path).sort(), Object.keys(contents).sort());
  for (const f of files) {
    assert.equal(f.sha256, sha256(contents[f.path] as string), `${f.path} is uploaded from its own bytes`);
    assert.equal(f.uploaded, true);
  }
  assert.equal(files.find((f) => f.path === "caf%E9.csv")?.name, "caf%E9.csv");
  assert.equal(files.find((f) => f.path === "r%E9sum%E9/donn%E9es 2024.csv")?.name, "donn%E9es 2024.csv");
  // Every input's outputs in a folder of its own, named by its label (a tab is no part of a folder name).
  const folders = Object.keys(contents)
    .filter((label) => !label.endsWith("te\u0301.csv") && !label.endsWith("t\u00e9.csv"))
    .map((label) => label.replace("\t", "_"));
  for (const folder of folders)
    assert.ok(
      fs.statSync(path.join(out, folder, "summary.json")).isFile(),
      `${folder}'s outputs under --out`,
    );

  // The two that are one name on macOS each get a folder of their own there too.
  const alike = fs.readdirSync(out).filter((f) => /^été\.csv \(run [0-9]+\)$/.test(f.normalize("NFC")));
  assert.equal(alike.length, 2, fs.readdirSync(out).join(", "));
  for (const folder of alike) assert.ok(fs.statSync(path.join(out, folder, "summary.json")).isFile());

  // Again: every file is found on the server by its bytes and the name it was stored under.
  const again = await client(["submit", "--type", "summary", dir], suite.env());
  assert.equal(again.code, 0, again.stdout + again.stderr);
  const reused = ofKind(jsonLines(again.stdout), "file") as unknown as FileLine[];
  assert.deepEqual(
    reused.map((f) => [f.path, f.uploaded, f.fileId]).sort(),
    files.map((f) => [f.path, false, f.fileId]).sort(),
  );
});

test("a name that is not UTF-8 given on the command line (as a shell's glob passes it) is found by its bytes", async () => {
  const dir = path.join(suite.work, "globbed");
  fs.mkdirSync(dir);
  fs.writeFileSync(bytePath(dir, "caf\xe9.csv"), csv(5, 1));
  fs.mkdirSync(bytePath(dir, "r\xe9sum\xe9"));
  fs.writeFileSync(bytePath(dir, "r\xe9sum\xe9", "a.csv"), csv(6, 2));
  // Node reads the command line as UTF-8: each byte arrives as U+FFFD.
  const r = await client(
    ["submit", "--type", "summary", path.join(dir, "caf\ufffd.csv"), path.join(dir, "r\ufffdsum\ufffd")],
    suite.env(),
  );
  assert.equal(r.code, 0, r.stdout + r.stderr);
  const files = ofKind(jsonLines(r.stdout), "file") as unknown as FileLine[];
  // In the order the uploads ended, which varies.
  assert.deepEqual(files.map((f) => [f.path, f.sha256]).sort(), [
    ["caf%E9.csv", sha256(csv(5, 1))],
    ["r%E9sum%E9/a.csv", sha256(csv(6, 2))],
  ]);

  // Two names Node reads alike: which was meant cannot be told.
  fs.writeFileSync(bytePath(dir, "caf\xea.csv"), csv(7, 3));
  const two = await client(["submit", "--type", "summary", path.join(dir, "caf\ufffd.csv")], suite.env());
  assert.equal(two.code, 2, two.stdout + two.stderr);
  const err = errorOf(two.stdout);
  assert.equal(err?.code, "USAGE");
  assert.match(
    err?.message ?? "",
    /caf\ufffd\.csv could be any of 2 files whose names read alike \(caf%E9\.csv, caf%EA\.csv\): give the folder that holds them$/,
  );

  // One of them named U+FFFD itself (valid UTF-8), beside one that is not UTF-8: stat() found the
  // first and took it for the one meant.
  const lone = path.join(suite.work, "lone");
  fs.mkdirSync(lone);
  fs.writeFileSync(bytePath(lone, "caf\xe9.csv"), csv(8, 4));
  fs.writeFileSync(path.join(lone, "caf\ufffd.csv"), csv(9, 5));
  const alike = await client(["submit", "--type", "summary", path.join(lone, "caf\ufffd.csv")], suite.env());
  assert.equal(alike.code, 2, alike.stdout + alike.stderr);
  assert.match(
    errorOf(alike.stdout)?.message ?? "",
    /could be any of 2 files whose names read alike \(caf%E9\.csv, caf\ufffd\.csv\)/,
  );

  // Below a folder whose name is not UTF-8: said so.
  const below = await client(
    ["submit", "--type", "summary", path.join(dir, "r\ufffdsum\ufffd", "a.csv")],
    suite.env(),
  );
  assert.equal(below.code, 2, below.stdout + below.stderr);
  assert.equal(errorOf(below.stdout)?.code, "USAGE");
  assert.match(
    errorOf(below.stdout)?.message ?? "",
    /^no such file or directory: .*a\.csv \(a folder whose name is not UTF-8/,
  );
});
