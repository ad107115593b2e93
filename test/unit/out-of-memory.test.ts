// How a program that ran out of its memory limit (ASSAY_CHILD_MEMORY_MB) is reported: each runtime's
// own words on stderr, under a limit, make the run's error "the program ran out of memory".
import assert from "node:assert/strict";
import { test } from "node:test";
import { outcomeOf } from "../../src/runner/handler.ts";
import type { ProcessResult } from "../../src/runner/run-process.ts";

const ended = (o: Partial<ProcessResult>): ProcessResult => ({
  exitCode: 1,
  signal: null,
  startError: undefined,
  timedOut: false,
  isCanceled: false,
  abortReason: undefined,
  protocolError: undefined,
  result: undefined,
  reportedError: undefined,
  outputHeld: false,
  stderrTail: "",
  durationMs: 10,
  pid: 4242,
  memoryLimitBytes: 2048 * 2 ** 20,
  ...o,
});

const OUT_OF_MEMORY = "the program ran out of memory: it may use 2048 MiB (ASSAY_CHILD_MEMORY_MB)";

test("each runtime's words for a failed allocation, under a limit, are 'ran out of memory', not retried", () => {
  for (const [stderrTail, exit] of [
    ["Error: cannot allocate vector of size 381.5 Mb\nExecution halted\n", { exitCode: 1 }],
    ["Error: memory exhausted (limit reached?)\nExecution halted\n", { exitCode: 1 }],
    ['Error in order(g, x, method = "radix"): Couldn\'t allocate xsub in do_radixsort\n', { exitCode: 1 }],
    ['  File "python_stats.py", line 9\nMemoryError\n', { exitCode: 1 }],
    ['{"type":"error","message":"x"}\nMemoryError\n', { exitCode: 5 }],
    ["RangeError: Failed to allocate memory\n    at createUnsafeBuffer", { exitCode: 1 }],
    [
      "FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory",
      { exitCode: null, signal: "SIGABRT" as const },
    ],
    [
      "# Fatal process out of memory: Failed to reserve virtual memory for CodeRange",
      { exitCode: null, signal: "SIGTRAP" as const },
    ],
  ] as const) {
    const o = outcomeOf(ended({ stderrTail, ...exit }));
    assert.equal(o.status, "failed", stderrTail);
    assert.deepEqual(
      o.status === "failed" ? [o.errorCode, o.errorMessage, o.transient] : [],
      ["ANALYSIS_PROCESS_FAILED", OUT_OF_MEMORY, false],
      stderrTail,
    );
  }
});

test("without a limit, or with a clean exit or other words, the outcome is what it was", () => {
  const unlimited = outcomeOf(ended({ stderrTail: "MemoryError\n", memoryLimitBytes: undefined }));
  assert.equal(unlimited.status === "failed" && unlimited.errorMessage, "the program exited with code 1");
  const dataError = outcomeOf(ended({ exitCode: 3, stderrTail: "a column of text\n" }));
  assert.equal(dataError.status === "failed" && dataError.errorCode, "ANALYSIS_DATA_INVALID");
  // The program's own verdict (exit 2, 3, 4) stands, whatever its stderr echoes: a column named so, a
  // dependency's words (exit 4 is retried).
  for (const [exitCode, code] of [
    [2, "ANALYSIS_INPUT_INVALID"],
    [3, "ANALYSIS_DATA_INVALID"],
    [4, "ANALYSIS_DEPENDENCY_FAILED"],
  ] as const) {
    const o = outcomeOf(
      ended({ exitCode, stderrTail: "duplicate column name: out of memory\nfork: Cannot allocate memory\n" }),
    );
    assert.equal(o.status === "failed" && o.errorCode, code, `exit ${exitCode}`);
    assert.equal(o.status === "failed" && o.transient, exitCode === 4, `exit ${exitCode}`);
  }
  // A program that printed such words and still ended well succeeded.
  const fine = outcomeOf(
    ended({
      exitCode: 0,
      stderrTail: "warning: out of memory once, retried\n",
      result: { type: "result", outputFileName: "out.json", metrics: {} },
    }),
    { ok: true },
  );
  assert.equal(fine.status, "succeeded");
});
