// The group guard's helper, without a worker: groups still listed when its stdin ends are killed,
// groups removed from the list are left alone, and close() waits for the helper to exit.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { test } from "node:test";
import { GroupGuard } from "../../src/runner/group-guard.ts";
import { waitFor } from "../helpers/queue.ts";
import { alive } from "../helpers/runner.ts";

const sleeper = () => {
  const child = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], {
    detached: true,
    stdio: "ignore",
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
