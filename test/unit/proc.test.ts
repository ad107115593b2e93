// Processes by pid: a zombie (exited, not yet collected by its parent) is not alive.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import { test } from "node:test";
import { isAlive } from "../../src/proc.ts";
import { waitFor } from "../helpers/queue.ts";

test("a zombie is not alive; its parent, which does not collect it, is", {
  skip: process.platform !== "linux",
}, async (t) => {
  // The shell starts a child that exits at once, then becomes a program that never waits for it (a
  // parent that collects late, as a container's PID 1 may): the child stays a zombie while it runs.
  const parent = spawn("/bin/sh", ["-c", "sleep 0 & echo $!; exec sleep 30"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  t.after(() => parent.kill("SIGKILL"));
  const line = await new Promise<string>((resolve) =>
    parent.stdout.once("data", (b: Buffer) => resolve(String(b))),
  );
  const zombie = Number(line.trim());
  assert.ok(Number.isInteger(zombie) && zombie > 0, line);
  await waitFor(
    async () => /\) Z /.test(fs.readFileSync(`/proc/${zombie}/stat`, "latin1")),
    10_000,
    "the zombie",
  );
  assert.equal(isAlive(zombie), false);
  assert.equal(isAlive(parent.pid as number), true);
  assert.equal(isAlive(process.pid), true);
});

test("a pid no process has is not alive; PID 1 is", () => {
  assert.equal(isAlive(2 ** 22 + 1), false, "above Linux's pid_max");
  // Another user's (root's) when the tests run as someone else: EPERM, which counts as alive.
  assert.equal(isAlive(1), true);
});
