import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { LocalStore } from "../../src/storage/local.ts";
import { taskOutputsPrefix } from "../../src/storage/store.ts";
import { bearer } from "../helpers/app.ts";
import { waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";

let env: RunnerEnv;
let app: FastifyInstance;
let token: string;
let stranger: string;

before(async () => {
  env = await runnerEnv();
  app = await env.app();
  token = (await tokenCreate(env.db.sql, "runner")).token;
  stranger = (await tokenCreate(env.db.sql, "stranger")).token;
});
after(() => env.close());

async function finishedTask(type: string, contents: string[], params: Record<string, unknown>) {
  const files = [];
  for (const c of contents) files.push(await env.file(c));
  await env.db
    .sql`update files set name = 'same.csv' where id = any(${env.db.sql.array(files, 20)}::bigint[])`;
  await env.db.sql`update files set name = 'other.csv' where id = ${files.at(-1) as string}`;
  const taskId = await env.task(type, files, params);
  const w = env.worker([fixtureProgram(type)]);
  await w.start();
  await waitForTerminal(env.db.sql, taskId);
  await w.stop();
  return taskId;
}

const get = (url: string, t = token) => app.inject({ url, headers: bearer(t) });

test("a one-file task streams its output file with type and disposition", async () => {
  const taskId = await finishedTask("dl-one", ["a,b\n1,2\n"], { mode: "ok" });
  const res = await get(`/api/analysis-tasks/${taskId}/download`);
  assert.equal(res.statusCode, 200);
  assert.equal(res.headers["content-type"], "application/json");
  assert.match(String(res.headers["content-disposition"]), /^attachment; filename="out.json"/);
  assert.equal(res.headers["x-content-type-options"], "nosniff");
  assert.deepEqual(res.json(), { input: 8 });
});

test("a many-file task streams a zip with a folder per input file (repeated names made unique)", async () => {
  const taskId = await finishedTask("dl-many", ["a\n1\n", "bb\n22\n", "ccc\n333\n"], { mode: "ok" });
  const res = await get(`/api/analysis-tasks/${taskId}/download`);
  assert.equal(res.statusCode, 200);
  assert.equal(res.headers["content-type"], "application/zip");
  assert.match(String(res.headers["content-disposition"]), new RegExp(`filename="task-${taskId}.zip"`));
  const zipPath = path.join(env.dataDir, "t.zip");
  fs.writeFileSync(zipPath, res.rawPayload);
  const listing = execFileSync("python3", [
    "-c",
    "import json,sys,zipfile; z=zipfile.ZipFile(sys.argv[1]); print(json.dumps({n: z.read(n).decode() for n in z.namelist()}))",
    zipPath,
  ]).toString();
  const entries = JSON.parse(listing) as Record<string, string>;
  const runs = await env.db
    .sql`select r.id::text as id from runs r where r.task_id = ${taskId} order by r.id`;
  assert.deepEqual(Object.keys(entries).sort(), [
    "other.csv/out.json",
    "results.csv",
    `same.csv (run ${runs[0]?.id})/out.json`,
    `same.csv (run ${runs[1]?.id})/out.json`,
  ]);
  assert.deepEqual(JSON.parse(entries["other.csv/out.json"] as string), { input: 8 });
});

test("not finished, or nothing succeeded → 409 ANALYSIS_TASK_NOT_READY", async () => {
  const file = await env.file("x\n1\n");
  const queued = await env.task("dl-queued", [file], { mode: "ok" });
  const res = await get(`/api/analysis-tasks/${queued}/download`);
  assert.equal(res.statusCode, 409);
  assert.deepEqual(res.json(), {
    code: "ANALYSIS_TASK_NOT_READY",
    message: "The analysis task has no output to download yet.",
  });
  const failed = await finishedTask("dl-failed", ["y\n1\n"], { mode: "exit", code: 3 });
  assert.equal((await get(`/api/analysis-tasks/${failed}/download`)).statusCode, 409);
  const [run] = await env.db.sql`select id::text from runs where task_id = ${failed}`;
  assert.equal((await get(`/api/analysis-tasks/${failed}/runs/${run?.id}/download`)).statusCode, 409);
});

test("one run's output; foreign owner, another task's run and path tricks are 404", async () => {
  const taskId = await finishedTask("dl-run", ["p\n1\n", "q\n2\n"], { mode: "ok" });
  const other = await finishedTask("dl-other", ["r\n1\n"], { mode: "ok" });
  const [run] = await env.db
    .sql`select r.id::text as id from runs r where r.task_id = ${taskId} order by r.id limit 1`;
  const ok = await get(`/api/analysis-tasks/${taskId}/runs/${run?.id}/download`);
  assert.equal(ok.statusCode, 200);
  assert.equal(ok.headers["content-type"], "application/json");
  assert.equal((await get(`/api/analysis-tasks/${taskId}/download`, stranger)).statusCode, 404);
  assert.equal(
    (await get(`/api/analysis-tasks/${taskId}/runs/${run?.id}/download`, stranger)).statusCode,
    404,
  );
  assert.equal((await get(`/api/analysis-tasks/${other}/runs/${run?.id}/download`)).statusCode, 404);
  for (const url of [
    `/api/analysis-tasks/..%2F..%2Fetc/download`,
    `/api/analysis-tasks/${taskId}%2F..%2F${other}/download`,
    `/api/analysis-tasks/${taskId}/runs/..%2F..%2Fpasswd/download`,
    `/api/analysis-tasks/-1/download`,
    `/api/analysis-tasks/${"9".repeat(30)}/download`,
  ]) {
    const res = await get(url);
    assert.equal(res.statusCode, 404, url);
  }
});

test("a run whose recorded output cannot be served is a 500, never a zip that leaves it out", async () => {
  const taskId = await finishedTask("dl-unusable", ["a\n1\n", "b\n2\n"], { mode: "ok" });
  const [run] = await env.db.sql<{ id: string }[]>`
    select r.id::text as id from runs r where r.task_id = ${taskId} order by r.id limit 1`;
  await env.db.sql`update runs set output_key = '../../etc' where id = ${run?.id as string}`;
  const zip = await get(`/api/analysis-tasks/${taskId}/download`);
  assert.equal(zip.statusCode, 500);
  assert.equal(zip.json().code, "INTERNAL_ERROR");
  const one = await get(`/api/analysis-tasks/${taskId}/runs/${run?.id}/download`);
  assert.equal(one.statusCode, 500);
});

test("retention deleting the task between the plan and the read → 404, not a logged 500", async () => {
  // The store under a second app: before the read, "retention" commits (task row and its objects go).
  const local = new LocalStore(fs.mkdtempSync(path.join(os.tmpdir(), "assay-dl-race-")));
  let race: (() => Promise<void>) | undefined;
  const store = new Proxy(local, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if ((prop !== "open" && prop !== "list") || typeof value !== "function") return value;
      return async (...args: unknown[]) => {
        const before = race;
        race = undefined;
        await before?.();
        return value.apply(target, args);
      };
    },
  });
  const raced = await runnerEnv({ store });
  try {
    const logs: Record<string, unknown>[] = [];
    const racedApp = await raced.app(logs);
    const user = (await tokenCreate(raced.db.sql, "racer")).token;
    const w = raced.worker([fixtureProgram("dl-race")]);
    await w.start();
    const one = await raced.task("dl-race", [await raced.file("a\n1\n")], { mode: "ok" });
    const many = await raced.task("dl-race", [await raced.file("a\n1\n"), await raced.file("b\n2\n")], {
      mode: "ok",
    });
    await waitForTerminal(raced.db.sql, one);
    await waitForTerminal(raced.db.sql, many);
    await w.stop();
    await raced.db.sql`update tasks set owner_id = (select id from users where name = 'racer')`;
    for (const taskId of [one, many]) {
      race = async () => {
        await raced.db.sql`delete from tasks where id = ${taskId}`;
        await local.deletePrefix(taskOutputsPrefix(taskId));
      };
      const before = logs.length;
      const res = await racedApp.inject({
        url: `/api/analysis-tasks/${taskId}/download`,
        headers: bearer(user),
      });
      assert.equal(res.statusCode, 404, `task ${taskId}: ${res.body}`);
      assert.equal(res.json().code, "ANALYSIS_TASK_NOT_FOUND");
      assert.equal(race, undefined, "the race ran");
      assert.ok(!logs.slice(before).some((l) => (l.level as number) >= 50), "nothing logged as an error");
    }
  } finally {
    await raced.close();
  }
});
