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

/** The folders in `dir`, sorted, each with its own entries sorted. */
const tree = (dir: string) =>
  fs
    .readdirSync(dir)
    .sort()
    .map((name) => ({
      name,
      entries: fs.statSync(path.join(dir, name)).isDirectory()
        ? fs.readdirSync(path.join(dir, name)).sort()
        : null,
    }));

test("spares: a take renames a spare made ahead (empty out/ and home/) to the attempt's name; with none ready it says so and refills", async () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-spares-"));
  const work = await openWorkDir(root);
  try {
    const attempt = (n: number) => path.join(work.dir, `${1_000 + n}.1.tok`);
    // None made yet: the attempt makes its own folders; the take starts the refill.
    assert.equal(work.spares.take(attempt(1)), false);
    assert.equal(fs.existsSync(attempt(1)), false, "nothing made under the attempt's name");
    await work.spares.filled();
    assert.equal(work.spares.size, 2);
    assert.deepEqual(tree(work.dir), [
      { name: "spare.1", entries: ["home", "out"] },
      { name: "spare.2", entries: ["home", "out"] },
    ]);
    // Two takes at once (two slots freed together) get one each; the third makes its own.
    assert.equal(work.spares.take(attempt(2)), true);
    assert.equal(work.spares.take(attempt(3)), true);
    assert.equal(work.spares.take(attempt(4)), false);
    for (const n of [2, 3]) assert.deepEqual(fs.readdirSync(attempt(n)).sort(), ["home", "out"]);
    for (const n of [2, 3])
      for (const sub of ["home", "out"])
        assert.deepEqual(fs.readdirSync(path.join(attempt(n), sub)), [], "empty");
    await work.spares.filled();
    assert.deepEqual(
      tree(work.dir).map((e) => e.name),
      ["1002.1.tok", "1003.1.tok", "spare.3", "spare.4"],
    );
  } finally {
    await work.close();
  }
  assert.deepEqual(fs.readdirSync(path.join(root, "work")), [], "the spares go with the worker's folder");
  fs.rmSync(root, { recursive: true, force: true });
});

test("spares: one removed by hand is skipped; a refill that cannot make any fails quietly, and takes say none is ready", async () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-spares-"));
  const work = await openWorkDir(root);
  try {
    work.spares.take(path.join(work.dir, "unused"));
    await work.spares.filled();
    fs.rmSync(path.join(work.dir, "spare.2"), { recursive: true });
    // The newest (spare.2) is gone: the take goes on to spare.1.
    const target = path.join(work.dir, "1000.1.tok");
    assert.equal(work.spares.take(target), true);
    assert.deepEqual(fs.readdirSync(target).sort(), ["home", "out"]);
    await work.spares.filled();
    // The spares taken, then the worker's folder gone (a cleaner of old files): none can be made.
    for (const spare of fs.readdirSync(work.dir).filter((n) => n.startsWith("spare.")))
      assert.equal(work.spares.take(path.join(work.dir, `taken-${spare}`)), true);
    fs.renameSync(work.dir, `${work.dir}.away`);
    try {
      assert.equal(work.spares.take(path.join(work.dir, "1001.1.tok")), false);
      await work.spares.filled();
      assert.equal(work.spares.size, 0);
      assert.equal(fs.existsSync(work.dir), false, "no folder made in the missing one's place");
    } finally {
      fs.renameSync(`${work.dir}.away`, work.dir);
    }
  } finally {
    await work.close();
  }
  assert.deepEqual(fs.readdirSync(path.join(root, "work")), []);
  fs.rmSync(root, { recursive: true, force: true });
});

test("spares: closing the worker's folder while a refill runs leaves nothing behind", async () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-spares-"));
  for (let i = 0; i < 20; i++) {
    const work = await openWorkDir(root);
    work.spares.take(path.join(work.dir, "unused"));
    await work.close();
    assert.deepEqual(fs.readdirSync(path.join(root, "work")), [], `round ${i}`);
  }
  fs.rmSync(root, { recursive: true, force: true });
});
