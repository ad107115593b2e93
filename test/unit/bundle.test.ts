import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { buildBundle } from "../../bin/build.js";
import {
  bundleEntry,
  MANIFEST,
  MANIFEST_VERSION,
  type Manifest,
  ROOT,
  readManifest,
  staleReason,
  stamp,
} from "../../bin/bundle.js";
import { scratchDir } from "../helpers/tmp.ts";

const bin = path.join(ROOT, "bin/assay.js");

function assay(args: string[], env: NodeJS.ProcessEnv, nodeArgs: string[] = []) {
  return spawnSync(process.execPath, [...nodeArgs, bin, ...args], {
    env: { PATH: process.env.PATH, ...env },
    encoding: "utf8",
  });
}

/** A bundle folder of the test's own, inside the checkout (where a bundle must be). */
function testBundleDir(): string {
  return path.join(
    ROOT,
    "node_modules",
    ".cache",
    `assay-bundle-test-${crypto.randomBytes(4).toString("hex")}`,
  );
}

test("a bundle is current only while every file it was built from is as it was, in the same folder", () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bundle-root-"));
  const dir = path.join(root, "node_modules/.cache/b");
  try {
    fs.mkdirSync(dir, { recursive: true });
    assert.equal(staleReason(dir, root), "no bundle");
    fs.mkdirSync(path.join(root, "src/ünïcode dir"), { recursive: true });
    const files = ["src/cli.ts", "src/ünïcode dir/a.ts"];
    for (const f of files) fs.writeFileSync(path.join(root, f), "export const a = 1;\n");
    fs.writeFileSync(path.join(dir, "cli-X.js"), "");
    const write = (m: Partial<Manifest> = {}) => {
      const manifest: Manifest = {
        version: MANIFEST_VERSION,
        root,
        builtAt: new Date().toISOString(),
        entry: "cli-X.js",
        outputs: ["cli-X.js"],
        files: files.map((f) => stamp(root, f) ?? assert.fail(f)),
        ...m,
      };
      fs.writeFileSync(path.join(dir, MANIFEST), JSON.stringify(manifest));
    };
    write();
    assert.equal(staleReason(dir, root), null);
    assert.match(staleReason(dir, `${root}-moved`) ?? "", /is outside/);
    write({ root: "/elsewhere" });
    assert.equal(staleReason(dir, root), "built for /elsewhere");
    // Outside the checkout the bundle could not import the packages it leaves in node_modules, and
    // a folder inside reached through a symbolic link is where its target is.
    assert.match(staleReason(os.tmpdir(), root) ?? "", /is outside/);
    const away = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bundle-away-"));
    fs.symlinkSync(away, path.join(root, "linked"));
    assert.match(staleReason(path.join(root, "linked/b"), root) ?? "", /is outside/);
    fs.rmSync(away, { recursive: true });

    write();
    // Same size, another modification time (a checkout of another commit, an editor's save).
    const a = path.join(root, "src/ünïcode dir/a.ts");
    const later = new Date(fs.statSync(a).mtimeMs + 5_000);
    fs.utimesSync(a, later, later);
    assert.equal(staleReason(dir, root), "src/ünïcode dir/a.ts changed");
    write();
    fs.writeFileSync(path.join(root, "src/cli.ts"), "export const a = 12;\n");
    assert.equal(staleReason(dir, root), "src/cli.ts changed");
    write({ outputs: ["cli-X.js", "chunk-Y.js", "chunk-Y.js.map"] });
    assert.equal(staleReason(dir, root), "chunk-Y.js is missing", "a chunk a lazy import would need");
    write();
    fs.rmSync(path.join(dir, "cli-X.js"));
    assert.equal(staleReason(dir, root), "cli-X.js is missing");
    fs.writeFileSync(path.join(dir, "cli-X.js"), "");
    // A file recorded as absent (tsconfig.json, say) that appears makes it stale as well.
    write({ files: [["tsconfig.json", -1, -1]] });
    assert.equal(staleReason(dir, root), null);
    fs.writeFileSync(path.join(root, "tsconfig.json"), "{}");
    assert.equal(staleReason(dir, root), "tsconfig.json changed");
    write();
    fs.rmSync(a);
    assert.equal(staleReason(dir, root), "src/ünïcode dir/a.ts is gone");

    // Anything malformed is a reason, never an exception: the sources run.
    for (const bad of [
      { version: 99, files: [] },
      { ...(readManifest(dir) as Manifest), files: [["x", "1", 2]] },
    ]) {
      fs.writeFileSync(path.join(dir, MANIFEST), JSON.stringify(bad));
      assert.equal(staleReason(dir, root), "unknown manifest");
    }
    fs.writeFileSync(path.join(dir, MANIFEST), "{ half a manifest");
    assert.equal(staleReason(dir, root), "no bundle");
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
});

test("bin/assay.js runs a current bundle whole, the sources when ASSAY_BUNDLE=0 or it is stale; builds retire old files", async () => {
  const dir = testBundleDir();
  try {
    await assert.rejects(buildBundle(scratchDir("b-")), /must be built inside/);
    const first = await buildBundle(dir);
    const stale = path.join(dir, "chunk-RETIRED0.js");
    fs.writeFileSync(stale, "");
    const weekAgo = new Date(Date.now() - 7 * 24 * 3600 * 1000);
    fs.utimesSync(stale, weekAgo, weekAgo);
    // The last build's entry, as if this build's sources differed: retired now, removed an hour later.
    const manifest = readManifest(dir) as Manifest;
    fs.writeFileSync(
      path.join(dir, MANIFEST),
      JSON.stringify({ ...manifest, outputs: [...manifest.outputs, "cli-OLDENTRY.js"] }),
    );
    fs.writeFileSync(path.join(dir, "cli-OLDENTRY.js"), "");
    fs.utimesSync(path.join(dir, "cli-OLDENTRY.js"), weekAgo, weekAgo);

    const built = await buildBundle(dir);
    assert.match(first.entry, /^cli-\w+\.js$/);
    assert.ok(built.inputs > 50, `bundled ${built.inputs} sources`);
    assert.equal(fs.existsSync(stale), false, "a file retired a week ago is removed");
    assert.ok(
      fs.existsSync(path.join(dir, "cli-OLDENTRY.js")),
      "the last build's file stays for whoever still runs it",
    );
    assert.ok(
      Date.now() - fs.statSync(path.join(dir, "cli-OLDENTRY.js")).mtimeMs < 60_000,
      "…marked retired now",
    );
    assert.equal(bundleEntry({ ASSAY_BUNDLE_DIR: dir }), path.join(dir, built.entry));

    // Only what a build writes is ever removed; and with the last manifest unreadable, every earlier
    // build file counts as retired now (a server may still run that bundle), none is removed.
    const foreign = path.join(dir, "notes.txt");
    fs.writeFileSync(foreign, "");
    fs.utimesSync(foreign, weekAgo, weekAgo);
    fs.mkdirSync(path.join(dir, "old-folder-ABCDEFGH.js"));
    fs.writeFileSync(path.join(dir, "chunk-OLDCHUNK.js"), "");
    fs.utimesSync(path.join(dir, "chunk-OLDCHUNK.js"), weekAgo, weekAgo);
    fs.writeFileSync(path.join(dir, MANIFEST), "{ torn");
    await buildBundle(dir);
    assert.ok(fs.existsSync(foreign), "a file the build did not write stays");
    assert.ok(fs.existsSync(path.join(dir, "chunk-OLDCHUNK.js")), "kept: the last manifest was unreadable");
    assert.ok(Date.now() - fs.statSync(path.join(dir, "chunk-OLDCHUNK.js")).mtimeMs < 60_000);
    assert.equal(bundleEntry({ ASSAY_BUNDLE_DIR: dir, ASSAY_BUNDLE: "0" }), undefined);

    // Nothing in it still names the bundle's own place as a source's: every import.meta was replaced
    // (the banner's aside), so the analysis scripts, migrations and dashboard are found where they are.
    const js = (readManifest(dir) as Manifest).outputs.filter((f) => f.endsWith(".js"));
    const texts = js.map((f) => fs.readFileSync(path.join(dir, f), "utf8"));
    assert.deepEqual(
      texts.filter((t) => (t.match(/import\.meta/g) ?? []).length !== 1),
      [],
      "import.meta only in each file's banner",
    );
    assert.ok(
      texts.some((t) => t.includes(JSON.stringify(pathToFileURL(path.join(ROOT, "src/db/migrate.ts")).href))),
    );

    // Every chunk loads: the packages left outside resolve from the checkout's node_modules, and no
    // bundled module needs a file next to itself at load time. (The entry runs the CLI: not here.)
    const loader = `for (const f of ${JSON.stringify(js.filter((f) => !f.startsWith("cli-")).map((f) => pathToFileURL(path.join(dir, f)).href))}) await import(f);`;
    const loaded = spawnSync(process.execPath, ["--input-type=module", "-e", loader], { encoding: "utf8" });
    assert.equal(loaded.status, 0, loaded.stderr);

    const fromBundle = assay(["--version"], { ASSAY_BUNDLE_DIR: dir });
    assert.equal(fromBundle.status, 0, fromBundle.stderr);
    assert.match(fromBundle.stdout, /^assay \d+\.\d+\.\d+ \(bundle built \d{4}-\d\d-\d\dT/);
    const fromSources = assay(["--version"], { ASSAY_BUNDLE_DIR: dir, ASSAY_BUNDLE: "0" });
    assert.match(fromSources.stdout, /^assay \d+\.\d+\.\d+ \(sources\)/);
    const config = assay(["config"], { ASSAY_BUNDLE_DIR: dir });
    assert.equal(config.status, 0, config.stderr);
    assert.match(config.stdout, /ASSAY_MAX_TASK_RUNS/);
    const usage = assay(["no-such-command"], { ASSAY_BUNDLE_DIR: dir });
    assert.equal(usage.status, 2);
    assert.match(usage.stderr, /unknown command: no-such-command/);

    // esbuild splits where the CLI imports a command lazily: a client command loads nothing of the
    // server, from the bundle (its chunks' module comments) or beside it (the packages left outside).
    // The same rule as test/e2e/client.test.ts's on the sources, module by module.
    const trace = path.join(dir, "imports.txt");
    const client = assay(
      ["tasks"],
      {
        ASSAY_BUNDLE_DIR: dir,
        ASSAY_TRACE_IMPORTS: trace,
        ASSAY_URL: "http://127.0.0.1:1",
        ASSAY_TOKEN: "t",
      },
      ["--import", path.join(ROOT, "test/helpers/trace-imports.mjs")],
    );
    assert.notEqual(client.status, 0, "nothing listens on port 1");
    const urls = [...new Set(fs.readFileSync(trace, "utf8").split("\n").filter(Boolean))];
    const inBundle = urls.filter((u) => u.startsWith(pathToFileURL(dir).href));
    const chunks = inBundle.map((u) => fs.readFileSync(fileURLToPath(u), "utf8"));
    assert.ok(
      chunks.some((c) => c.includes("// src/cli/client-tasks.ts")),
      "the trace sees the client's chunk",
    );
    const server =
      /node_modules\/(fastify|@fastify|postgres|@aws-sdk|pino|typebox|drizzle-orm|tsx|prom-client)\/|src\/(config|log|db|queue|storage|tasks|files|auth|events|runner|metrics)(\/|\.ts|-)|src\/http\/(app|server|auth|routes)/;
    const modules = chunks.flatMap((c) => c.match(/^\/\/ \S+$/gm) ?? []);
    assert.deepEqual(
      [...modules, ...urls.filter((u) => !u.startsWith(pathToFileURL(dir).href))].filter((m) =>
        server.test(m),
      ),
      [],
      "a client command holds no server module",
    );
    assert.ok(modules.length > 5, "the chunks name their modules");

    // A manifest naming a source that changed since: the sources run.
    const now = readManifest(dir) as Manifest;
    const [file, size, mtimeMs] = now.files[0] ?? assert.fail("no files");
    fs.writeFileSync(
      path.join(dir, MANIFEST),
      JSON.stringify({ ...now, files: [[file, size + 1, mtimeMs]] }),
    );
    assert.equal(staleReason(dir), `${file} changed`);
    assert.match(assay(["--version"], { ASSAY_BUNDLE_DIR: dir }).stdout, /\(sources\)/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("a source saved while the bundle is being built leaves no manifest vouching for it", async () => {
  // A copy of the checkout's sources (node_modules linked), so the edit cannot disturb other tests;
  // it lies under a node_modules folder, as a checkout installed from git does, and its sources are
  // still told from its dependencies.
  const root = fs.mkdtempSync(path.join(ROOT, "node_modules", ".cache", "assay-build-race-"));
  try {
    for (const f of ["bin", "src", "web", "package.json", "tsconfig.json"]) {
      fs.cpSync(path.join(ROOT, f), path.join(root, f), { recursive: true });
    }
    fs.symlinkSync(path.join(ROOT, "node_modules"), path.join(root, "node_modules"));
    // The build's own first step stamps src/cli.ts; the edit lands after that, before esbuild ends.
    const script = `
      import fs from "node:fs";
      const { buildBundle } = await import(${JSON.stringify(pathToFileURL(path.join(root, "bin/build.js")).href)});
      const file = ${JSON.stringify(path.join(root, "src/cli.ts"))};
      const orig = fs.promises.readFile;
      fs.promises.readFile = async (p, ...rest) => {
        const text = await orig(p, ...rest);
        if (p === file) { const later = new Date(Date.now() + 10_000); fs.utimesSync(file, later, later); }
        return text;
      };
      try { await buildBundle(${JSON.stringify(path.join(root, "out"))}); console.log("built"); }
      catch (err) { console.log(String(err.message)); }`;
    const r = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" });
    assert.match(r.stdout, /src\/cli\.ts changed during the build/, r.stderr);
    assert.equal(fs.existsSync(path.join(root, "out", MANIFEST)), false);
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
});
