// `assay worker | api | all` when start-up fails: the process says why and exits non-zero by itself
// (a supervisor's restart must fire), instead of idling forever on what it had opened.
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import postgres from "postgres";
import { type CliResult, cleanEnv, collect, spawnCli } from "../helpers/cli.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";

/**
 * Well above a failed start's own time (a second or two) and below the 30 s after which cli.ts exits
 * a failed command whatever is still open: a process still running at this bound hangs.
 */
const EXIT_BOUND_MS = 20_000;

let home: string;
let db: TestDatabase;
before(async () => {
  home = fs.mkdtempSync(path.join(os.tmpdir(), "assay-startup-"));
  db = await createTestDatabase();
});
after(async () => {
  await db.drop();
  fs.rmSync(home, { recursive: true, force: true });
});

/** The process's exit, or a failure (and SIGKILL) when it is still running after EXIT_BOUND_MS. */
async function exitWithin(child: ChildProcess, what: string): Promise<CliResult> {
  const done = collect(child);
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<"hung">((resolve) => {
    timer = setTimeout(() => resolve("hung"), EXIT_BOUND_MS);
  });
  const result = await Promise.race([done, bound]);
  clearTimeout(timer);
  if (result === "hung") {
    child.kill("SIGKILL");
    const { stdout, stderr } = await done;
    assert.fail(`${what} still running ${EXIT_BOUND_MS} ms after start:\n${stdout.slice(-2000)}\n${stderr}`);
  }
  return result;
}

/** An empty database (no migrations applied), dropped after the test. */
async function unmigratedDatabase(): Promise<{ url: string; drop(): Promise<void> }> {
  const adminUrl = process.env.ASSAY_TEST_ADMIN_URL as string;
  const name = `assay_unmigrated_${randomBytes(5).toString("hex")}`;
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    await admin`create database ${admin(name)}`;
  } finally {
    await admin.end({ timeout: 5 });
  }
  const u = new URL(adminUrl);
  u.pathname = `/${name}`;
  return {
    url: u.toString(),
    drop: async () => {
      const a = postgres(adminUrl, { max: 1, onnotice: () => {} });
      try {
        await a`drop database if exists ${a(name)} with (force)`;
      } finally {
        await a.end({ timeout: 5 });
      }
    },
  };
}

test("assay worker and assay all against an unmigrated database exit 1, saying to migrate", async () => {
  const empty = await unmigratedDatabase();
  try {
    for (const mode of ["worker", "all"]) {
      const dataDir = fs.mkdtempSync(path.join(home, "unmigrated-"));
      const child = spawnCli(
        [mode],
        cleanEnv({ DATABASE_URL: empty.url, ASSAY_DATA_DIR: dataDir, PORT: "0", LOG_LEVEL: "info" }),
      );
      const exit = await exitWithin(child, `assay ${mode}`);
      assert.equal(exit.code, 1, `${mode}: ${exit.stderr}`);
      assert.match(exit.stderr, /not migrated.*assay migrate/, mode);
      assert.match(exit.stderr, /relation "\w+" does not exist \(SQLSTATE 42P01\)/, mode);
      // The worker's scratch folder went with it (the group guard was closed too, or it would not exit).
      assert.deepEqual(fs.readdirSync(path.join(dataDir, "work")), [], mode);
    }
  } finally {
    await empty.drop();
  }
});

test("ASSAY_DATA_DIR under a regular file: exits 1 at once, naming the folder, instead of waiting for it", async () => {
  const file = path.join(home, "a-file");
  fs.writeFileSync(file, "not a folder");
  const dataDir = path.join(file, "data");
  for (const mode of ["worker", "api"]) {
    const child = spawnCli(
      [mode],
      cleanEnv({ DATABASE_URL: db.url, ASSAY_DATA_DIR: dataDir, PORT: "0", LOG_LEVEL: "info" }),
    );
    const exit = await exitWithin(child, `assay ${mode}`);
    assert.equal(exit.code, 1, `${mode}: ${exit.stderr}`);
    assert.match(exit.stderr, /ASSAY_DATA_DIR cannot hold the stored files/, mode);
    assert.ok(exit.stderr.includes(`ENOTDIR: not a directory, mkdir '${dataDir}'`), exit.stderr);
    assert.doesNotMatch(exit.stdout, /object store unreachable; waiting/, mode);
  }
});
