// The group guard's helper, without a worker: groups still listed when its stdin ends are killed,
// groups removed from the list are left alone, and close() waits for the helper to exit. And killGroup,
// which the runner calls from a child's exit handler and from timers: it never throws.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { test } from "node:test";
import { GroupGuard } from "../../src/runner/group-guard.ts";
import { killGroup } from "../../src/runner/kill-group.ts";
import { waitFor } from "../helpers/queue.ts";
import { alive } from "../helpers/runner.ts";

const sleeper = (uid?: number) => {
  // Another user's: the system's sleep, which every user may run (a checkout under /root, as CI's, is
  // not theirs to read).
  const [command, args] =
    uid === undefined ? [process.execPath, ["-e", "setInterval(() => {}, 1000)"]] : ["sleep", ["1000"]];
  const child = spawn(command, args, {
    detached: true,
    stdio: "ignore",
    ...(uid === undefined ? {} : { uid, gid: uid }),
  });
  child.unref();
  return child.pid as number;
};

test("on close, the groups still listed are killed; a removed group is not; an unexpected exit is reported", async () => {
  let lost = 0;
  const guard = GroupGuard.start(() => lost++);
  const listed = sleeper();
  const removed = sleeper();
  guard.add(listed);
  guard.add(removed);
  guard.remove(removed);
  await guard.close();
  await waitFor(async () => !alive(listed), 10_000, "the listed group to die");
  assert.ok(alive(removed), "a group removed from the list is left alone");
  process.kill(-removed, "SIGKILL");
  assert.equal(lost, 0, "close() is not a loss");

  const other = GroupGuard.start(() => lost++);
  process.kill(other.pid as number, "SIGKILL");
  await waitFor(async () => lost === 1, 10_000, "the loss to be reported");
});

test("killGroup: sent to a live group, a gone group, and a group of another user (EPERM) without throwing", {
  skip: process.getuid?.() !== 0 && "needs root, to run processes as two other users",
}, async () => {
  const own = sleeper();
  assert.equal(killGroup(own, "SIGKILL"), "sent");
  await waitFor(async () => !alive(own), 10_000, "the group to die");
  assert.equal(killGroup(own, "SIGKILL"), "gone");
  // A group of user 65534, signalled by this process as user 65533 (its effective uid, for one
  // synchronous call: no capability to kill then): the kernel says EPERM.
  const foreign = sleeper(65534);
  try {
    await waitFor(async () => alive(foreign), 10_000, "the other user's group");
    let result: string;
    process.seteuid?.(65533);
    try {
      result = killGroup(foreign, "SIGKILL");
    } finally {
      process.seteuid?.(0);
    }
    assert.equal(result, "failed", "EPERM is reported, not thrown");
    assert.ok(alive(foreign));
  } finally {
    process.kill(-foreign, "SIGKILL");
  }
});

test("a helper that cannot be spawned is reported lost, does not crash the process, and close() returns", async () => {
  const execPath = process.execPath;
  let lost = 0;
  let guard: GroupGuard;
  try {
    // What EAGAIN or ENOMEM would do: the spawn fails, with an 'error' and no pid.
    process.execPath = "/nonexistent/assay-node";
    guard = GroupGuard.start(() => lost++);
    // Closed at once, before the spawn's 'error' has come: no 'exit' will ever come to wait for.
    const early = GroupGuard.start(() => lost++);
    await early.close();
  } finally {
    process.execPath = execPath;
  }
  await waitFor(async () => lost >= 1, 5000, "the loss to be reported");
  assert.equal(guard.pid, undefined);
  guard.add(12345); // writes to a helper that never was: ignored
  await guard.close();
  // The first is reported lost; the one closed before its 'error' came is not (closing is no loss).
  await new Promise((resolve) => setTimeout(resolve, 50));
  assert.equal(lost, 1);
});
