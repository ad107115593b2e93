#!/usr/bin/env node
// Entry for `npx assay` right after `npm ci`: there is no build step between a checkout and a
// working CLI. Node ≥ 22.18 (the project's runtime is Node 24, installed by npm as the `node`
// package, so `npx` finds it first on PATH) strips the TypeScript types itself; older Node runs the
// sources through tsx's loader, which costs about a second of start-up.
if (!process.features.typescript) {
  const { register } = await import("tsx/esm/api");
  register();
}
await import("../src/cli.ts");
