// Scratch folders that go when the test process exits, whatever the tests did (each test file runs in
// a process of its own): a folder made with mkdtemp and left there built up by tens in the system's
// temporary directory, one per run of the file.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const made: string[] = [];
process.once("exit", () => {
  for (const dir of made) fs.rmSync(dir, { recursive: true, force: true });
});

/** A new folder under the system's temporary directory, removed when this process exits. */
export function scratchDir(prefix: string): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  made.push(dir);
  return dir;
}
