// Races of a local store shared by several processes (the API and workers on one data directory, on
// one host or over NFS): in each test another real process works on the same directory as fast as it
// can, the way a worker does, while this one does what the API, retention or another worker does.
import assert from "node:assert/strict";
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { LocalStore } from "../../src/storage/local.ts";
import { scratchDir } from "../helpers/tmp.ts";

const LOCAL_TS = path.resolve("src/storage/local.ts");

interface Other {
  died: Promise<never>;
  child: ChildProcess;
  /** Keeps it has landed so far, as it last said (`process.send({ landed })`). */
  landed: number;
}

/**
 * Another process that runs `body` with `store` (a LocalStore on `root`), `scratch` and a `landed`
 * counter in scope; it says how many keeps it has landed every so often.
 */
async function otherProcess(root: string, body: string): Promise<Other> {
  const scratch = fs.mkdtempSync(path.join(root, "other-"));
  const file = path.join(scratch, "other.mts");
  fs.writeFileSync(
    file,
    `import fs from "node:fs";
    import path from "node:path";
    import { LocalStore, renameInto } from ${JSON.stringify(LOCAL_TS)};
    const store = new LocalStore(${JSON.stringify(root)});
    const scratch = ${JSON.stringify(scratch)};
    let landed = 0;
    setInterval(() => process.send?.({ landed }), 100);
    process.send?.("ready");
    ${body}`,
  );
  const child = spawn(process.execPath, ["--import", "tsx", file], {
    stdio: ["ignore", "ignore", "inherit", "ipc"],
  });
  // It must run throughout: its death fails the test rather than leave this process alone.
  const died = new Promise<never>((_, reject) =>
    child.once("exit", (code, sig) => reject(new Error(`the other process ended: ${code ?? sig}`))),
  );
  died.catch(() => {});
  await Promise.race([new Promise((resolve) => child.once("message", resolve)), died]);
  const other: Other = { died, child, landed: 0 };
  child.on("message", (m: { landed?: number }) => {
    if (typeof m.landed === "number") other.landed = m.landed;
  });
  return other;
}

/** A stale worker's life in `taskKey`: keeps an attempt (one rename), and discards it (its completion fenced off). */
const keepAndDiscard = (taskKey: string) => `
  for (let i = 0; ; i++) {
    const from = path.join(scratch, "o" + i);
    fs.mkdirSync(from);
    fs.writeFileSync(path.join(from, "out.json"), "{}");
    try {
      await renameInto(from, store.localPath(${JSON.stringify(taskKey)} + "/9." + i + ".y"));
      landed++;
    } catch {
      fs.rmSync(from, { recursive: true, force: true });
    }
    await store.deletePrefix(${JSON.stringify(taskKey)} + "/9." + i + ".y/").catch(() => {});
  }`;

/**
 * Runs `step` for `ms` (at most `max` times) while `other` lives, which must have landed keeps
 * meanwhile; returns how many times `step` ran.
 */
async function during(other: Other, ms: number, max: number, step: (i: number) => Promise<void>) {
  const until = Date.now() + ms;
  let i = 0;
  try {
    for (; i < max && Date.now() < until; i++) {
      if (other.child.exitCode !== null || other.child.signalCode !== null) await other.died;
      await step(i);
    }
    // A race needs both sides: the other process must have been keeping all along, not failing.
    assert.ok(other.landed > 0, "the other process landed no keep");
  } finally {
    other.child.kill("SIGKILL");
  }
  return i;
}

test("deleting a task's outputs while a stale attempt keeps into the task's folder: the delete does not fail ENOTEMPTY", async () => {
  // Retention removes a task's folder with one recursive rm, which reads the folder, removes what it
  // read and then the folder: a keep landing in between (an attempt of the task that lost its lease,
  // publishing late; its completion is then fenced off and it discards) failed the rm ENOTEMPTY, and
  // retention gave up on the task (its rows gone, its outputs left to the sweep a day later). Against
  // a process keeping and discarding as fast as it can, one delete in two failed.
  const root = scratchDir("store-races-");
  const store = new LocalStore(root);
  const taskKey = "outputs/900000001";
  const other = await otherProcess(root, keepAndDiscard(taskKey));
  const failures: string[] = [];
  const n = await during(other, 2500, 3000, async (i) => {
    const ours = [0, 1, 2].map((k) => store.localPath(`${taskKey}/${k}.${i}.z`));
    for (const dir of ours) {
      fs.mkdirSync(dir, { recursive: true });
      fs.writeFileSync(path.join(dir, "out.json"), "{}");
    }
    try {
      await store.deletePrefix(`${taskKey}/`);
      for (const dir of ours) assert.ok(!fs.existsSync(dir), `${dir} deleted`);
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      failures.push(`${e.code} ${e.syscall}`);
    }
  });
  assert.ok(n >= 100, `${n} deletes`);
  assert.deepEqual(failures, [], `${failures.length} of ${n} deletes failed`);
});

/**
 * A filesystem whose listings do not say an entry's type (d_type DT_UNKNOWN), as NFS over READDIR,
 * ext2/3/4 made without `filetype` and XFS without `ftype`: an ext2 image without `filetype` on a
 * loop device (root only).
 */
function untypedFilesystem(): string | { skip: string } {
  const dir = scratchDir("store-untyped-");
  const image = path.join(dir, "fs.img");
  const mnt = path.join(dir, "mnt");
  fs.mkdirSync(mnt);
  fs.writeFileSync(image, "");
  fs.truncateSync(image, 32 * 1024 * 1024);
  execFileSync("mke2fs", ["-q", "-F", "-t", "ext2", "-O", "^filetype", image]);
  try {
    execFileSync("mount", ["-o", "loop", image, mnt], { stdio: ["ignore", "ignore", "pipe"] });
  } catch (err) {
    // A container without loop devices (or without the right to mount): nothing to test on here.
    return {
      skip: `cannot mount a loop device here: ${String((err as { stderr?: Buffer }).stderr ?? err).trim()}`,
    };
  }
  // Before the scratch folder's own removal at exit (its listener came first).
  process.prependOnceListener("exit", () => {
    try {
      execFileSync("umount", ["-l", mnt]);
    } catch {
      // Unmounted already.
    }
  });
  return mnt;
}

const untypedSkip =
  process.getuid?.() !== 0
    ? "mounting a filesystem needs root"
    : !["/sbin/mke2fs", "/usr/sbin/mke2fs"].some((f) => fs.existsSync(f))
      ? "mke2fs is not installed"
      : false;

test("listing a task's outputs on a filesystem that does not type its entries, while another worker discards attempts there: every kept output is listed", {
  skip: untypedSkip,
}, async (t) => {
  // Node reads such a folder and then looks at each entry (lstat); one gone by then (an attempt
  // discarded, a folder pruned) failed the whole read ENOENT, which the listing took for the task's
  // folder missing: a download's zip, a count or the store sweep saw none of the task's outputs (one
  // listing in three, or more, against a process keeping and discarding attempts as fast as it can).
  const mounted = untypedFilesystem();
  if (typeof mounted !== "string") return void t.skip(mounted.skip);
  const root = path.join(mounted, "data");
  const store = new LocalStore(root);
  const taskKey = "outputs/900000002";
  const kept: string[] = [];
  for (let run = 1; run <= 20; run++) {
    const dir = store.localPath(`${taskKey}/${run}.1.x`);
    fs.mkdirSync(dir, { recursive: true });
    for (const name of ["out.json", "report.csv"]) {
      fs.writeFileSync(path.join(dir, name), "{}");
      kept.push(`${taskKey}/${run}.1.x/${name}`);
    }
  }
  kept.sort();
  const ours = (key: string) => !key.includes(".y/"); // not the other process's attempts
  const other = await otherProcess(root, keepAndDiscard(taskKey));
  const short: number[] = [];
  const n = await during(other, 2500, 3000, async (i) => {
    // A whole listing, and one paged through as a zip does (7 keys a page).
    const whole = (await store.list(`${taskKey}/`)).map((o) => o.key).filter(ours);
    const paged: string[] = [];
    for (let after: string | undefined; ; ) {
      const page = await store.list(`${taskKey}/`, { limit: 7, ...(after === undefined ? {} : { after }) });
      paged.push(...page.map((o) => o.key).filter(ours));
      if (page.length < 7) break;
      after = page.at(-1)?.key;
    }
    if (whole.length !== kept.length || paged.length !== kept.length) short.push(i);
    else {
      assert.deepEqual(whole, kept);
      assert.deepEqual(paged, kept);
    }
  });
  assert.ok(n >= 40, `${n} listings`);
  assert.deepEqual(short.length, 0, `${short.length} of ${n} listings left kept outputs out`);
});
