// IntervalService (every background loop: reaper, retention, store sweep): one pass at a time, one
// chain of passes, whatever the order of start() and stop() calls.
import assert from "node:assert/strict";
import { test } from "node:test";
import { createLogger } from "../../src/log.ts";
import { IntervalService } from "../../src/queue/service.ts";
import { waitFor } from "../helpers/queue.ts";

/** Passes that last longer than the interval, counting how many ran at once. */
class Probe extends IntervalService<void> {
  live = 0;
  most = 0;
  done = 0;
  constructor() {
    super("probe", 5, createLogger({ level: "silent" }));
  }
  async runOnce(): Promise<void> {
    this.live++;
    this.most = Math.max(this.most, this.live);
    await new Promise((r) => setTimeout(r, 15));
    this.live--;
    this.done++;
  }
}

test("start() twice runs one chain of passes, one at a time", async () => {
  const s = new Probe();
  s.start();
  s.start();
  try {
    await waitFor(async () => s.done >= 12, 10_000, "twelve passes");
    assert.equal(s.most, 1, "never two passes at once");
  } finally {
    await s.stop();
  }
});

test("start() right after a stop() that is still waiting for its pass: the old pass schedules nothing, passes stay one at a time", async () => {
  const s = new Probe();
  s.start();
  await waitFor(async () => s.live === 1, 10_000, "a pass in progress");
  const stopped = s.stop();
  s.start();
  try {
    await stopped;
    await waitFor(async () => s.done >= 12, 10_000, "twelve passes");
    assert.equal(s.most, 1, "never two passes at once");
  } finally {
    await s.stop();
  }
});
