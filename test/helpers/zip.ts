// Reading a zip the way an unrelated tool would: Python's zipfile (python3 is on every test machine),
// which also checks every entry's CRC.
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

/** The entry names of a zip, after zipfile's integrity check; throws if the zip is broken. */
export function zipNames(zip: Buffer): string[] {
  const file = path.join(os.tmpdir(), `assay-zip-${randomBytes(6).toString("hex")}.zip`);
  fs.writeFileSync(file, zip);
  try {
    return JSON.parse(
      execFileSync("python3", [
        "-c",
        "import json,sys,zipfile; z=zipfile.ZipFile(sys.argv[1]); bad=z.testzip(); assert bad is None, bad; print(json.dumps(z.namelist()))",
        file,
      ]).toString(),
    ) as string[];
  } finally {
    fs.rmSync(file, { force: true });
  }
}
