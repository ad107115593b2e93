// The three production programs writing their outputs onto a full disk (a real tmpfs, filled): each
// says so with exit 4 (a dependency of the program failed: retried) and an error event that names the
// output and the system's reason, never a path. R's writeLines only warned, and r-report exited 0
// with its report cut short; summary and python-stats crashed with exit 1 (a failure for good). The
// worker names such a run ANALYSIS_STORAGE_FULL when its disk has no room left
// (runner-disk-full.test.ts); a disk quota, which statfs does not show, leaves it to the exit code.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { findPrograms, type Program } from "../../src/analyses/programs.ts";
import { childEnv } from "../../src/runner/handler.ts";
import { runProcess } from "../../src/runner/run-process.ts";
import { mountTmpfs, tmpfsSkip } from "../helpers/tmpfs.ts";

const work = fs.mkdtempSync(path.join(os.tmpdir(), "assay-programs-disk-full-"));
after(() => fs.rmSync(work, { recursive: true, force: true }));
const found = findPrograms({});
const program = (type: string) => found.available.find((p) => p.type === type);
const skipUnless = (type: string) =>
  tmpfsSkip ||
  (program(type) || process.env.CI === "true" ? false : `${type} is not available on this machine`);

// 300 numeric columns: every program's output is tens of KB, more than the 8 KB left on the disk.
const input = path.join(work, "données «brutes».csv");
const names = Array.from({ length: 300 }, (_, c) => `mesure_${c}`);
fs.writeFileSync(
  input,
  `${names.join(",")}\n${Array.from({ length: 200 }, (_, i) => names.map((_, c) => (i * (c + 7)) % 101).join(",")).join("\n")}\n`,
);

for (const [type, output, params] of [
  ["summary", "summary.json", {}],
  ["python-stats", "stats.json", { method: "mean" }],
  ["r-report", "report.html", {}],
] as const) {
  test(`${type}: an output that does not fit on the disk → exit 4 naming it, not a success or a crash`, {
    skip: skipUnless(type),
  }, async () => {
    // Its output folder on a full disk; its home and temporary folder (R's PNG) where there is room.
    const disk = mountTmpfs(path.join(work, `out-${type}`), "256k");
    try {
      // Full, then 8 KB freed: a program's first writes fit and the rest do not (R's writeLines then
      // only warns, and exited 0 with the report cut at what fitted).
      const filler = disk.fill();
      fs.truncateSync(filler, fs.statSync(filler).size - 8 * 1024);
      const p = program(type) as Program;
      const r = await runProcess(
        {
          executable: p.executable,
          args: [p.script, "--input", input, "--output-dir", disk.dir, "--params", JSON.stringify(params)],
          cwd: p.cwd,
          env: childEnv(work),
        },
        new AbortController().signal,
        { killGraceMs: 1000, timeoutMs: 120_000 },
      );
      assert.equal(r.exitCode, 4, r.stderrTail);
      assert.equal(r.result, undefined, "no result event");
      const message = r.reportedError ?? "";
      assert.match(message, new RegExp(`^could not write ${output.replace(".", "\\.")}: `), message);
      assert.match(message, /no space left on device/i, message);
      assert.ok(!message.includes(disk.dir) && !message.includes(work), `a path in ${message}`);
    } finally {
      disk.unmount();
    }
  });
}

/** strace, to make an output's open fail as a disk quota does (EDQUOT), or undefined. */
const strace = ["/usr/bin/strace", "/bin/strace"].find((p) => fs.existsSync(p));

for (const [type, output, params] of [
  ["summary", "summary.json", {}],
  ["python-stats", "stats.json", { method: "mean" }],
  ["r-report", "report.html", {}],
] as const) {
  test(`${type}: an output refused by a disk quota (EDQUOT) → exit 4 saying so`, {
    skip: skipUnless(type) || (strace ? false : "strace is not installed"),
  }, async () => {
    const p = program(type) as Program;
    const out = fs.mkdtempSync(path.join(work, "quota-"));
    // Only the open of that one file fails (-P), as it does for a user over their quota.
    const r = await runProcess(
      {
        executable: strace as string,
        args: [
          ...["-f", "-qq", "-o", "/dev/null", "-P", path.join(out, output)],
          ...["-e", "trace=openat,open,creat", "-e", "inject=openat,open,creat:error=EDQUOT"],
          ...[
            p.executable,
            p.script,
            "--input",
            input,
            "--output-dir",
            out,
            "--params",
            JSON.stringify(params),
          ],
        ],
        cwd: p.cwd,
        env: childEnv(work),
      },
      new AbortController().signal,
      { killGraceMs: 1000, timeoutMs: 120_000 },
    );
    assert.equal(r.exitCode, 4, r.stderrTail);
    assert.match(
      r.reportedError ?? "",
      new RegExp(`^could not write ${output.replace(".", "\\.")}: disk quota exceeded$`, "i"),
    );
  });
}
