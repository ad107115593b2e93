// Scratch folders of workers: a folder is judged by its pid only on its own machine and pid namespace;
// anyone else's folder (another container or host on a shared data directory) only by its age.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import {
  machineTag,
  openWorkDir,
  removeAttemptDir,
  removeFailedAttemptDirs,
  sweepWorkDirs,
  WORKDIR_ABANDONED_MS,
} from "../../src/runner/workdir.ts";
import { waitFor } from "../helpers/queue.ts";

/** A pid that no process has: a child that has exited and been reaped. */
async function deadPid(): Promise<number> {
  const child = spawn(process.execPath, ["-e", ""], { stdio: "ignore" });
  await new Promise((resolve) => child.once("close", resolve));
  return child.pid as number;
}

function folder(root: string, name: string, ageMs = 0): string {
  const dir = path.join(root, name);
  fs.mkdirSync(path.join(dir, "7.1.tok"), { recursive: true });
  fs.writeFileSync(path.join(dir, "7.1.tok", "input.csv"), "a,b\n1,2\n");
  const t = new Date(Date.now() - ageMs);
  fs.utimesSync(dir, t, t);
  return dir;
}

test("leftovers: own machine by pid, other machines by age; a live worker's folder stays", async () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-work-"));
  try {
    const tag = machineTag();
    const other = tag === "0123456789ab" ? "ba9876543210" : "0123456789ab";
    const dead = await deadPid();
    const live = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], { stdio: "ignore" });
    try {
      const ownDead = folder(root, `${tag}.${dead}.aa11`);
      const ownLive = folder(root, `${tag}.${live.pid}.bb22`, 2 * WORKDIR_ABANDONED_MS);
      // The review's case: another container on the same volume, whose pid means nothing here.
      const otherFresh = folder(root, `${other}.${dead}.cc33`);
      const otherStale = folder(root, `${other}.${live.pid}.dd44`, WORKDIR_ABANDONED_MS + 60_000);
      const oldFormatFresh = folder(root, `${dead}.ee55`);
      const oldFormatStale = folder(root, `${dead}.ff66`, WORKDIR_ABANDONED_MS + 60_000);

      assert.equal(await sweepWorkDirs(root, tag), 3);
      assert.equal(fs.existsSync(ownDead), false, "own machine, pid gone: removed");
      assert.equal(fs.existsSync(ownLive), true, "own machine, pid alive: kept however old");
      assert.equal(fs.existsSync(otherFresh), true, "another machine's fresh folder is not judged by pid");
      assert.equal(
        fs.existsSync(otherStale),
        false,
        "another machine's folder untouched for an hour: removed",
      );
      assert.equal(fs.existsSync(oldFormatFresh), true);
      assert.equal(fs.existsSync(oldFormatStale), false);
    } finally {
      live.kill("SIGKILL");
    }
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
});

test("a worker's folder is touched while it lives, swept by nobody, and removed on close", async () => {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-work-"));
  try {
    const work = await openWorkDir(dataDir, { touchMs: 20 });
    assert.match(path.basename(work.dir), new RegExp(`^${machineTag()}\\.${process.pid}\\.[0-9a-f]+$`));
    const old = new Date(Date.now() - 2 * WORKDIR_ABANDONED_MS);
    fs.utimesSync(work.dir, old, old);
    await waitFor(
      async () => Date.now() - fs.statSync(work.dir).mtimeMs < 60_000,
      5_000,
      "the live folder to be touched",
    );
    // Seen from another machine (another tag), the folder is fresh: nobody removes it.
    assert.equal(await sweepWorkDirs(path.dirname(work.dir), "ffffffffffff"), 0);
    assert.equal(await sweepWorkDirs(path.dirname(work.dir)), 0, "its own pid is alive");
    await work.close();
    assert.equal(fs.existsSync(work.dir), false);
  } finally {
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
});

/** A tree as a Go module cache leaves in a program's HOME: read-only folders with files in them. */
function readOnlyTree(root: string): void {
  const pkg = path.join(root, "home", "go", "pkg", "mod");
  fs.mkdirSync(pkg, { recursive: true });
  fs.writeFileSync(path.join(pkg, "module.go"), "package m\n");
  for (const d of [pkg, path.dirname(pkg)]) fs.chmodSync(d, 0o555);
}

test("removeTree removes what a program left read-only, as a worker that is not root", () => {
  // The worker's user owns the tree; root would pass every permission check, so the removal runs in a
  // child that loads the module as root and then becomes nobody.
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-rotree-"));
  fs.chmodSync(root, 0o777);
  const dir = path.join(root, "attempt");
  fs.mkdirSync(dir);
  readOnlyTree(dir);
  try {
    const nobody = 65534;
    const own = (p: string) => {
      fs.chownSync(p, nobody, nobody);
      if (fs.statSync(p).isDirectory()) for (const e of fs.readdirSync(p)) own(path.join(p, e));
    };
    own(dir);
    const module = new URL("../../src/runner/workdir.ts", import.meta.url).href;
    const script = `
      const { removeTree } = await import(${JSON.stringify(module)});
      process.setgid(${nobody});
      process.setuid(${nobody});
      await removeTree(${JSON.stringify(dir)});
      console.log("removed");`;
    const child = spawnSync(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
      encoding: "utf8",
    });
    assert.equal(child.status, 0, child.stderr);
    assert.equal(child.stdout.trim(), "removed");
    assert.equal(fs.existsSync(dir), false);
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
});

test("a leftover folder that cannot be removed is skipped; the sweep goes on and does not fail", async (t) => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-sweep-stuck-"));
  const tag = "ffffffffffff";
  const stuck = path.join(root, `${tag}.1.aaaa`);
  const gone = path.join(root, `${tag}.2.bbbb`);
  fs.mkdirSync(stuck);
  fs.mkdirSync(gone);
  // Even root cannot remove an immutable file: the sweep's removal of that folder fails.
  const pinned = path.join(stuck, "pinned");
  fs.writeFileSync(pinned, "x");
  const chattr = spawnSync("chattr", ["+i", pinned], { encoding: "utf8" });
  try {
    if (chattr.status !== 0) {
      // A filesystem without the immutable flag (overlayfs, tmpfs): nothing here can make rm fail as root.
      t.skip(`chattr +i is not supported here: ${chattr.stderr || chattr.error}`);
      return;
    }
    // Machine tag "ffffffffffff" is not this machine's: the folders are judged by age.
    const later = Date.now() + WORKDIR_ABANDONED_MS + 60_000;
    assert.equal(await sweepWorkDirs(root, machineTag(), later), 1);
    assert.equal(fs.existsSync(gone), false);
    assert.equal(fs.existsSync(stuck), true);
  } finally {
    spawnSync("chattr", ["-i", pinned]);
    fs.rmSync(root, { recursive: true, force: true });
  }
});

test("an attempt folder whose removal fails is removed later by the worker's folder timer, not left until it stops", async (t) => {
  if (process.getuid?.() !== 0) return t.skip("mounting over a folder needs root");
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-work-"));
  const work = await openWorkDir(root, { touchMs: 50 });
  const attempt = path.join(work.dir, "1000000007.2.0123abcd");
  const busy = path.join(attempt, "home", "busy");
  fs.mkdirSync(busy, { recursive: true });
  fs.writeFileSync(path.join(attempt, "input"), "a,b\n1,2\n");
  // A mount inside the folder: rm fails with EBUSY for every user, as it fails with EMFILE when the
  // worker is short of descriptors.
  spawnSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", busy], { stdio: "inherit" });
  let mounted = true;
  try {
    await assert.rejects(removeAttemptDir(attempt), { code: "EBUSY" });
    assert.ok(fs.existsSync(attempt), "the premise: the removal failed");
    spawnSync("umount", [busy]);
    mounted = false;
    await waitFor(async () => !fs.existsSync(attempt), 10_000, "the failed folder removed on a later touch");
  } finally {
    if (mounted) spawnSync("umount", ["-l", busy]);
    await work.close();
    fs.rmSync(root, { recursive: true, force: true });
  }
});

test("one pass of failed removals at a time: a pass stuck on a hung mount is not joined by another each touch", async () => {
  const first = removeFailedAttemptDirs();
  assert.equal(removeFailedAttemptDirs(), first, "a second call while one runs shares it");
  await first;
  assert.notEqual(removeFailedAttemptDirs(), first, "once it ended, a new pass");
});
