import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { buildBundle } from "../../bin/build.js";
import { bundleEntry, ENTRY, MANIFEST, manifestFor, ROOT, staleReason } from "../../bin/bundle.js";

const bin = path.join(ROOT, "bin/assay.js");

function assay(args: string[], env: NodeJS.ProcessEnv) {
  return spawnSync(process.execPath, [bin, ...args], {
    env: { PATH: process.env.PATH, ...env },
    encoding: "utf8",
  });
}

test("a bundle is current only while every file it was built from is as it was, in the same folder", () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bundle-root-"));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bundle-dir-"));
  try {
    assert.equal(staleReason(dir, root), "no bundle");
    fs.mkdirSync(path.join(root, "src/ünïcode dir"), { recursive: true });
    const files = ["src/cli.ts", "src/ünïcode dir/a.ts"];
    for (const f of files) fs.writeFileSync(path.join(root, f), "export const a = 1;\n");
    const write = () => fs.writeFileSync(path.join(dir, MANIFEST), JSON.stringify(manifestFor(root, files)));
    write();
    assert.equal(staleReason(dir, root), null);
    assert.match(staleReason(dir, `${root}-moved`) ?? "", /^built for /);

    // Same size, another modification time (a checkout of another commit, an editor's save).
    const a = path.join(root, "src/ünïcode dir/a.ts");
    const later = new Date(fs.statSync(a).mtimeMs + 5_000);
    fs.utimesSync(a, later, later);
    assert.equal(staleReason(dir, root), "src/ünïcode dir/a.ts changed");
    write();
    fs.writeFileSync(path.join(root, "src/cli.ts"), "export const a = 12;\n");
    assert.equal(staleReason(dir, root), "src/cli.ts changed");
    write();
    fs.rmSync(a);
    assert.equal(staleReason(dir, root), "src/ünïcode dir/a.ts is gone");

    fs.writeFileSync(path.join(dir, MANIFEST), JSON.stringify({ version: 99, files: [] }));
    assert.equal(staleReason(dir, root), "unknown manifest");
    fs.writeFileSync(path.join(dir, MANIFEST), "{ half a manifest");
    assert.equal(staleReason(dir, root), "no bundle");
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("bin/assay.js runs a current bundle, the sources when ASSAY_BUNDLE=0 or the bundle is stale; a build keeps recent files of the last one", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bundle-built-"));
  try {
    const old = path.join(dir, "chunk-FROMLASTWEEK.js");
    const recent = path.join(dir, "chunk-FROMAMINUTEAGO.js");
    fs.writeFileSync(old, "");
    fs.writeFileSync(recent, "");
    const weekAgo = new Date(Date.now() - 7 * 24 * 3600 * 1000);
    fs.utimesSync(old, weekAgo, weekAgo);

    const built = await buildBundle(dir);
    assert.ok(built.inputs > 50, `bundled ${built.inputs} sources`);
    assert.equal(fs.existsSync(old), false, "a file of a week-old build is removed");
    assert.equal(fs.existsSync(recent), true, "a file a running server may still import is kept");
    assert.equal(bundleEntry({ ASSAY_BUNDLE_DIR: dir }), path.join(dir, ENTRY));
    assert.equal(bundleEntry({ ASSAY_BUNDLE_DIR: dir, ASSAY_BUNDLE: "0" }), undefined);

    const fromBundle = assay(["--version"], { ASSAY_BUNDLE_DIR: dir });
    assert.equal(fromBundle.status, 0, fromBundle.stderr);
    assert.match(fromBundle.stdout, /^assay \d+\.\d+\.\d+ \(bundle built \d{4}-\d\d-\d\dT/);
    const fromSources = assay(["--version"], { ASSAY_BUNDLE_DIR: dir, ASSAY_BUNDLE: "0" });
    assert.match(fromSources.stdout, /^assay \d+\.\d+\.\d+ \(sources\)/);

    // The bundle's lazily imported commands load from its own chunks and find files by the source
    // locations (config reads nothing from disk; the analysis registry resolves its scripts' folder).
    const config = assay(["config"], { ASSAY_BUNDLE_DIR: dir });
    assert.equal(config.status, 0, config.stderr);
    assert.match(config.stdout, /ASSAY_MAX_TASK_RUNS/);
    const usage = assay(["no-such-command"], { ASSAY_BUNDLE_DIR: dir });
    assert.equal(usage.status, 2);
    assert.match(usage.stderr, /unknown command: no-such-command/);

    // esbuild splits where the CLI imports a command lazily: a client command's chunks hold nothing
    // of the server (the same rule test/e2e/client.test.ts checks on the sources, module by module).
    const trace = path.join(dir, "imports.txt");
    const client = spawnSync(
      process.execPath,
      ["--import", path.join(ROOT, "test/helpers/trace-imports.mjs"), bin, "tasks"],
      {
        env: {
          PATH: process.env.PATH,
          ASSAY_BUNDLE_DIR: dir,
          ASSAY_TRACE_IMPORTS: trace,
          ASSAY_URL: "http://127.0.0.1:1",
          ASSAY_TOKEN: "t",
        },
        encoding: "utf8",
      },
    );
    assert.notEqual(client.status, 0, "nothing listens on port 1");
    const chunks = [
      ...new Set(
        fs
          .readFileSync(trace, "utf8")
          .split("\n")
          .filter((u) => u.startsWith(pathToFileURL(dir).href)),
      ),
    ].map((u) => fs.readFileSync(fileURLToPath(u), "utf8"));
    assert.ok(
      chunks.some((c) => c.includes("// src/cli/client-tasks.ts")),
      "the trace sees the client's chunk",
    );
    const server =
      /\/\/ (node_modules\/(fastify|@fastify|postgres|typebox|prom-client)\/|src\/(config|db|queue|storage|tasks|http)\/)/;
    assert.deepEqual(
      chunks.flatMap((c) => c.match(server) ?? []).slice(0, 1),
      [],
      "a client command's chunks hold no server module",
    );

    // A manifest naming a source that changed since: the sources run.
    const manifest = JSON.parse(fs.readFileSync(path.join(dir, MANIFEST), "utf8"));
    manifest.files[0][1] += 1;
    fs.writeFileSync(path.join(dir, MANIFEST), JSON.stringify(manifest));
    assert.match(staleReason(dir) ?? "", / changed$/);
    assert.match(assay(["--version"], { ASSAY_BUNDLE_DIR: dir }).stdout, /\(sources\)/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
