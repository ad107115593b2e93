// assay submit's labels for its inputs (listInputs): a file given by itself is its base name, a walked
// one its path inside the folder (prefixed by the folder's name with several paths given); inputs
// that would share a label get as many of their own folders above it as make them differ — real
// paths, whatever the order of the arguments (until 2026-12-07 the second got " (2)", stored on the
// server as its name).
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { listInputs } from "../../src/client/inputs.ts";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-labels-"));
after(() => fs.rmSync(root, { recursive: true, force: true }));
for (const dir of ["x/data", "y/data", "z/données"]) fs.mkdirSync(path.join(root, dir), { recursive: true });
for (const file of ["x/data/a.csv", "y/data/a.csv", "z/données/a.csv", "x/data/b ✓.csv"])
  fs.writeFileSync(path.join(root, file), "a\n1\n");
const at = (p: string) => path.join(root, p);
const labels = (args: string[]) =>
  Object.fromEntries(listInputs(args.map(at)).map((i) => [path.relative(root, i.path), i.label]));

test("files of one name given from two folders are labelled with the folders that tell them apart", () => {
  const expected = { "x/data/a.csv": "x/data/a.csv", "y/data/a.csv": "y/data/a.csv" };
  assert.deepEqual(labels(["x/data/a.csv", "y/data/a.csv"]), expected);
  assert.deepEqual(labels(["y/data/a.csv", "x/data/a.csv"]), expected, "whatever the order");
  // One folder above is enough where it differs.
  assert.deepEqual(labels(["x/data/a.csv", "z/données/a.csv"]), {
    "x/data/a.csv": "data/a.csv",
    "z/données/a.csv": "données/a.csv",
  });
  // Alone, a file is its base name.
  assert.deepEqual(labels(["x/data/a.csv"]), { "x/data/a.csv": "a.csv" });
});

test("folders of one name walked together: their files' labels get the folders above them", () => {
  assert.deepEqual(labels(["x/data", "y/data"]), {
    "x/data/a.csv": "x/data/a.csv",
    "x/data/b ✓.csv": "data/b ✓.csv",
    "y/data/a.csv": "y/data/a.csv",
  });
  // A file given by itself beside a walked folder holding one of its name.
  assert.deepEqual(labels(["x/data", "y/data/a.csv"]), {
    "x/data/a.csv": "data/a.csv",
    "x/data/b ✓.csv": "data/b ✓.csv",
    "y/data/a.csv": "a.csv",
  });
});
