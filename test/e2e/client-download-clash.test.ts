// Downloads (the real client against a real `assay all`) into a folder where something of another
// kind already has a name the download needs: the input files themselves (`download 42 --out .` in
// the inputs' folder, where the run's folder `a.csv` would go), a folder where an output file goes, a
// link to nothing, an --out that is a file or below one. Each is exit 2 with the code `PATH_CONFLICT` and a message naming the path
// in the way — not the system's EEXIST — and nothing in the way is overwritten or removed, and no
// temporary file is left.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { client, clientSuite, csv, errorOf, jsonLines, ofKind } from "../helpers/client.ts";

const suite = clientSuite({
  user: "léa «download» ✓",
  scratch: "assay-client-clash-",
  ids: { tasks: 0, runs: 1 },
});

/** Every file under `dir` whose name is a download's temporary one. */
const partials = (dir: string) =>
  (fs.readdirSync(dir, { recursive: true }) as string[]).filter((p) => p.includes(".partial-"));

test("a download whose folders or files clash with what is there is exit 2 PATH_CONFLICT naming it, and touches nothing", async () => {
  // The inputs' own folder holds a file where the run of `relevé 1.csv` wants its folder. (submit
  // --out refuses it before uploading anything: client-submit-out.test.ts.)
  const here = path.join(suite.work, "données");
  fs.mkdirSync(here);
  const a = path.join(here, "relevé 1.csv");
  const b = path.join(here, "日本語 2.csv");
  fs.writeFileSync(a, csv(20, 3));
  fs.writeFileSync(b, csv(20, 5));
  const before = fs.readFileSync(a);
  const submitted = await client(["submit", "--type", "summary", a, b, "--follow"], suite.env());
  assert.equal(submitted.code, 0, submitted.stderr);
  const taskId = String(ofKind(jsonLines(submitted.stdout), "task")[0]?.taskId);
  const inputs = await client(["download", taskId, "--out", here], suite.env());
  assert.equal(inputs.code, 2, inputs.stderr);
  const err = errorOf(inputs.stdout);
  assert.equal(err?.code, "PATH_CONFLICT", inputs.stdout);
  assert.match(
    err?.message ?? "",
    /cannot make the folder for run [0-9]+ \(.*\): .*données\/.* is a file, not a folder/,
  );
  assert.match(inputs.stderr, /is a file, not a folder; move it, or download into another --out DIR/);
  assert.deepEqual(fs.readFileSync(a), before, "the input is untouched");
  assert.deepEqual(partials(here), []);

  // A folder where an output file goes, and a link to nothing where a run's folder goes.
  const out = path.join(suite.work, "sortie");
  fs.mkdirSync(path.join(out, "relevé 1.csv", "summary.json", "déjà là"), { recursive: true });
  const first = await client(["download", taskId, "--out", out], suite.env());
  assert.equal(first.code, 2, first.stderr);
  assert.equal(errorOf(first.stdout)?.code, "PATH_CONFLICT", first.stdout);
  assert.match(errorOf(first.stdout)?.message ?? "", /summary\.json is a folder, not a file/);
  assert.ok(fs.statSync(path.join(out, "relevé 1.csv", "summary.json", "déjà là")).isDirectory());
  assert.deepEqual(partials(out), []);

  const linked = path.join(suite.work, "lien");
  fs.mkdirSync(linked);
  fs.symlinkSync(path.join(suite.work, "nowhere"), path.join(linked, "日本語 2.csv"));
  const second = await client(["download", taskId, "--out", linked], suite.env());
  assert.equal(second.code, 2, second.stderr);
  assert.equal(errorOf(second.stdout)?.code, "PATH_CONFLICT", second.stdout);
  assert.match(errorOf(second.stdout)?.message ?? "", /日本語 2\.csv is a link to nothing, not a folder/);
  assert.equal(fs.existsSync(path.join(suite.work, "nowhere")), false, "nothing made where the link points");

  // --out a file.
  const file = path.join(suite.work, "un fichier.txt");
  fs.writeFileSync(file, "mine\n");
  const third = await client(["download", taskId, "--out", file], suite.env());
  assert.equal(third.code, 2, third.stderr);
  assert.equal(errorOf(third.stdout)?.code, "PATH_CONFLICT", third.stdout);
  assert.match(
    errorOf(third.stdout)?.message ?? "",
    /cannot make the folder for the download: .*un fichier\.txt is a file/,
  );
  // Below a file: the system's ENOTDIR, said as the file in the way.
  const below = await client(["download", taskId, "--out", path.join(file, "dessous")], suite.env());
  assert.equal(below.code, 2, below.stderr);
  assert.equal(errorOf(below.stdout)?.code, "PATH_CONFLICT", below.stdout);
  assert.match(errorOf(below.stdout)?.message ?? "", /un fichier\.txt is a file, not a folder/);
  assert.equal(fs.readFileSync(file, "utf8"), "mine\n");

  // Out of the way, the same command downloads everything.
  const clean = path.join(suite.work, "propre");
  const ok = await client(["download", taskId, "--out", clean], suite.env());
  assert.equal(ok.code, 0, ok.stderr);
  assert.ok(fs.statSync(path.join(clean, "relevé 1.csv", "summary.json")).isFile());
});
