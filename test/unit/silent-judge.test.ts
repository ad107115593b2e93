// src/db/silent.ts's SilentJudge: which silent pool connections it closes, by what pg_stat_activity
// says of their backends, and when it asks again. (The look-ups themselves, against a real server:
// test/integration/db-gate.test.ts and silent-sweep.test.ts.)
import assert from "node:assert/strict";
import net from "node:net";
import { test } from "node:test";
import type { BackendStates, PacedSocket, SilentConnection } from "../../src/db/client.ts";
import { SilentJudge } from "../../src/db/silent.ts";

const log = { warn: () => {} };

/** A silent connection: pid, silent for `silentMs`, its socket made `ageMs` ago. */
function conn(pid: number, silentMs: number, ageMs = 60_000, sending = false): SilentConnection {
  const now = performance.now();
  return { pid, socket: new net.Socket(), read: 0, since: now - silentMs, sending, age: ageMs };
}

/** A pacer whose drop() records what it was asked to close. */
function pacer(): { paced: Partial<PacedSocket>; closed: number[] } {
  const closed: number[] = [];
  return {
    closed,
    paced: {
      drop: (c) => {
        closed.push(c.pid);
        return true;
      },
    },
  };
}

let started = 0;
/** A backend's row; its `backend_start` is one of its own (null for another role's, as there). */
const row = (state: string | null, waitEvent: string | null = null, ageMs: number | null = 60_000) => ({
  state,
  waitEvent,
  ageMs,
  start: state === null ? null : `2026-12-07 10:00:${String(10 + started++).padStart(2, "0")}.123456+00`,
  own: state !== null,
});

test("what is closed: backends gone, another role's, younger than their connection, stuck past the bound; only the stuck ones' backends are ended", async () => {
  const ended: { pid: number; start: string }[][] = [];
  const judge = new SilentJudge(log, 10_000, undefined, async (backends) => {
    ended.push([...backends]);
  });
  const { paced, closed } = pacer();
  const silent = [
    conn(100_001, 3_000), // gone
    conn(100_002, 3_000), // another role's session (state null)
    conn(100_003, 3_000, 60_000), // its pid taken by a session younger than the connection
    conn(100_004, 12_000), // idle past the stuck bound
    conn(100_005, 3_000), // idle, not yet
    conn(100_006, 12_000), // active, waiting for the client past the bound
    conn(100_007, 12_000), // blocked writing its answer past the bound
    conn(100_008, 12_000, 60_000, true), // idle past the bound, but Node still writes to it
    conn(100_009, 30_000), // a long statement
    conn(100_010, 30_000), // a statement on a lock
    conn(100_011, 30_000), // track_activities off
    conn(100_012, 3_000, 60_000), // a backend as old as its connection, at work
    conn(100_013, 12_000, 60_000), // idle past the bound, but another role's (seen by a superuser)
    conn(100_014, 12_000, 5_000), // idle past the bound, its pid taken by a session far older
  ];
  const states: BackendStates = new Map([
    [100_002, row(null)],
    [100_003, row("active", "PgSleep", 2_000)],
    [100_004, row("idle", "ClientRead")],
    [100_005, row("idle in transaction", "ClientRead")],
    [100_006, row("active", "ClientRead")],
    [100_007, row("active", "ClientWrite")],
    [100_008, row("idle", "ClientRead")],
    [100_009, row("active", null)],
    [100_010, row("active", "transactionid")],
    [100_011, row("disabled", null, null)],
    [100_012, row("active", "PgSleep", 59_500)],
    [100_013, { ...row("idle", "ClientRead"), own: false }],
    [100_014, row("idle", "ClientRead", 3_600_000)],
  ]);
  const dropped = judge.judge(paced, silent, states);
  assert.deepEqual(dropped, [100_001, 100_002, 100_003, 100_004, 100_006, 100_007, 100_013, 100_014]);
  assert.deepEqual(closed, dropped);
  await judge.ended();
  // Not a backend gone, another role's or another session's (its pid taken again): only this
  // session's own, named with their backend_start.
  assert.deepEqual(ended, [
    [100_004, 100_006, 100_007].map((pid) => ({ pid, start: states.get(pid)?.start ?? "" })),
  ]);
});

test("a failure to end the backends is logged, not thrown", async () => {
  const warned: string[] = [];
  const judge = new SilentJudge(
    { warn: (_o: object, msg?: string) => void warned.push(msg ?? "") },
    10_000,
    undefined,
    () => Promise.reject(new Error("permission denied to terminate process")),
  );
  const { paced } = pacer();
  assert.deepEqual(
    judge.judge(paced, [conn(150_001, 12_000)], new Map([[150_001, row("idle", "ClientRead")]])),
    [150_001],
  );
  await judge.ended();
  assert.equal(warned.length, 2);
  assert.match(warned[1] ?? "", /were not ended/);
});

test("nothing is closed when the pids cannot be judged (a pooler's), and they are not asked about again until the recheck", () => {
  const judge = new SilentJudge(log, 10_000, 30_000);
  const { paced, closed } = pacer();
  const silent = [conn(200_001, 20_000)];
  assert.equal(judge.due(silent), true);
  assert.deepEqual(judge.judge(paced, silent, null), []);
  assert.deepEqual(closed, []);
  assert.equal(judge.due(silent), false);
  assert.equal(judge.due(silent, performance.now() + 30_000), true, "asked again after the recheck");
});

test("a connection found at work is asked about again when its silence changes, or after the recheck", () => {
  const judge = new SilentJudge(log, 10_000, 30_000);
  const { paced } = pacer();
  const c = conn(300_001, 5_000);
  judge.judge(paced, [c], new Map([[300_001, row("active", "Lock")]]));
  assert.equal(judge.due([c]), false, "the same silence: found at work");
  assert.equal(judge.due([{ ...c, since: c.since + 1 }]), true, "it read something and went silent again");
  assert.equal(judge.due([c, conn(300_002, 5_000)]), true, "another connection went silent");
  assert.equal(judge.due([c], performance.now() + 30_000), true, "the recheck is due");
  // An undecided one (idle, not yet past the bound) is not remembered: asked about at the next look.
  const idle = conn(300_003, 3_000);
  judge.judge(paced, [idle], new Map([[300_003, row("idle", "ClientRead")]]));
  assert.equal(judge.due([idle]), true);
});
