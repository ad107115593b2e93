import assert from "node:assert/strict";
import { test } from "node:test";
import { jitter } from "../../src/queue/backoff.ts";
import { MAX_TIMER_MS, timerDelay } from "../../src/timers.ts";

test("jittered and derived delays never cross what a timer can wait", () => {
  for (let i = 0; i < 1000; i++) {
    const d = jitter(MAX_TIMER_MS);
    assert.ok(d <= MAX_TIMER_MS && d >= Math.floor(MAX_TIMER_MS * 0.8), String(d));
  }
  assert.equal(timerDelay(MAX_TIMER_MS + 15_000), MAX_TIMER_MS);
  assert.equal(timerDelay(-5), 0);
  assert.equal(timerDelay(1234), 1234);
});
