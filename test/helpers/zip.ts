// Reading a zip the way an unrelated tool would: Python's zipfile (python3 is on every test machine),
// which also checks every entry's CRC.
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

/** Runs a Python snippet with the zip's path as argv[1] (and `args` after it); returns its stdout. */
function withZip(zip: Buffer, script: string, args: string[] = []): Buffer {
  const file = path.join(os.tmpdir(), `assay-zip-${randomBytes(6).toString("hex")}.zip`);
  fs.writeFileSync(file, zip);
  try {
    return execFileSync("python3", ["-c", script, file, ...args]);
  } finally {
    fs.rmSync(file, { force: true });
  }
}

/** The entry names of a zip, after zipfile's integrity check; throws if the zip is broken. */
export function zipNames(zip: Buffer): string[] {
  return JSON.parse(
    withZip(
      zip,
      "import json,sys,zipfile; z=zipfile.ZipFile(sys.argv[1]); bad=z.testzip(); assert bad is None, bad; print(json.dumps(z.namelist()))",
    ).toString(),
  ) as string[];
}

/** One entry's bytes. */
export function zipRead(zip: Buffer, name: string): Buffer {
  return withZip(
    zip,
    "import sys,zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))",
    [name],
  );
}
