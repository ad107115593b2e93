#!/usr/bin/env node
// Entry for `npx assay` right after `npm ci`, which also builds the bundle that this runs when it is
// current (bundle.js). Without one — a checkout whose sources changed since — the sources run: Node
// ≥ 22.18 (the project's runtime is Node 24, installed by npm as the `node` package, so `npx` finds
// it first on PATH) strips the TypeScript types itself; older Node runs them through tsx's loader,
// which costs about a second of start-up.
import module from "node:module";
import { pathToFileURL } from "node:url";
import { bundleEntry } from "./bundle.js";
import { holdEarlySignals } from "./early-signals.js";
import { execWithServerFlags } from "./node-flags.js";

// `assay api | worker | all` run with Node flags that bound their memory (see node-flags.js): the
// process re-executes itself with them, same pid, before loading anything else.
execWithServerFlags();
// A stop signal while the modules load is held for the server's own handlers (early-signals.js).
if (["api", "worker", "all"].includes(process.argv[2] ?? "")) holdEarlySignals();

// Node's on-disk compile cache keeps each module's compiled code and, for a .ts file, its stripped
// source (keyed by content, in $NODE_COMPILE_CACHE or the temporary directory;
// NODE_DISABLE_COMPILE_CACHE=1 turns it off). Turned on here, before the first .ts file is imported:
// when every module comes from the cache, Node never loads its TypeScript stripper (amaro, ~50 ms
// and ~18 MiB): `assay --help` 0.08 s / 67 MiB → 0.03 s / 48 MiB. (Node 22.1+.)
module.enableCompileCache?.();
// The bundle (bundle.js) when it is current: ~1,000 modules in a few files, and no TypeScript to strip
// on any Node. Otherwise the sources.
const bundled = bundleEntry();
if (bundled) {
  await import(pathToFileURL(bundled).href);
} else {
  if (!process.features.typescript) {
    const { register } = await import("tsx/esm/api");
    register();
  }
  await import("../src/cli.ts");
}
