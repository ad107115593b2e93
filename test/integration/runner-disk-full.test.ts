// A worker whose disk fills up — its scratch space and the local store under one data directory, a
// real tmpfs mounted over it (root only, as in CI). A run that meets the full disk is the disk's
// failure, not the program's: retried, and ANALYSIS_STORAGE_FULL once its attempts are used up; nothing
// of it is published, no scratch folder is left, and the worker runs the next task once there is room.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { findPrograms } from "../../src/analyses/programs.ts";
import { idsCrossPowerOfTen, waitForTerminal } from "../helpers/queue.ts";
import {
  fixtureProgram,
  outputTree,
  type RunnerEnv,
  runnerEnv,
  strayOutputs,
  writeProgram,
} from "../helpers/runner.ts";
import { scratchDir } from "../helpers/tmp.ts";
import { mountTmpfs, type Tmpfs, tmpfsSkip } from "../helpers/tmpfs.ts";

let env: RunnerEnv;
let disk: Tmpfs;
let input: string;
const scripts = scratchDir("assay-disk-full-");

before(async () => {
  if (tmpfsSkip) return;
  env = await runnerEnv();
  // Ids past a digit boundary: the attempt folders and output keys are made of them.
  await idsCrossPowerOfTen(env.db.sql, "tasks", 1);
  await idsCrossPowerOfTen(env.db.sql, "runs", 1);
  disk = mountTmpfs(env.dataDir, "4m", { inodes: 400 });
  fs.mkdirSync(path.join(env.dataDir, "work"));
  input = await env.file("ünïcode «name»,b\n1,2\n3,4\n");
});
after(async () => {
  if (tmpfsSkip) return;
  disk?.unmount();
  await env.close();
});

let typeSeq = 0;

/** Runs one task of a fresh type with `prog` through a worker; returns its run row and the worker. */
async function runOne(prog: { script: string; cwd: string }, maxAttempts: number) {
  const type = `disk-${++typeSeq}`;
  const w = env.worker([{ ...fixtureProgram(type), ...prog }], { concurrency: 1 });
  const taskId = await env.task(type, [input], {}, maxAttempts);
  await w.start();
  try {
    await waitForTerminal(env.db.sql, taskId, 30_000);
  } finally {
    await w.stop();
  }
  const [run] = await env.db.sql<
    { status: string; error_code: string | null; error_message: string | null; attempt: number }[]
  >`select status, error_code, error_message, attempt from runs where task_id = ${taskId}`;
  assert.ok(run);
  return { run, taskId, type };
}

/** What attempts left in the worker's scratch folder. */
const scratchLeft = () => fs.readdirSync(path.join(env.dataDir, "work"));

/** Takes every free inode of the disk but `free` (empty files in a folder of their own); returns the undo. */
function leaveInodes(free: number): () => void {
  const dir = path.join(env.dataDir, "inode-filler");
  fs.mkdirSync(dir);
  const made: string[] = [];
  try {
    for (;;) {
      const file = path.join(dir, String(made.length));
      fs.writeFileSync(file, "");
      made.push(file);
    }
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOSPC") throw err;
  }
  for (const file of made.splice(-free)) fs.rmSync(file);
  return () => fs.rmSync(dir, { recursive: true });
}

const fullDiskFailure = (run: {
  status: string;
  error_code: string | null;
  error_message: string | null;
  attempt: number;
}) => {
  assert.equal(run.status, "failed");
  assert.equal(run.error_code, "ANALYSIS_STORAGE_FULL", run.error_message ?? "");
  assert.equal(run.error_message, "the worker ran out of disk space");
  assert.equal(run.attempt, 2, "retried: the disk's failure is not the run's");
};

describe("a full scratch disk", { skip: tmpfsSkip }, () => {
  test("a program that exits 0 after its write was refused (R's writeLines does) → retried, ANALYSIS_STORAGE_FULL, its cut-short output never published; the next task runs once there is room", async () => {
    // What r-report does on a full disk: writeLines warns "Problem closing connection: No space left
    // on device", and the script exits 0 with the part of report.html that fitted.
    const prog = writeProgram(
      scripts,
      "ignores-enospc",
      `try {
        fs.writeFileSync(path.join(out, "report.html"), "<p>".repeat(300_000));
      } catch {}
      say({ type: "result", outputFileName: "report.html", metrics: {} });`,
    );
    const filler = disk.fill();
    const { run, taskId } = await runOne(prog, 2);
    fullDiskFailure(run);
    assert.deepEqual(outputTree(path.join(env.outputsRoot, taskId)), [], "nothing published");
    assert.deepEqual(await strayOutputs(env), []);
    assert.deepEqual(scratchLeft(), []);

    fs.rmSync(filler);
    const next = await runOne(prog, 2);
    assert.equal(next.run.status, "succeeded", next.run.error_message ?? "");
    assert.equal(next.run.attempt, 1);
  });

  test("the summary program, whose write fails on the full disk (exit 1) → retried, ANALYSIS_STORAGE_FULL, not a failure of its own", async () => {
    const summary = findPrograms({}).available.find((p) => p.type === "summary");
    assert.ok(summary);
    const filler = disk.fill();
    try {
      const { run } = await runOne({ script: summary.script, cwd: summary.cwd }, 2);
      fullDiskFailure(run);
      assert.deepEqual(scratchLeft(), []);
      assert.deepEqual(await strayOutputs(env), []);
    } finally {
      fs.rmSync(filler);
    }
  });

  test("no room for the attempt's folders (out after the attempt's own) → retried, ANALYSIS_STORAGE_FULL, no scratch folder left", async () => {
    const prog = writeProgram(
      scripts,
      "never-runs",
      `say({ type: "result", outputFileName: "r.json", metrics: {} });`,
    );
    // The attempt's folder is made, its `out` is refused.
    const undo = leaveInodes(1);
    try {
      const { run } = await runOne(prog, 2);
      fullDiskFailure(run);
      assert.deepEqual(scratchLeft(), [], "the attempt's folder is removed");
    } finally {
      undo();
    }
  });

  test("no room to publish the outputs into the store (the task's folder) → retried, ANALYSIS_STORAGE_FULL, not ANALYSIS_OUTPUT_INVALID; nothing left", async () => {
    const prog = writeProgram(
      scripts,
      "writes-one",
      `fs.writeFileSync(path.join(out, "r.json"), "{}");
      say({ type: "result", outputFileName: "r.json", metrics: {} });`,
    );
    // The attempt's folder, out, home and r.json fit; the task's folder under outputs/ does not.
    const undo = leaveInodes(4);
    try {
      const { run, taskId } = await runOne(prog, 2);
      fullDiskFailure(run);
      assert.equal(fs.existsSync(path.join(env.outputsRoot, taskId)), false);
      assert.deepEqual(await strayOutputs(env), []);
      assert.deepEqual(scratchLeft(), []);
    } finally {
      undo();
    }
  });
});

describe("a disk quota, which statfs does not show", { skip: tmpfsSkip }, () => {
  test("a program that says an output could not be written for want of room (exit 4, as the three programs do) → ANALYSIS_STORAGE_FULL, though the disk shows room", async () => {
    for (const reason of ["disk quota exceeded", "No space left on device"]) {
      const prog = writeProgram(
        scripts,
        "over-quota",
        `say({ type: "error", message: ${JSON.stringify(`could not write r.json: ${reason}`)} });
        process.exit(4);`,
      );
      const { run } = await runOne(prog, 2);
      fullDiskFailure(run);
      assert.deepEqual(scratchLeft(), []);
    }
    // Any other dependency's failure stays the program's word (ANALYSIS_DEPENDENCY_FAILED).
    const other = writeProgram(
      scripts,
      "dependency",
      `say({ type: "error", message: "the license server did not answer" });
      process.exit(4);`,
    );
    const { run } = await runOne(other, 2);
    assert.equal(run.error_code, "ANALYSIS_DEPENDENCY_FAILED", run.error_message ?? "");
  });
});

describe("a full scratch disk with an S3 store", { skip: tmpfsSkip }, () => {
  test("the input's fetch into the scratch folder fails → retried, ANALYSIS_STORAGE_FULL, the partial input removed", async () => {
    const { createTestBucket } = await import("../helpers/s3.ts");
    const bucket = await createTestBucket();
    const s3 = await runnerEnv({ store: bucket.store("full/"), configEnv: bucket.env });
    const scratch = mountTmpfs(s3.dataDir, "1m");
    try {
      fs.mkdirSync(path.join(s3.dataDir, "work"));
      const big = await s3.file(`n,ünïcode\n${"1,2\n".repeat(600_000)}`);
      scratch.fill();
      const prog = writeProgram(
        scripts,
        "never-starts",
        `say({ type: "result", outputFileName: "r.json", metrics: {} });`,
      );
      const w = s3.worker([{ ...fixtureProgram("fetch"), ...prog }], { concurrency: 1 });
      const taskId = await s3.task("fetch", [big], {}, 2);
      await w.start();
      await waitForTerminal(s3.db.sql, taskId, 30_000);
      await w.stop();
      const [run] = await s3.db.sql<
        { status: string; error_code: string | null; error_message: string | null; attempt: number }[]
      >`select status, error_code, error_message, attempt from runs where task_id = ${taskId}`;
      assert.ok(run);
      fullDiskFailure(run);
      assert.deepEqual(fs.readdirSync(path.join(s3.dataDir, "work")), []);
    } finally {
      scratch.unmount();
      await s3.close();
      await bucket.drop();
    }
  });
});
