// DELETE /api/files/:fileId against both stores, with real programs and a real worker: the record and
// the bytes go; a task made from the file before keeps its outputs; a run that had not read the file
// yet fails as invalid input, not as a crash; only the owner or an admin may delete; a second delete,
// another user's file and ids that cannot exist are 404. A store that does not answer holds the delete
// up for a few seconds only.
import assert from "node:assert/strict";
import type net from "node:net";
import { after, before, describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { bearer, multipart } from "../helpers/app.ts";
import { tcpRelay } from "../helpers/client.ts";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv, runnerEnvBackends } from "../helpers/runner.ts";

const backends = runnerEnvBackends("deletes/");

for (const [kind, make] of backends) {
  describe(`${kind} store`, () => {
    let env: RunnerEnv;
    let drop: (() => Promise<void>) | undefined;
    let app: FastifyInstance;
    let alice: string;
    let bob: string;
    let admin: string;
    before(async () => {
      const made = await make();
      env = made.env;
      drop = made.drop;
      app = await env.app();
      alice = (await tokenCreate(env.db.sql, "alice «ä»", "user")).token;
      bob = (await tokenCreate(env.db.sql, "bob", "user")).token;
      admin = (await tokenCreate(env.db.sql, "root", "admin")).token;
    });
    after(async () => {
      await env.close();
      await drop?.();
    });

    const upload = async (token: string, content: string, name = "naïve ‮cod.exe.csv") => {
      const { payload, headers } = multipart("file", content, name);
      const res = await app.inject({
        method: "POST",
        url: "/api/files",
        payload,
        headers: { ...headers, ...bearer(token) },
      });
      assert.equal(res.statusCode, 201, res.body);
      return res.json().data.fileId as string;
    };
    const del = (token: string, id: string) =>
      app.inject({ method: "DELETE", url: `/api/files/${id}`, headers: bearer(token) });
    const stored = async (id: string) => {
      try {
        (await env.storage.open(`files/${id}`)).stream.destroy();
        return true;
      } catch {
        return false;
      }
    };

    test("the owner deletes a file: its record and bytes go, a second delete is a 404", async () => {
      const id = await upload(alice, "a,b\n1,2\n");
      assert.equal(await stored(id), true);
      const res = await del(alice, id);
      assert.equal(res.statusCode, 200, res.body);
      assert.deepEqual(res.json(), { code: "OK", message: "File deleted", data: { fileId: id } });
      assert.equal(await stored(id), false, "the bytes are gone");
      const got = await app.inject({ url: `/api/files/${id}`, headers: bearer(alice) });
      assert.equal(got.statusCode, 404);
      const listed = await app.inject({ url: "/api/files?limit=100", headers: bearer(alice) });
      assert.ok(!listed.json().data.items.some((f: { fileId: string }) => f.fileId === id));
      const again = await del(alice, id);
      assert.equal(again.statusCode, 404);
      assert.deepEqual(again.json(), { code: "FILE_NOT_FOUND", message: "The file does not exist." });
    });

    test("another user's file is a 404 and stays; an admin may delete it; ids that cannot exist are 404", async () => {
      const id = await upload(alice, "a\n1\n");
      const byBob = await del(bob, id);
      assert.equal(byBob.statusCode, 404);
      assert.equal(byBob.json().code, "FILE_NOT_FOUND");
      assert.equal(await stored(id), true, "still there");
      assert.equal((await app.inject({ url: `/api/files/${id}`, headers: bearer(alice) })).statusCode, 200);
      assert.equal((await del(admin, id)).statusCode, 200);
      assert.equal(await stored(id), false);
      for (const bad of ["999999999999999", "0", "-1", "abc", "9".repeat(40), "%00"]) {
        const res = await del(alice, bad);
        assert.equal(res.statusCode, 404, bad);
        assert.equal(res.json().code, "FILE_NOT_FOUND", bad);
      }
      const anonymous = await app.inject({ method: "DELETE", url: `/api/files/${id}` });
      assert.equal(anonymous.statusCode, 401);
    });

    test("a create racing a delete of its file: the delete first makes the create a 404, with nothing written", async () => {
      const id = await upload(alice, "a\n1\n");
      const tasksBefore = (await env.db.sql`select count(*)::int as n from tasks`)[0]?.n;
      let commit: () => void = () => {};
      const committed = new Promise<void>((r) => {
        commit = r;
      });
      let deleted: () => void = () => {};
      const isDeleted = new Promise<void>((r) => {
        deleted = r;
      });
      // A delete that has removed the row but not committed yet.
      const tx = env.db.sql.begin(async (t) => {
        await t`delete from files where id = ${id}`;
        deleted();
        await committed;
      });
      await isDeleted;
      const create = app.inject({
        method: "POST",
        url: "/api/analysis-tasks",
        payload: { analysisType: "summary", inputFileId: id, parameters: {} },
        headers: bearer(alice),
      });
      // The create waits for the delete's row lock, then finds the row gone.
      await waitFor(
        async () =>
          (
            await env.db.sql`select 1 from pg_stat_activity
              where datname = current_database() and wait_event_type = 'Lock' and query like '%for key share%'`
          ).length > 0,
        10_000,
        "the create to wait for the delete",
      );
      commit();
      await tx;
      const res = await create;
      assert.equal(res.statusCode, 404, res.body);
      assert.equal(res.json().code, "FILE_NOT_FOUND");
      assert.equal((await env.db.sql`select count(*)::int as n from tasks`)[0]?.n, tasksBefore);
      assert.equal(
        (await env.db.sql`select count(*)::int as n from runs where input_file_id = ${id}`)[0]?.n,
        0,
      );
    });

    test("a finished task keeps its outputs; a queued run of the file fails ANALYSIS_INPUT_INVALID", async () => {
      const type = `del-${kind}`;
      // Uploaded by the runner's owner: the tasks are made as that user (env.task).
      const { token } = await tokenCreate(env.db.sql, "runner");
      const id = await upload(token, "a,b\n1,2\n3,4\n");
      // Made and run before the delete: the summary program over the file.
      const done = await env.task(type, [id], { mode: "ok" });
      const w = env.worker([fixtureProgram(type)]);
      await w.start();
      await waitForTerminal(env.db.sql, done);
      await w.stop();
      // Made before the delete, run after it.
      const queued = await env.task(type, [id], { mode: "ok" });
      assert.equal((await del(token, id)).statusCode, 200);
      const w2 = env.worker([fixtureProgram(type)]);
      await w2.start();
      await waitForTerminal(env.db.sql, queued);
      await w2.stop();
      const [before] = await env.db.sql`select status from runs where task_id = ${done}`;
      assert.equal(before?.status, "succeeded");
      const download = await app.inject({
        url: `/api/analysis-tasks/${done}/download`,
        headers: bearer(token),
      });
      assert.equal(download.statusCode, 200, "the finished task's output is still served");
      const [after] = await env.db.sql`
        select status, error_code, attempt from runs where task_id = ${queued}`;
      assert.deepEqual({ ...after }, { status: "failed", error_code: "ANALYSIS_INPUT_INVALID", attempt: 1 });
    });
  });
}

/**
 * A relay to the S3 server that, once `hold()` is called, passes nothing more on: every request sent
 * after that (on a new connection or a kept-alive one) waits for an answer that never comes.
 */
async function holdingRelay(endpoint: string) {
  const target = new URL(endpoint);
  let holding = false;
  const held = new Set<net.Socket>();
  let closedWhileHeld = 0;
  const relay = await tcpRelay(target, (client, upstream) => {
    client.on("data", (chunk: Buffer) => {
      if (!holding) upstream.write(chunk);
      else if (!held.has(client)) {
        held.add(client);
        client.once("close", () => closedWhileHeld++);
      }
    });
    upstream.pipe(client);
  });
  return {
    endpoint: `http://127.0.0.1:${relay.port}`,
    hold: () => {
      holding = true;
    },
    /** Connections that carried a held request. */
    held: () => held.size,
    /** Of those, how many the client has closed since. */
    closedWhileHeld: () => closedWhileHeld,
    close: relay.close,
  };
}

test("a store that does not answer: the delete answers once the record is gone, logs the bytes left to the sweep, and ends its request", {
  timeout: 60_000,
}, async () => {
  const { createTestBucket } = await import("../helpers/s3.ts");
  const { S3Store } = await import("../../src/storage/s3.ts");
  const bucket = await createTestBucket();
  const relay = await holdingRelay(bucket.endpoint);
  const store = new S3Store({
    bucket: bucket.name,
    prefix: "hung/",
    endpoint: relay.endpoint,
    forcePathStyle: true,
  });
  const env = await runnerEnv({ store, configEnv: { ...bucket.env, ASSAY_S3_PREFIX: "hung/" } });
  try {
    const logs: Record<string, unknown>[] = [];
    const app = await env.app(logs);
    const { token } = await tokenCreate(env.db.sql, "zoë ‮hung");
    const { payload, headers } = multipart("file", "a,b\n1,2\n", "«held» 日本.csv");
    const up = await app.inject({
      method: "POST",
      url: "/api/files",
      payload,
      headers: { ...headers, ...bearer(token) },
    });
    assert.equal(up.statusCode, 201, up.body);
    const id = up.json().data.fileId as string;
    relay.hold();
    const started = Date.now();
    const res = await app.inject({ method: "DELETE", url: `/api/files/${id}`, headers: bearer(token) });
    const took = Date.now() - started;
    assert.equal(res.statusCode, 200, res.body);
    assert.deepEqual(res.json(), { code: "OK", message: "File deleted", data: { fileId: id } });
    // The bound (5 s), not the S3 client's 120 s response timeout and its retries.
    assert.ok(took < 15_000, `answered after ${took} ms`);
    assert.equal((await env.db.sql`select 1 from files where id = ${id}`).length, 0, "the record is gone");
    const left = logs.find((l) => l.msg === "a deleted file's bytes are left to the store sweep");
    assert.ok(left, "logged");
    assert.equal(left.fileId, id);
    assert.match(
      String((left.err as { message?: string })?.message),
      /did not delete files\/\d+ within 5000 ms/,
    );
    // The request to the store was ended, not left waiting in the background.
    assert.ok(relay.held() >= 1, "the delete reached the store");
    await waitFor(async () => relay.closedWhileHeld() === relay.held(), 10_000, "the held request to end");
    // The bytes are still there, for the store sweep: an object no record names.
    const direct = bucket.store("hung/");
    assert.equal((await direct.stat(`files/${id}`)).size, 8);
  } finally {
    await env.close();
    store.client.destroy();
    relay.close();
    await bucket.drop();
  }
});
