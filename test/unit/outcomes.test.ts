// The worker's decision table: how an attempt's ending becomes what the queue records.
import assert from "node:assert/strict";
import { test } from "node:test";
import { decide, durationText, type Ending } from "../../src/queue/outcomes.ts";
import type { ClaimedRun } from "../../src/queue/sql.ts";
import { StoreUnavailableError } from "../../src/storage/store.ts";

const run = (attempt: number, maxAttempts = 3) =>
  ({ id: 7, taskId: 1, leaseToken: "t", attempt, maxAttempts }) as unknown as ClaimedRun;
const ok: Ending = { status: "succeeded", result: { metrics: { rows: 1 } } };
const transient: Ending = { status: "failed", errorCode: "ANALYSIS_DEPENDENCY_FAILED", transient: true };
const permanent: Ending = {
  status: "failed",
  errorCode: "ANALYSIS_DATA_INVALID",
  result: { stderrTail: "x" },
};

test("a lost lease records nothing; otherwise the abort reason wins over anything but a success", () => {
  assert.deepEqual(decide(run(1), "lost", ok, 100), { kind: "discard" });
  const killed: Ending = { status: "cancelled" };
  const shutdown = decide(run(1), "shutdown", killed, 100);
  assert.equal(shutdown.kind, "retry");
  assert.ok(shutdown.kind === "retry" && shutdown.retry.refund && shutdown.retry.delayMs === 0);
  const cancel = decide(run(1), "cancel", transient, 100);
  assert.ok(cancel.kind === "complete" && cancel.outcome.status === "cancelled");
  const timeout = decide(run(1), "timeout", killed, 100);
  assert.ok(timeout.kind === "complete" && timeout.outcome.status === "timed_out");
  assert.ok(timeout.kind === "complete" && timeout.outcome.errorCode === "ANALYSIS_PROCESS_TIMEOUT");
  // The message names the limit, when the worker gives it.
  const limited = decide(run(1), "timeout", killed, 100, 600_000);
  assert.ok(limited.kind === "complete");
  assert.equal(limited.outcome.errorMessage, "the attempt exceeded its time limit of 10 min");
});

test("a time limit as people read it", () => {
  for (const [ms, text] of [
    [1500, "1.5 s"],
    [4000, "4 s"],
    [59_000, "59 s"],
    [60_000, "1 min"],
    [600_000, "10 min"],
    [3_600_000, "1 h"],
    [5_430_000, "1 h 30 min 30 s"],
    // Rounded before it is split: never "60 s".
    [59_960, "1 min"],
    [119_500, "2 min"],
    [3_599_700, "1 h"],
    [100, "0.1 s"],
  ] as const)
    assert.equal(durationText(ms), text, String(ms));
});

test("a success stands against a cancel, timeout or shutdown that came after the program finished", () => {
  const done: Ending = { status: "succeeded", result: { metrics: { rows: 1 } }, outputKey: "1/7.1.t" };
  for (const reason of ["cancel", "timeout", "shutdown"] as const) {
    assert.deepEqual(decide(run(1), reason, done, 100), {
      kind: "complete",
      outcome: {
        id: 7,
        token: "t",
        status: "succeeded",
        result: { metrics: { rows: 1 } },
        outputKey: "1/7.1.t",
      },
    });
  }
});

test("outcomes without an abort", () => {
  const s = decide(run(1), undefined, ok, 100);
  assert.deepEqual(s, {
    kind: "complete",
    outcome: { id: 7, token: "t", status: "succeeded", result: { metrics: { rows: 1 } }, outputKey: null },
  });
  const r = decide(run(1), undefined, transient, 100);
  assert.ok(r.kind === "retry" && !r.retry.refund && r.retry.delayMs >= 50 && r.retry.delayMs <= 100);
  const exhausted = decide(run(3), undefined, transient, 100);
  assert.ok(exhausted.kind === "complete" && exhausted.outcome.status === "failed");
  const p = decide(run(1), undefined, permanent, 100);
  assert.ok(p.kind === "complete" && p.outcome.errorCode === "ANALYSIS_DATA_INVALID");
  assert.ok(p.kind === "complete" && p.outcome.result?.stderrTail === "x");
  const thrown = decide(run(1), undefined, { status: "error", error: new Error("x") }, 100);
  assert.ok(thrown.kind === "retry" && thrown.retry.errorCode === "ANALYSIS_PROCESS_FAILED");
  const unasked = decide(run(1), undefined, { status: "cancelled" }, 100);
  assert.ok(unasked.kind === "complete" && unasked.outcome.status === "failed");
});

test("a store that could not be used puts the run back refunded, on its last attempt too; a cancel or timeout still wins", () => {
  const down: Ending = {
    status: "error",
    error: new StoreUnavailableError(
      Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:9"), { code: "ECONNREFUSED" }),
    ),
  };
  for (const attempt of [1, 3]) {
    const d = decide(run(attempt, 3), undefined, down, 100);
    assert.equal(d.kind, "retry", `attempt ${attempt}`);
    assert.ok(d.kind === "retry" && d.retry.refund, "refunded");
    assert.ok(d.kind === "retry" && d.retry.delayMs > 0, "after a delay");
    assert.ok(d.kind === "retry" && d.retry.errorCode === "ANALYSIS_STORAGE_UNAVAILABLE");
  }
  const cancel = decide(run(1), "cancel", down, 100);
  assert.ok(cancel.kind === "complete" && cancel.outcome.status === "cancelled");
  const timeout = decide(run(1), "timeout", down, 100);
  assert.ok(timeout.kind === "complete" && timeout.outcome.status === "timed_out");
  // The same failure of the store, which then answered its check (a thrown error as it was): counted.
  const answered: Ending = { status: "error", error: new Error("socket hang up") };
  const last = decide(run(3, 3), undefined, answered, 100);
  assert.ok(last.kind === "complete" && last.outcome.errorCode === "ANALYSIS_PROCESS_FAILED");
});
