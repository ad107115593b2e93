// The client while things go wrong: the API restarting under a follow (every event of the task's log
// printed once, in order), Ctrl-C while following (the task goes on), Ctrl-C during uploads (no task,
// no half-stored file).
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { collect, spawnCli, watch } from "../helpers/cli.ts";
import {
  apiAll,
  type ClientServer,
  csv,
  jsonLines,
  ofKind,
  startClientServer,
  taskLog,
  within,
} from "../helpers/client.ts";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";

let server: ClientServer;
let token: string;
let work: string;
let slowDir: string;

before(async () => {
  server = await startClientServer({ concurrency: 1 });
  token = await server.token("carol");
  work = fs.mkdtempSync(path.join(os.tmpdir(), "assay-client-resume-"));
  // Each file keeps the one worker slot busy for a while (python-stats' median keeps every value).
  slowDir = path.join(work, "slow");
  fs.mkdirSync(slowDir);
  for (let i = 0; i < 10; i++) fs.writeFileSync(path.join(slowDir, `slow ${i} ✓.csv`), csv(60_000, i + 3));
});

after(async () => {
  await server.close();
  fs.rmSync(work, { recursive: true, force: true });
});

/** Everything a child writes on stderr, and a way to wait for a pattern in it. */
function stderrOf(child: ChildProcess) {
  let text = "";
  child.stderr?.on("data", (c: Buffer) => {
    text += c.toString();
  });
  return {
    text: () => text,
    waitFor: (pattern: RegExp, what: string) =>
      waitFor(async () => pattern.test(text), 60_000, what).catch((err: Error) => {
        throw new Error(`${err.message}; the client's stderr:\n${text}\n${server.log()}`);
      }),
  };
}

const submitSlow = (extra: string[] = []) =>
  spawnCli(
    ["submit", "--type", "python-stats", "--param", "method=median", slowDir, "--follow", ...extra],
    server.env(token),
  );

/**
 * What the restart test waits on, each wait bounded by what is left of a deadline under the test's
 * own timeout (180 s): a wait that cannot end fails with what the client and the server printed
 * instead of timing out with nothing to go on.
 */
const RESTART_TEST_DEADLINE_MS = 165_000;

test("--json prints every event of the task's log exactly once, in order, across an API restart", async (t) => {
  const started = Date.now();
  const left = () => Math.max(1_000, started + RESTART_TEST_DEADLINE_MS - Date.now());
  const step = (what: string) => t.diagnostic(`${what} after ${Date.now() - started} ms`);
  const child = submitSlow();
  const out = watch(child);
  const err = stderrOf(child);
  const done = collect(child);
  const printed = () =>
    `client stdout (end):\n${out.stdout().slice(-3000)}\nclient stderr:\n${err.text()}\n${server.log()}`;
  try {
    const [, taskId] = (await out.waitFor(
      /"kind":"task","taskId":"(\d+)"/,
      Math.min(60_000, left()),
    )) as RegExpExecArray;
    step(`task ${taskId} created`);
    await out.waitFor(/"type":"run\.succeeded"/, Math.min(60_000, left()));
    step("a run succeeded");
    const [before] = await server.db.sql<
      { status: string }[]
    >`select status from tasks where id = ${taskId as string}`;
    assert.equal(before?.status, "running", "the restart comes in the middle of the task");
    const seenBefore = ofKind(jsonLines(out.stdout()), "event").length;

    await server.stop();
    step("server stopped");
    await err.waitFor(/connection lost .*; reconnecting/, "the client to notice the API went away");
    await server.start();
    step("server started");
    // A server that dies after its restart fails the wait at once, with its log.
    const r = await within(
      Promise.race([done, server.exited()]),
      left(),
      "the client to follow the task to its end after the restart",
      printed,
    );
    step("client exited");
    assert.equal(r.code, 0, printed());
    assert.match(err.text(), /reconnected/);

    const lines = jsonLines(r.stdout);
    const events = ofKind(lines, "event").map(({ kind, ...e }) => e as { id: string });
    assert.ok(events.length > seenBefore, "events arrived after the restart");
    const ids = events.map((e) => BigInt(e.id));
    for (let i = 1; i < ids.length; i++)
      assert.ok((ids[i] as bigint) > (ids[i - 1] as bigint), "ids strictly rise");
    assert.deepEqual(events, await taskLog(server, token, taskId as string), "exactly the task's log");
    assert.equal(ofKind(lines, "summary")[0]?.status, "succeeded");
  } finally {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGKILL");
      await done;
    }
    // A failure between the stop and the start must not leave this file's other tests without a
    // server (they would fail with ECONNREFUSED, hiding the first failure's cause).
    if (!server.running)
      await server
        .start()
        .catch((err: Error) => t.diagnostic(`could not start the server again: ${err.message}`));
  }
});

test("Ctrl-C while following stops following, says the task goes on, and the task does", async () => {
  const child = submitSlow();
  const out = watch(child);
  const err = stderrOf(child);
  const done = collect(child);
  const [, taskId] = (await out.waitFor(/"kind":"task","taskId":"(\d+)"/, 60_000)) as RegExpExecArray;
  await out.waitFor(/"type":"run\.running"/, 60_000);
  child.kill("SIGINT");
  const r = await within(done, 30_000, "the client to stop after Ctrl-C", () => err.text());
  assert.equal(r.code, 130);
  const [interrupted] = ofKind(jsonLines(r.stdout), "interrupted");
  assert.equal(interrupted?.taskId, taskId);
  assert.match(err.text(), new RegExp(`task ${taskId} is still running`));
  assert.equal(ofKind(jsonLines(r.stdout), "summary").length, 0);
  const row = await waitForTerminal(server.db.sql, taskId as string, 120_000);
  assert.equal(row.status, "succeeded", "the task ran on without the client");
});

test("Ctrl-C while submit --out waits for the task names the download that fetches the outputs later", async () => {
  const out = path.join(work, "later out");
  const child = spawnCli(
    ["submit", "--type", "python-stats", "--param", "method=median", slowDir, "--out", out],
    server.env(token),
  );
  const watched = watch(child);
  const err = stderrOf(child);
  const done = collect(child);
  const [, taskId] = (await watched.waitFor(/"kind":"task","taskId":"(\d+)"/, 60_000)) as RegExpExecArray;
  child.kill("SIGINT");
  const r = await within(done, 30_000, "the client to stop after Ctrl-C", () => err.text());
  assert.equal(r.code, 130, err.text());
  assert.match(err.text(), new RegExp(`task ${taskId} is still running`));
  assert.match(
    err.text(),
    new RegExp(`once it has ended, assay download ${taskId} --out '${out}' fetches its outputs\n`),
    err.text(),
  );
  assert.match(String(ofKind(jsonLines(r.stdout), "interrupted")[0]?.message), /assay download/);
});

test("Ctrl-C during uploads stops cleanly: no task, and every stored file is whole", async () => {
  const dave = await server.token("dave");
  const dir = path.join(work, "large");
  fs.mkdirSync(dir);
  const hashes = new Map<string, number>();
  const block = Buffer.from(csv(200_000, 7));
  for (let i = 0; i < 10; i++) {
    // ~17 MB each, every file different from its first line on.
    const bytes = Buffer.concat([Buffer.from(`file ${i}\n`), block, block, block]);
    fs.writeFileSync(path.join(dir, `large-${i}.csv`), bytes);
    hashes.set(createHash("sha256").update(bytes).digest("hex"), bytes.length);
  }
  const child = spawnCli(["submit", "--type", "summary", dir, "--concurrency", "2"], server.env(dave));
  const out = watch(child);
  const done = collect(child);
  await out.waitFor(/"kind":"file"/, 60_000);
  child.kill("SIGINT");
  const r = await within(done, 30_000, "the client to stop after Ctrl-C", () => out.stdout());
  assert.equal(r.code, 130, r.stderr);
  assert.match(r.stderr, /no task was created/);
  const lines = jsonLines(r.stdout);
  assert.equal(ofKind(lines, "task").length, 0);
  assert.ok(ofKind(lines, "file").length < 10, "stopped before every file was sent");
  const [tasks] = await server.db.sql<{ n: number }[]>`
    select count(*)::int as n from tasks t join users u on u.id = t.owner_id where u.name = 'dave'`;
  assert.equal(tasks?.n, 0, "no task");
  // The server may still be finishing an upload whose body arrived whole before the interrupt: wait
  // until no upload is in progress and every stored object has its row (an upload publishes its
  // object, then inserts the row), so the listing below is what the next submit will see.
  const partial = path.join(server.dataDir, ".partial");
  const objects = path.join(server.dataDir, "files");
  await waitFor(
    async () => {
      if (fs.existsSync(partial) && fs.readdirSync(partial).length > 0) return false;
      const stored = fs.existsSync(objects) ? fs.readdirSync(objects) : [];
      const [rows] = await server.db.sql<{ n: number }[]>`
        select count(*)::int as n from files where id::text = any(${stored})`;
      return rows?.n === stored.length;
    },
    10_000,
    "the server to finish or drop the cut-off uploads",
  );
  // Whatever the server kept is a complete copy of a local file; nothing is left half-written.
  const files = await apiAll<{ sha256: string; sizeBytes: number }>(server, dave, "/api/files");
  assert.ok(files.length >= 1);
  assert.ok(fs.readdirSync(objects).length >= files.length, "the wait above looked where the objects are");
  for (const f of files)
    assert.equal(hashes.get(f.sha256), f.sizeBytes, "a stored file is a whole local file");
  // The next submit reuses what arrived whole and sends the rest.
  const again = await collect(spawnCli(["submit", "--type", "summary", dir], server.env(dave)));
  assert.equal(again.code, 0, again.stderr);
  const [upload] = ofKind(jsonLines(again.stdout), "upload");
  assert.equal(upload?.reused, files.length);
  assert.equal(upload?.uploaded, 10 - files.length);
});
