// Bounds on event streams: one user holds at most ASSAY_SSE_MAX_STREAMS_PER_USER of them on a process,
// the process at most ASSAY_SSE_MAX_STREAMS; one more is 429 TOO_MANY_STREAMS with Retry-After, and a
// stream that ends frees its place. (Until 2026-12-07 one user's 20,000 streams took every file
// descriptor of the API, and every other request failed.)
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { startTestApp, type TestApp } from "../helpers/app.ts";
import { createTask, seedUser, waitFor } from "../helpers/queue.ts";
import { openSse, type SseStream } from "../helpers/sse.ts";

let t: TestApp;
let base: string;

before(async () => {
  t = await startTestApp({ ASSAY_SSE_MAX_STREAMS_PER_USER: "3", ASSAY_SSE_MAX_STREAMS: "5" });
  await t.app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
});
after(() => t.close());

const LIMIT = { timeout: 30_000 };

/** A queued task of `name`'s that never runs: its streams stay open until closed. */
async function openTask(name: string): Promise<{ token: string; url: string }> {
  const owner = await seedUser(t.db.sql, name);
  const taskId = await createTask(t.db.sql, owner, "sse-limits", 1);
  return { token: await t.token(name), url: `${base}/api/analysis-tasks/${taskId}/events` };
}

async function refused(url: string, token: string): Promise<{ code: string; message: string }> {
  const res = await fetch(url, {
    headers: { authorization: `Bearer ${token}`, accept: "text/event-stream" },
  });
  assert.equal(res.status, 429);
  assert.equal(res.headers.get("retry-after"), "10");
  return (await res.json()) as { code: string; message: string };
}

const hubSubscribers = () => t.app.services.events.size;

test(
  "a user's streams past the per-user bound, and the process's past its own, are refused until one ends",
  LIMIT,
  async () => {
    const alice = await openTask("sse-alice-Ünïcode");
    const bob = await openTask("sse-bob");
    const open: SseStream[] = [];
    try {
      for (let i = 0; i < 3; i++) open.push(await openSse(alice.url, alice.token));
      assert.deepEqual(
        open.map((s) => s.status),
        [200, 200, 200],
      );
      // The fourth of alice's: the per-user bound, whichever of her tokens asks.
      const other = await t.token("sse-alice-Ünïcode");
      const mine = await refused(alice.url, other);
      assert.equal(mine.code, "TOO_MANY_STREAMS");
      assert.match(mine.message, /You have too many event streams open/);
      // bob is not held back by alice's streams — until the process's bound (5).
      for (let i = 0; i < 2; i++) open.push(await openSse(bob.url, bob.token));
      assert.deepEqual(
        open.map((s) => s.status),
        [200, 200, 200, 200, 200],
      );
      const server = await refused(bob.url, bob.token);
      assert.equal(server.code, "TOO_MANY_STREAMS");
      assert.match(server.message, /This server serves as many event streams as it can/);
      // Refused ones hold nothing: five subscribers in the hub.
      await waitFor(async () => hubSubscribers() === 5, 10_000, "five subscribers");
      // One of alice's ends: her next one is served, and bob's is refused again (the process is full).
      open.shift()?.close();
      await waitFor(async () => hubSubscribers() === 4, 10_000, "four subscribers");
      const again = await openSse(alice.url, alice.token);
      open.push(again);
      assert.equal(again.status, 200);
      await refused(bob.url, bob.token);
    } finally {
      for (const s of open) s.close();
    }
    await waitFor(async () => hubSubscribers() === 0, 10_000, "no subscribers");
    // Every place is free again: the user's bound counts only open streams.
    const back = await Promise.all([0, 1, 2].map(() => openSse(alice.url, alice.token)));
    assert.deepEqual(
      back.map((s) => s.status),
      [200, 200, 200],
    );
    for (const s of back) s.close();
    // Told to the operator at warn, not once per refused stream: at most once a minute.
    const warned = t.logs.filter((l) => l.level === 40 && String(l.msg).startsWith("event streams refused"));
    assert.equal(warned.length, 1, JSON.stringify(warned));
  },
);
