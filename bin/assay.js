#!/usr/bin/env node
// Entry for `npx assay` right after `npm ci`: the TypeScript sources run through tsx's loader,
// so there is no build step between a checkout and a working CLI.
import { register } from "tsx/esm/api";

register();
await import("../src/cli.ts");
