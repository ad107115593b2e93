// The production bundle (bin/build.js writes it; bin/assay.js runs it when it is current).
//
// `assay api` spent ~300 ms of its start resolving and evaluating ~1,000 modules (TypeBox's 373,
// Ajv's, yaml's for the OpenAPI document, OpenTelemetry's for prom-client, ...). The bundle is our
// sources and most of their dependencies in a few files, built by `npm ci` (the `prepare` script)
// and by `make dev` / `make test`, into node_modules/.cache: nothing to build by hand, and nothing to
// commit.
//
// It is used only while it is current: its manifest names every one of our source files it was
// built from with their size and modification time, npm's record of node_modules, and the folder
// the checkout is in (a bundle refers to our sources' folders by absolute path; see build.js). An
// edit, a checkout, an `npm install` or a moved folder makes it stale, and bin/assay.js then runs
// the sources as before; checking costs one stat per source file (~1 ms).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
/** Where the bundle is built: inside node_modules, so `npm ci` starts from nothing. */
export const DEFAULT_BUNDLE_DIR = path.join(ROOT, "node_modules", ".cache", "assay-bundle");
export const MANIFEST = "manifest.json";
export const ENTRY = "cli.js";
const MANIFEST_VERSION = 1;

/**
 * The bundle's folder: ASSAY_BUNDLE_DIR when set (tests build one of their own), else the default.
 * @param {NodeJS.ProcessEnv} env
 */
export function bundleDir(env = process.env) {
  return env.ASSAY_BUNDLE_DIR ? path.resolve(env.ASSAY_BUNDLE_DIR) : DEFAULT_BUNDLE_DIR;
}

/**
 * Size and modification time of each file (paths relative to `root`); null for a missing one.
 * @param {string} root
 * @param {string[]} files
 * @returns {[string, number, number][] | null}
 */
export function fingerprint(root, files) {
  /** @type {[string, number, number][]} */
  const out = [];
  for (const file of files) {
    const st = fs.statSync(path.join(root, file), { throwIfNoEntry: false });
    if (!st) return null;
    out.push([file, st.size, st.mtimeMs]);
  }
  return out;
}

/**
 * The manifest a bundle built now from these inputs records.
 * @param {string} root
 * @param {string[]} inputs
 */
export function manifestFor(root, inputs) {
  const files = fingerprint(root, inputs);
  if (!files) throw new Error("a bundle input disappeared while it was being built");
  return { version: MANIFEST_VERSION, root, builtAt: new Date().toISOString(), files };
}

/**
 * Why the bundle in `dir` cannot be used for the checkout at `root`, or null when it is current.
 * @param {string} dir
 * @param {string} root
 * @returns {string | null}
 */
export function staleReason(dir, root = ROOT) {
  let manifest;
  try {
    manifest = JSON.parse(fs.readFileSync(path.join(dir, MANIFEST), "utf8"));
  } catch {
    return "no bundle";
  }
  if (manifest?.version !== MANIFEST_VERSION || !Array.isArray(manifest.files)) return "unknown manifest";
  if (manifest.root !== root) return `built for ${manifest.root}`;
  for (const entry of manifest.files) {
    const [file, size, mtimeMs] = entry;
    const st = fs.statSync(path.join(root, file), { throwIfNoEntry: false });
    if (!st) return `${file} is gone`;
    if (st.size !== size || st.mtimeMs !== mtimeMs) return `${file} changed`;
  }
  return null;
}

/**
 * The bundle's entry module when it is current and not turned off (ASSAY_BUNDLE=0), else undefined.
 * @param {NodeJS.ProcessEnv} env
 * @returns {string | undefined}
 */
export function bundleEntry(env = process.env) {
  if (env.ASSAY_BUNDLE === "0") return undefined;
  const dir = bundleDir(env);
  return staleReason(dir) === null ? path.join(dir, ENTRY) : undefined;
}
