// bin/patch-deps.js: the patches to installed dependencies (postgres.js's transaction-close fixes,
// whose behaviour test/integration/transaction-close.test.ts checks). Here: the installed copy is
// patched and marked, and the script's own rules on a package tree of its own.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { PATCHES, POSTGRES_PATCH, patchDeps } from "../../bin/patch-deps.js";
import { assertPostgresPatched } from "../../src/db/client.ts";

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "assay-patch-deps-"));
after(() => fs.rmSync(scratch, { recursive: true, force: true }));

test("the installed postgres.js is patched, and carries the mark of these patches", async () => {
  assert.doesNotThrow(() => patchDeps({ check: true }));
  assert.doesNotThrow(() => assertPostgresPatched());
  const { default: postgres } = await import("postgres");
  assert.equal((postgres as unknown as { assayPatch: string }).assayPatch, POSTGRES_PATCH);
  assert.match(POSTGRES_PATCH, /^assay-[0-9a-f]{16}$/);
});

let trees = 0;
/** A node_modules tree whose patched files hold each edit's text between lines of their own. */
function tree(version = "3.4.9"): { root: string; files: Map<string, string> } {
  const root = path.join(scratch, String(trees++));
  const files = new Map<string, string>();
  for (const patch of PATCHES) {
    const dir = path.join(root, "node_modules", patch.name);
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, "package.json"), JSON.stringify({ name: patch.name, version }));
    for (const [file, edits] of Object.entries(patch.files)) {
      const text = `// ${file}\n${edits.map((e, i) => `// before ${i}\n${e.find}\n`).join("")}// end\n`;
      fs.mkdirSync(path.dirname(path.join(dir, file)), { recursive: true });
      fs.writeFileSync(path.join(dir, file), text);
      files.set(path.join(dir, file), text);
    }
  }
  return { root, files };
}

test("applies every edit once, keeps the original, and applying again changes nothing", () => {
  const { root, files } = tree();
  assert.throws(() => patchDeps({ root, check: true }), /is not patched/);
  const report = patchDeps({ root });
  assert.equal(report.filter((l) => l.endsWith("patch applied")).length, files.size);
  const patched = new Map<string, string>();
  for (const [file, original] of files) {
    const text = fs.readFileSync(file, "utf8");
    assert.equal(fs.readFileSync(`${file}.orig`, "utf8"), original, "the original kept beside it");
    const edits = PATCHES[0]?.files[path.relative(path.join(root, "node_modules/postgres"), file)] ?? [];
    assert.ok(edits.length > 0);
    for (const e of edits)
      assert.equal(text.split(e.replace).length, 2, `${file}: ${e.replace.slice(0, 40)} once`);
    patched.set(file, text);
  }
  assert.ok(patchDeps({ root }).every((l) => l.endsWith(": patched")));
  assert.doesNotThrow(() => patchDeps({ root, check: true }));
  for (const [file, text] of patched) assert.equal(fs.readFileSync(file, "utf8"), text);
});

test("a file changed after patching is patched again from its original", () => {
  const { root, files } = tree();
  patchDeps({ root });
  const [file] = [...files.keys()];
  assert.ok(file);
  const patched = fs.readFileSync(file, "utf8");
  fs.appendFileSync(file, "// an older patch's leftovers\n");
  assert.throws(() => patchDeps({ root, check: true }), /is not patched/);
  patchDeps({ root });
  assert.equal(fs.readFileSync(file, "utf8"), patched);
});

test("another version, a missing or doubled text, or a patched file without its original fail loudly", () => {
  assert.throws(
    () => patchDeps({ root: tree("3.4.10").root }),
    /postgres 3\.4\.10 is installed; .* patches 3\.4\.9/,
  );

  const missing = tree();
  const [first] = [...missing.files.keys()];
  assert.ok(first);
  const edit = PATCHES[0]?.files["src/connection.js"]?.[0];
  assert.ok(edit);
  const connection = path.join(missing.root, "node_modules/postgres/src/connection.js");
  fs.writeFileSync(connection, (missing.files.get(connection) ?? "").replace(edit.find, "// moved"));
  assert.throws(
    () => patchDeps({ root: missing.root }),
    /src\/connection\.js: the text to patch is not there/,
  );
  assert.equal(fs.existsSync(`${connection}.orig`), false, "nothing written for a file that failed");

  const doubled = tree();
  const again = path.join(doubled.root, "node_modules/postgres/src/connection.js");
  fs.appendFileSync(again, `${edit.find}\n`);
  assert.throws(() => patchDeps({ root: doubled.root }), /the text to patch is there twice/);

  const orphan = tree();
  patchDeps({ root: orphan.root });
  const index = path.join(orphan.root, "node_modules/postgres/src/index.js");
  fs.rmSync(`${index}.orig`);
  fs.appendFileSync(index, "// changed\n");
  assert.throws(() => patchDeps({ root: orphan.root }), /was patched and its original is gone: reinstall/);
});
