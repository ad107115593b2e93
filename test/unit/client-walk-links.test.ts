// Links in what `assay submit` walks: an --out reached through a link is still left out of the
// inputs (compared as real paths), and a link the walk skips or merges with its target is said.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { outsideOut } from "../../src/cli/client-submit.ts";
import { listInputs } from "../../src/client/inputs.ts";
import { ASSAY_BIN, cleanEnv } from "../helpers/cli.ts";
import { scratchDir } from "../helpers/tmp.ts";

const work = scratchDir("assay-walk-links-");

test("an --out reached through a link to a folder inside the walked one is left out, as the folder itself is", () => {
  const d3 = path.join(work, "d3");
  fs.mkdirSync(path.join(d3, "res", "a.csv"), { recursive: true });
  for (const n of ["a", "b", "c"]) fs.writeFileSync(path.join(d3, `${n}.csv`), "x\n1\n");
  // The last submit's outputs and results table, inside d3.
  fs.writeFileSync(path.join(d3, "res", "a.csv", "summary.json"), "{}");
  fs.writeFileSync(path.join(d3, "res", "results.csv"), "runId\n1\n");
  fs.symlinkSync(path.join(d3, "res"), path.join(work, "reslink"));
  const labels = (out: string) => outsideOut(listInputs([d3]), out, [d3]).map((f) => f.label);
  assert.deepEqual(labels(path.join(d3, "res")), ["a.csv", "b.csv", "c.csv"]);
  assert.deepEqual(labels(path.join(work, "reslink")), ["a.csv", "b.csv", "c.csv"]);
  // Relative, and through a link to the folder that holds the link.
  fs.symlinkSync(d3, path.join(work, "d3link"));
  const cwd = process.cwd();
  try {
    process.chdir(work);
    assert.deepEqual(labels("reslink"), ["a.csv", "b.csv", "c.csv"]);
    assert.deepEqual(labels("d3link/res"), ["a.csv", "b.csv", "c.csv"]);
  } finally {
    process.chdir(cwd);
  }
});

test("--out with a name that is not UTF-8 leaves a sibling folder whose name reads alike as UTF-8 among the inputs", () => {
  const data = path.join(work, "bytes-data");
  fs.mkdirSync(data);
  const named = (bytes: number[]) =>
    Buffer.concat([Buffer.from(`${data}/r`), Buffer.from(bytes), Buffer.from("s")]);
  // r\xE8s holds an input; --out is r\xE9s, which Node reads from the command line as r\uFFFDs (and
  // so r\xE8s reads too).
  fs.mkdirSync(named([0xe8]));
  fs.writeFileSync(Buffer.concat([named([0xe8]), Buffer.from("/input.csv")]), "x\n1\n");
  fs.writeFileSync(path.join(data, "top.csv"), "x\n1\n");
  const out = `${data}/r\ufffds`;
  const kept = outsideOut(listInputs([data]), out, [data]);
  assert.equal(kept.length, 2, kept.map((f) => f.path).join(", "));
});

test("a file whose name is not UTF-8, named by itself inside --out, stays an input", () => {
  const data = path.join(work, "named-in-out");
  const res = path.join(data, "res");
  fs.mkdirSync(res, { recursive: true });
  fs.writeFileSync(path.join(data, "a.csv"), "x\n1\n");
  // caf\xE9.csv on disk; the command line gives Node caf\uFFFD.csv.
  fs.writeFileSync(
    Buffer.concat([Buffer.from(`${res}/caf`), Buffer.from([0xe9]), Buffer.from(".csv")]),
    "x\n1\n",
  );
  fs.writeFileSync(path.join(res, "utf.csv"), "x\n1\n");
  for (const name of ["utf.csv", "caf\ufffd.csv"]) {
    const args = [data, path.join(res, name)];
    const kept = outsideOut(listInputs(args), res, args);
    assert.equal(kept.length, 2, `${name}: ${kept.map((f) => f.path).join(", ")}`);
  }
});

test("the same path given twice is submitted once without a note", () => {
  const dir = path.join(work, "twice");
  fs.mkdirSync(dir);
  const file = path.join(dir, "a.csv");
  fs.writeFileSync(file, "x\n1\n");
  const notes: string[] = [];
  assert.equal(listInputs([file, file], (n) => notes.push(n)).length, 1);
  assert.deepEqual(notes, []);
});

test("a link to nothing or to a folder is said as it is skipped, and a link to a file found too as it is merged", () => {
  const dir = path.join(work, "links");
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, "a.csv"), "x\n1\n");
  fs.writeFileSync(path.join(dir, "b.csv"), "x\n2\n");
  fs.symlinkSync(path.join(dir, "a.csv"), path.join(dir, "z-same.csv"));
  fs.symlinkSync(path.join(dir, "gone.csv"), path.join(dir, "dangling.csv"));
  fs.mkdirSync(path.join(work, "elsewhere"));
  fs.symlinkSync(path.join(work, "elsewhere"), path.join(dir, "folder-link"));
  const notes: string[] = [];
  const inputs = listInputs([dir], (n) => notes.push(n));
  assert.deepEqual(
    inputs.map((i) => i.label),
    ["a.csv", "b.csv"],
  );
  assert.deepEqual(notes, [
    `skipped: ${path.join(dir, "dangling.csv")} (a link to nothing)`,
    `skipped: ${path.join(dir, "folder-link")} (a link to a folder: not followed)`,
    `submitted once: ${path.join(dir, "z-same.csv")} (the same file as ${path.join(dir, "a.csv")})`,
  ]);
  // Many: counted, the first few named.
  const many = path.join(work, "many");
  fs.mkdirSync(many);
  for (let i = 0; i < 8; i++) fs.symlinkSync(path.join(work, `none-${i}`), path.join(many, `l${i}.csv`));
  fs.writeFileSync(path.join(many, "real.csv"), "x\n");
  const counted: string[] = [];
  listInputs([many], (n) => counted.push(n));
  assert.equal(counted.length, 1, counted.join("\n"));
  assert.match(counted[0] as string, /^skipped: 8 entries, .*l0\.csv \(a link to nothing\), .* and 5 more$/);
});

test("each command's help gives the exit codes that apply to it", () => {
  const help = (command: string) => {
    const r = spawnSync(process.execPath, [ASSAY_BIN, command, "--help"], { env: cleanEnv() });
    assert.equal(r.status, 0, r.stderr.toString());
    const text = r.stdout.toString();
    const codes = /\nExit codes: ([\s\S]*?)\.\n/.exec(text)?.[1]?.replace(/\n/g, " ") ?? "";
    assert.ok(codes, `${command} has an Exit codes paragraph:\n${text}`);
    assert.equal(text.match(/Exit codes:/g)?.length, 1, `${command}: one Exit codes paragraph`);
    return codes;
  };
  for (const command of ["tasks", "types", "status", "files"]) {
    const codes = help(command);
    assert.doesNotMatch(codes, /task (succeeded|failed)|\b1 /, `${command}: ${codes}`);
    assert.match(
      codes,
      /^0 .*; 2 .*; 3 .*; 130 Ctrl-C \(143 SIGTERM, 129 SIGHUP\); 141 /,
      `${command}: ${codes}`,
    );
  }
  assert.match(help("cancel"), /^0 the cancellation was accepted; 1 the task had already ended; 2 /);
  for (const command of ["follow", "download", "submit"])
    assert.match(help(command), /^0 .*; 1 .*; 2 .*; 3 .*; 130 /, command);
});
