// Preloaded with `node --import` by a test: appends the URL of every module the process resolves to
// the file in $ASSAY_TRACE_IMPORTS, so the test can tell what a command loaded.
import fs from "node:fs";
import { registerHooks } from "node:module";

const out = process.env.ASSAY_TRACE_IMPORTS;
if (out) {
  registerHooks({
    resolve(specifier, context, nextResolve) {
      const resolved = nextResolve(specifier, context);
      fs.appendFileSync(out, `${resolved.url}\n`);
      return resolved;
    },
  });
}
