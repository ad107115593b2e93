// A small real filesystem for tests of a full disk: a tmpfs mounted over a folder (root only, as in
// CI). Unmounted when the test process exits, whatever the tests did.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

/** Why a test that needs a tmpfs is skipped, or false when it can run. */
export const tmpfsSkip = process.getuid?.() === 0 ? false : "mounting a tmpfs needs root";

const mounted = new Set<string>();
process.once("exit", () => {
  for (const dir of mounted) {
    try {
      execFileSync("umount", ["-l", dir]);
    } catch {
      // Unmounted already.
    }
  }
});

export interface Tmpfs {
  readonly dir: string;
  /** Grows or shrinks it (`size` as mount takes it: `4m`); what it holds stays. */
  resize(size: string): void;
  /** Writes a file that takes all the room left (the disk is full after it); returns its path. */
  fill(name?: string): string;
  unmount(): void;
}

/** Mounts a tmpfs of `size` (and at most `inodes` files and folders) over `dir`, made if missing. */
export function mountTmpfs(dir: string, size: string, o: { inodes?: number } = {}): Tmpfs {
  fs.mkdirSync(dir, { recursive: true });
  const options = `size=${size},mode=0755${o.inodes === undefined ? "" : `,nr_inodes=${o.inodes}`}`;
  execFileSync("mount", ["-t", "tmpfs", "-o", options, "tmpfs", dir]);
  mounted.add(dir);
  return {
    dir,
    resize: (to) => execFileSync("mount", ["-o", `remount,size=${to}`, dir]),
    fill: (name = "filler") => {
      const file = path.join(dir, name);
      const fd = fs.openSync(file, "w");
      const chunk = Buffer.alloc(64 * 1024, 1);
      try {
        // A write that finds less room than the chunk writes what fits; the next one fails.
        for (;;) fs.writeSync(fd, chunk);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "ENOSPC") throw err;
      } finally {
        fs.closeSync(fd);
      }
      return file;
    },
    unmount: () => {
      execFileSync("umount", [dir]);
      mounted.delete(dir);
    },
  };
}
