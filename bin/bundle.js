// The production bundle (bin/build.js writes it; bin/assay.js runs it when it is current).
//
// `assay api` spent ~300 ms of its start resolving and evaluating ~1,000 modules (TypeBox's 373,
// Ajv's, yaml's for the OpenAPI document, OpenTelemetry's for prom-client, ...). The bundle is our
// sources and most of their dependencies in a few dozen files, built by `npm ci` (the `prepare`
// script) and by `make dev` / `make test` / `make bundle`, into node_modules/.cache: nothing to build
// by hand, and nothing to commit.
//
// It is used only while it is current: its manifest names every one of our source files it was
// built from with the size and modification time each had before esbuild read it, the other files
// a build depends on (npm's record of node_modules, package.json, tsconfig.json, the build script),
// and the folder the checkout is in (a bundle refers to our sources' folders by absolute path, and
// finds the packages left outside it in the checkout's node_modules; see build.js). An edit, a
// checkout, an `npm install` or a moved folder makes it stale, and bin/assay.js then runs the sources
// as before; checking costs one stat per source file (~1 ms). Edits inside node_modules itself are
// not seen: debug a dependency with ASSAY_BUNDLE=0.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
/** Where the bundle is built: inside node_modules, so `npm ci` starts from nothing. */
export const DEFAULT_BUNDLE_DIR = path.join(ROOT, "node_modules", ".cache", "assay-bundle");
export const MANIFEST = "manifest.json";
export const MANIFEST_VERSION = 2;

/**
 * The bundle's folder: ASSAY_BUNDLE_DIR when set (tests build their own), else the default. It must
 * lie inside the checkout: the bundle imports the packages it leaves outside from node_modules, which
 * Node finds by walking up from the bundle's own folder.
 * @param {NodeJS.ProcessEnv} env
 */
export function bundleDir(env = process.env) {
  return env.ASSAY_BUNDLE_DIR ? path.resolve(env.ASSAY_BUNDLE_DIR) : DEFAULT_BUNDLE_DIR;
}

/**
 * @param {string} dir
 * @param {string} root
 */
export function insideCheckout(dir, root = ROOT) {
  const rel = path.relative(realpathOfExisting(root), realpathOfExisting(dir));
  return rel !== "" && rel !== ".." && !rel.startsWith(`..${path.sep}`) && !path.isAbsolute(rel);
}

/**
 * The real path of `p`, or of its deepest existing parent with the rest appended: Node loads a
 * module by its real path, so a folder reached through a symbolic link is where its target is.
 * @param {string} p
 */
function realpathOfExisting(p) {
  const abs = path.resolve(p);
  try {
    return fs.realpathSync(abs);
  } catch {
    const parent = path.dirname(abs);
    return parent === abs ? abs : path.join(realpathOfExisting(parent), path.basename(abs));
  }
}

/** @typedef {[file: string, size: number, mtimeMs: number]} FileStamp */
/**
 * @typedef {{ version: number, root: string, builtAt: string, entry: string, outputs: string[],
 *   files: FileStamp[] }} Manifest
 */

/**
 * Size and modification time of a file (path relative to `root`), or null when it is missing.
 * @param {string} root
 * @param {string} file
 * @returns {FileStamp | null}
 */
export function stamp(root, file) {
  const st = fs.statSync(path.join(root, file), { throwIfNoEntry: false });
  return st ? [file, st.size, st.mtimeMs] : null;
}

/** A file recorded as missing when the bundle was built (its size and time are -1). */
export const ABSENT = -1;

/**
 * The manifest in `dir`, or a reason why there is none to use.
 * @param {string} dir
 * @returns {Manifest | string}
 */
export function readManifest(dir) {
  let manifest;
  try {
    manifest = JSON.parse(fs.readFileSync(path.join(dir, MANIFEST), "utf8"));
  } catch {
    return "no bundle";
  }
  const valid =
    manifest?.version === MANIFEST_VERSION &&
    typeof manifest.root === "string" &&
    typeof manifest.entry === "string" &&
    Array.isArray(manifest.outputs) &&
    Array.isArray(manifest.files) &&
    manifest.files.every(
      (/** @type {unknown} */ f) =>
        Array.isArray(f) && typeof f[0] === "string" && typeof f[1] === "number" && typeof f[2] === "number",
    );
  return valid ? manifest : "unknown manifest";
}

/**
 * The bundle in `dir` when it is current for the checkout at `root`, else why not. Never throws:
 * anything unexpected is a reason, and the sources run.
 * @param {string} dir
 * @param {string} root
 * @returns {Manifest | string}
 */
export function currentBundle(dir, root = ROOT) {
  if (!insideCheckout(dir, root)) return `${dir} is outside ${root}`;
  const manifest = readManifest(dir);
  if (typeof manifest === "string") return manifest;
  if (manifest.root !== root) return `built for ${manifest.root}`;
  try {
    for (const [file, size, mtimeMs] of manifest.files) {
      const now = stamp(root, file);
      if (!now) {
        if (size !== ABSENT) return `${file} is gone`;
      } else if (now[1] !== size || now[2] !== mtimeMs) return `${file} changed`;
    }
    // Every module of it, not only the entry: a missing chunk would fail a lazy import later, with no
    // way back to the sources.
    for (const out of [manifest.entry, ...manifest.outputs.filter((o) => o.endsWith(".js"))]) {
      if (!fs.existsSync(path.join(dir, out))) return `${out} is missing`;
    }
  } catch (err) {
    return `unreadable: ${err instanceof Error ? err.message : String(err)}`;
  }
  return manifest;
}

/**
 * Why the bundle in `dir` cannot be used for the checkout at `root`, or null when it is current.
 * @param {string} dir
 * @param {string} root
 * @returns {string | null}
 */
export function staleReason(dir, root = ROOT) {
  const bundle = currentBundle(dir, root);
  return typeof bundle === "string" ? bundle : null;
}

/**
 * The bundle's entry module when it is current and not turned off (ASSAY_BUNDLE=0), else undefined.
 * @param {NodeJS.ProcessEnv} env
 * @returns {string | undefined}
 */
export function bundleEntry(env = process.env) {
  if (env.ASSAY_BUNDLE === "0") return undefined;
  const dir = bundleDir(env);
  const bundle = currentBundle(dir);
  return typeof bundle === "string" ? undefined : path.join(dir, bundle.entry);
}
