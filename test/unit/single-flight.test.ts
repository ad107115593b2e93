// /readyz's checks (src/http/routes/health.ts singleFlight): probes that arrive while a check runs share
// it; a check older than its stale bound is not shared, up to a number outstanding — behind a proxy that
// closes every connection a readiness query waits for ever, and one more every stale period of an
// outage would pile up.
import assert from "node:assert/strict";
import { test } from "node:test";
import { singleFlight } from "../../src/single-flight.ts";

/** A check that ends when the test says so, and how many were started. */
function checks() {
  const pending: ((v: number) => void)[] = [];
  let started = 0;
  const work = () =>
    new Promise<number>((resolve) => {
      started++;
      pending.push(resolve);
    });
  return { work, started: () => started, finish: (v: number) => pending.shift()?.(v) };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

test("probes during a check share it; the next check starts once it has ended", async () => {
  const c = checks();
  const check = singleFlight(c.work, { staleMs: 60_000 });
  const answers = Array.from({ length: 20 }, () => check());
  assert.equal(c.started(), 1);
  c.finish(7);
  assert.deepEqual(await Promise.all(answers), Array(20).fill(7));
  const next = check();
  assert.equal(c.started(), 2);
  c.finish(8);
  assert.equal(await next, 8);
});

test("a stale check is not shared, but no more than `max` are outstanding however long it lasts", async () => {
  const c = checks();
  const check = singleFlight(c.work, { staleMs: 20, max: 2, forgetMs: 60_000 });
  const first = check();
  check();
  assert.equal(c.started(), 1);
  // Stale: the next probe starts a second check, and shares it.
  await sleep(30);
  const second = check();
  check();
  assert.equal(c.started(), 2);
  // Both stale and both outstanding: the probes share the newest, for as long as the outage lasts.
  for (let i = 0; i < 5; i++) {
    await sleep(30);
    assert.equal(check(), second);
  }
  assert.equal(c.started(), 2);
  // The first ends: one may start again.
  c.finish(1);
  assert.equal(await first, 1);
  await sleep(30);
  check();
  assert.equal(c.started(), 3);
});

test("checks stuck past the forget bound no longer count: a new one starts, one per bound at most", async () => {
  // Checks on connections that died without a word (a NAT that dropped them) end when TCP gives up,
  // minutes later; readiness must not wait for that once new connections work.
  const c = checks();
  const check = singleFlight(c.work, { staleMs: 20, max: 2, forgetMs: 150 });
  check();
  await sleep(30);
  check();
  assert.equal(c.started(), 2);
  await sleep(30);
  check();
  assert.equal(c.started(), 2, "at the cap");
  // The first is past the forget bound: it no longer counts, and a third starts.
  await sleep(130);
  const third = check();
  assert.equal(c.started(), 3);
  assert.equal(check(), third, "shared, as any young check");
  // The database answers again: the new check ends, whatever became of the forgotten ones.
  c.finish(1);
  c.finish(2);
  c.finish(3);
  assert.equal(await third, 3);
});

test("a check that fails is not kept: the next probe starts another", async () => {
  let started = 0;
  const check = singleFlight(async () => {
    started++;
    throw new Error("down");
  });
  await assert.rejects(check(), /down/);
  await assert.rejects(check(), /down/);
  assert.equal(started, 2);
});
