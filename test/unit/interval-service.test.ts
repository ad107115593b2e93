// IntervalService (every background loop: reaper, retention, store sweep): one pass at a time, one
// chain of passes, whatever the order of start() and stop() calls.
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { test } from "node:test";
import { createLogger } from "../../src/log.ts";
import { IntervalService, loggedFailure } from "../../src/queue/service.ts";
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

test("a pass's failure is logged once: by the service, unless the pass logged it itself (loggedFailure)", async () => {
  const lines: { msg: string; err?: { message: string } }[] = [];
  const destination = new Writable({
    write(chunk, _enc, done) {
      for (const line of String(chunk).split("\n")) if (line) lines.push(JSON.parse(line));
      done();
    },
  });
  let passes = 0;
  class Failing extends IntervalService<void> {
    constructor() {
      super("failing", 5, createLogger({ level: "warn", destination }));
    }
    async runOnce(): Promise<void> {
      passes++;
      // Odd passes fail as a sweep's prefix does, logged on the spot; even ones plainly.
      if (passes % 2 === 1) {
        const err = new Error(`pass ${passes}: logged by the pass`);
        this.logger.warn({ err }, "the pass could not do one thing");
        throw loggedFailure(err);
      }
      throw new Error(`pass ${passes}: not logged`);
    }
  }
  const s = new Failing();
  s.start();
  try {
    await waitFor(async () => passes >= 4, 10_000, "four passes");
  } finally {
    await s.stop();
  }
  const failed = lines.filter((l) => l.msg === "failing pass failed").map((l) => l.err?.message);
  const own = lines.filter((l) => l.msg === "the pass could not do one thing").map((l) => l.err?.message);
  const odd = (m: string | undefined) => Number(/pass (\d+)/.exec(m ?? "")?.[1]) % 2 === 1;
  assert.ok(own.length >= 2 && own.every(odd), JSON.stringify(own));
  assert.ok(failed.length >= 2, JSON.stringify(failed));
  assert.ok(
    failed.every((m) => !odd(m)),
    `a failure the pass logged was logged again: ${JSON.stringify(failed)}`,
  );
});
