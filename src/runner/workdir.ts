// A worker's scratch folder, `$ASSAY_DATA_DIR/work/<pid>.<random>/` (mode 0700): with a remote store each
// attempt fetches its input and writes its outputs in a folder of its own here. Folders of workers
// that are gone (a SIGKILL leaves its folder) are removed when the next worker on the machine starts.
import { randomBytes } from "node:crypto";
import fsp from "node:fs/promises";
import path from "node:path";
import { isAlive } from "../proc.ts";

export interface WorkDir {
  readonly dir: string;
  /** Removes the folder and whatever is left in it. */
  close(): Promise<void>;
}

export async function openWorkDir(dataDir: string): Promise<WorkDir> {
  const root = path.join(dataDir, "work");
  await fsp.mkdir(root, { recursive: true, mode: 0o700 });
  for (const name of await fsp.readdir(root)) {
    const pid = Number(/^(\d+)\./.exec(name)?.[1]);
    if (Number.isInteger(pid) && pid !== process.pid && !isAlive(pid)) {
      await fsp.rm(path.join(root, name), { recursive: true, force: true });
    }
  }
  const dir = path.join(root, `${process.pid}.${randomBytes(4).toString("hex")}`);
  await fsp.mkdir(dir, { mode: 0o700 });
  return { dir, close: () => fsp.rm(dir, { recursive: true, force: true }) };
}
