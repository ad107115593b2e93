import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { folderNames } from "../../src/client/download.ts";
import { LocalStore } from "../../src/storage/local.ts";
import { taskOutputsPrefix } from "../../src/storage/store.ts";
import { ZIP_PAGE } from "../../src/tasks/outputs.ts";
import { bearer } from "../helpers/app.ts";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv, writeProgram } from "../helpers/runner.ts";
import { scratchDir } from "../helpers/tmp.ts";
import { zipNames, zipRead } from "../helpers/zip.ts";

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

test("a zip whose run lost a recorded output other than its main one is a 500, never a zip without it", async () => {
  // python-stats' shape: the main output and a table beside it, both recorded by the run.
  const type = "dl-two-outputs";
  const program = writeProgram(
    env.dataDir,
    type,
    `fs.writeFileSync(path.join(out, "stats.json"), "{}");
fs.writeFileSync(path.join(out, "stats.csv"), "a,b\\r\\n1,2\\r\\n");
say({ type: "result", outputFileName: "stats.json", metrics: { rows: 1 } });`,
  );
  const files = [await env.file("a\n1\n"), await env.file("b\n2\n")];
  const taskId = await env.task(type, files, {});
  const w = env.worker([{ type, executable: process.execPath, ...program }]);
  await w.start();
  await waitForTerminal(env.db.sql, taskId);
  await w.stop();
  const runs = await env.db.sql<{ id: string; key: string; files: { name: string }[] }[]>`
    select id::text, output_key as key, result -> 'files' as files
    from runs where task_id = ${taskId} and status = 'succeeded' order by runs.id`;
  assert.equal(runs.length, 2);
  const [run] = runs;
  assert.deepEqual(
    run?.files.map((f) => f.name),
    ["stats.csv", "stats.json"],
  );
  const whole = await get(`/api/analysis-tasks/${taskId}/download`);
  assert.equal(whole.statusCode, 200);
  assert.equal(zipNames(whole.rawPayload).filter((n) => n.endsWith("/stats.csv")).length, 2);

  await env.storage.delete([`outputs/${run?.key}/stats.csv`]);
  const logs: Record<string, unknown>[] = [];
  const logged = await env.app(logs);
  const res = await logged.inject({ url: `/api/analysis-tasks/${taskId}/download`, headers: bearer(token) });
  assert.equal(res.statusCode, 500, "not a zip that leaves stats.csv out");
  assert.equal(res.json().code, "ANALYSIS_OUTPUT_MISSING");
  assert.ok(
    logs.some(
      (l) => l.msg === "a succeeded run's output is missing" && l.runId === run?.id && l.file === "stats.csv",
    ),
    "the log names the file that is missing",
  );
  // As the run's own outputs say: the file is listed, and fetching it is the same 500.
  const one = await get(`/api/analysis-tasks/${taskId}/runs/${run?.id}/outputs/stats.csv`);
  assert.equal(one.statusCode, 500);
  assert.equal(one.json().code, "ANALYSIS_OUTPUT_MISSING");
});

test("retention deleting the task between the plan and the read → 404, not a logged 500", async () => {
  // The store under a second app: before the read, "retention" commits (task row and its objects go).
  const local = new LocalStore(scratchDir("assay-dl-race-"));
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

/**
 * A finished task of `n` succeeded runs without running anything: each run's result.json stored as a
 * worker would have. The runs' ids are made to cross 99,999,999,999 → 100,000,000,000 (test databases
 * start ids at 10^10), where the order of their text (their output keys') is not that of their numbers.
 */
async function succeededTask(n: number): Promise<{ taskId: string; runIds: string[] }> {
  const { sql } = env.db;
  await sql`select setval(pg_get_serial_sequence('runs', 'id'),
                          greatest(99999999999 - ${Math.floor(n / 2)}, (select coalesce(max(id), 1) from runs)))`;
  const files = await sql<{ id: string }[]>`
    with next as (select nextval(pg_get_serial_sequence('files', 'id')) as id from generate_series(1, ${n}))
    insert into files (id, owner_id, name, content_type, size_bytes, sha256, storage_key)
    select id, ${env.owner.userId}, 'f-' || id || '.csv', 'text/csv', 1, repeat('0', 64), 'files/' || id from next
    returning id::text`;
  const taskId = await env.task(
    "dl-paged",
    files.map((f) => f.id),
    {},
  );
  const runs = await sql<{ id: string }[]>`
    update runs set status = 'starting' where task_id = ${taskId} returning id::text`;
  await sql`
    update runs set status = 'succeeded', output_key = task_id::text || '/' || id::text || '.1.ab',
      result = jsonb_build_object('outputFileName', 'result.json',
                                  'files', jsonb_build_array(jsonb_build_object('name', 'result.json', 'size', 1)))
    where task_id = ${taskId}`;
  await sql`update tasks set status = 'succeeded', succeeded_count = total_count where id = ${taskId}`;
  const runIds = runs.map((r) => r.id).sort((a, b) => Number(a) - Number(b));
  for (const id of runIds) {
    await env.storage.put(
      `outputs/${taskId}/${id}.1.ab/result.json`,
      Readable.from([Buffer.from(`{"run":${id}}`)]),
    );
  }
  return { taskId, runIds };
}

/** Every entry of a zip with its content as text, read by Python's zipfile in one go. */
function zipContents(zip: Buffer): Map<string, string> {
  const zipPath = path.join(env.dataDir, `contents-${process.hrtime.bigint()}.zip`);
  fs.writeFileSync(zipPath, zip);
  try {
    const out = execFileSync(
      "python3",
      [
        "-c",
        "import json,sys,zipfile; z=zipfile.ZipFile(sys.argv[1]); print(json.dumps([[n, z.read(n).decode()] for n in z.namelist()]))",
        zipPath,
      ],
      { maxBuffer: 64 << 20 },
    );
    return new Map(JSON.parse(out.toString()) as [string, string][]);
  } finally {
    fs.rmSync(zipPath, { force: true });
  }
}

/** A name as macOS and Windows compare it when a zip is extracted. */
const onDisk = (name: string) => name.normalize("NFC").toLowerCase();

/** Whether Windows can create a folder so named: no reserved character, trailing dot or space, or device name. */
const windowsSafe = (name: string) =>
  // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what it looks for
  !/[\u0000-\u001f\u007f<>:"|?*/\\]|[. ]$/.test(name) &&
  !/^(con|prn|aux|nul|com[1-9]|lpt[1-9]) *(\.|$)/i.test(name);

test("a zip of more runs than a page: every run once, names unique across pages, ids past a power of ten", {
  timeout: 120_000,
}, async () => {
  const n = ZIP_PAGE + 250;
  const { taskId, runIds } = await succeededTask(n);
  assert.ok(
    runIds.some((id) => id.length === 11) && runIds.some((id) => id.length === 12),
    `${runIds[0]}…${runIds.at(-1)}`,
  );
  // One input name on the first page and the last (pages go by the text of the run ids), and one
  // input named like the results table.
  const byKey = [...runIds].sort();
  const first = byKey[0] as string;
  const last = byKey.at(-1) as string;
  const results = byKey[5] as string;
  const at = (i: number) => byKey.at(i) as string;
  // Names that are distinct as text but one folder once sanitised (a leading dot, a character Windows
  // refuses or a trailing dot becomes `_`), once extracted on macOS or Windows (case, Unicode
  // normalisation), or beside the root results.csv; a Windows device name; and an input named like
  // another run's made-unique folder. Spread over both pages.
  const hostile: [id: string, input: string, folder: string][] = [
    [at(1), ".d.csv", `_d.csv (run ${at(1)})`],
    [at(ZIP_PAGE + 10), "_d.csv", `_d.csv (run ${at(ZIP_PAGE + 10)})`],
    [at(2), "D.csv", `D.csv (run ${at(2)})`],
    [at(-2), "d.csv", `d.csv (run ${at(-2)})`],
    [at(3), "Results.csv", `Results.csv (run ${at(3)})`],
    [at(4), "...", `_ (run ${at(4)})`],
    [at(6), "_", `_ (run ${at(6)})`],
    [at(7), "Ä.csv", `Ä.csv (run ${at(7)})`],
    [at(ZIP_PAGE + 20), "ä.csv", `ä.csv (run ${at(ZIP_PAGE + 20)})`],
    [at(8), "\u00e9t\u00e9.csv", `\u00e9t\u00e9.csv (run ${at(8)})`],
    [at(ZIP_PAGE + 30), "e\u0301te\u0301.csv", `e\u0301te\u0301.csv (run ${at(ZIP_PAGE + 30)})`],
    [at(9), `same.csv (run ${last})`, `same.csv (run ${last}) (run ${at(9)})`],
    [at(10), "ünïcødé — 数据 (run).csv", "ünïcødé — 数据 (run).csv"],
    [at(11), "a:b.csv", `a_b.csv (run ${at(11)})`],
    [at(ZIP_PAGE + 40), "a_b.csv", `a_b.csv (run ${at(ZIP_PAGE + 40)})`],
    [at(12), "x.", `x_ (run ${at(12)})`],
    [at(ZIP_PAGE + 50), "x_", `x_ (run ${at(ZIP_PAGE + 50)})`],
    [at(13), "CON.csv", "_CON.csv"],
    [at(14), "nul", "_nul"],
    [at(15), 'q<>"|?*.csv', "q______.csv"],
  ];
  await env.db.sql`update runs set input_name = 'same.csv' where id in (${first}, ${last})`;
  await env.db.sql`update runs set input_name = 'results.csv' where id = ${results}`;
  for (const [id, input] of hostile) await env.db.sql`update runs set input_name = ${input} where id = ${id}`;
  const res = await get(`/api/analysis-tasks/${taskId}/download`);
  assert.equal(res.statusCode, 200);
  const names = zipNames(res.rawPayload);
  assert.equal(names.length, n + 1);
  assert.equal(names[0], "results.csv");
  const inputs = new Map(
    (
      await env.db.sql<{ id: string; name: string }[]>`
        select id::text, input_name as name from runs where task_id = ${taskId}`
    ).map((r) => [r.id, r.name]),
  );
  const hostileFolders = new Map(hostile.map(([id, , folder]) => [id, folder]));
  const folder = (id: string) =>
    id === first || id === last
      ? `same.csv (run ${id})`
      : id === results
        ? `results.csv (run ${id})`
        : (hostileFolders.get(id) ?? (inputs.get(id) as string));
  // Every run once, in the order of their output keys (the text of their ids).
  assert.deepEqual(
    names.slice(1),
    byKey.map((id) => `${folder(id)}/result.json`),
  );
  // Extracted where case and normalisation do not count, no entry overwrites another, no folder is
  // the results table, and every run's own output is in its folder.
  assert.equal(new Set(names.map(onDisk)).size, names.length);
  const folders = names.slice(1).map((e) => e.slice(0, e.lastIndexOf("/")));
  assert.equal(new Set(folders.map(onDisk)).size, n);
  assert.ok(!folders.some((f) => onDisk(f) === "results.csv"));
  assert.deepEqual(
    folders.filter((f) => !windowsSafe(f)),
    [],
    "every folder can be extracted on Windows",
  );
  // `assay download` names the same folders from the runs' file names (client/download.ts).
  const cli = folderNames([...inputs].map(([runId, fileName]) => ({ runId, fileName })));
  assert.deepEqual(
    runIds.filter((id) => cli.get(id) !== folder(id)),
    [],
    "a run's folder in a download is its folder in the zip",
  );
  const contents = zipContents(res.rawPayload);
  for (const id of runIds) assert.equal(contents.get(`${folder(id)}/result.json`), `{"run":${id}}`, id);
  assert.equal(zipRead(res.rawPayload, `same.csv (run ${last})/result.json`).toString(), `{"run":${last}}`);
});

test("an output missing from a later page breaks the zip off (logged); from the first page it is a 500", {
  timeout: 120_000,
}, async () => {
  const { taskId, runIds } = await succeededTask(ZIP_PAGE + 10);
  const byKey = [...runIds].sort();
  const logs: Record<string, unknown>[] = [];
  const logged = await env.app(logs);
  const fetch = () =>
    logged.inject({ url: `/api/analysis-tasks/${taskId}/download`, headers: bearer(token) });
  const late = byKey[ZIP_PAGE + 5] as string;
  await env.storage.delete([`outputs/${taskId}/${late}.1.ab/result.json`]);
  // The response is broken off: the client sees a failed transfer, not a zip without the output.
  await assert.rejects(fetch(), /destroyed before completion/);
  // Logged with what an operator needs to restore it: the task, the run, its output key and the file.
  assert.ok(
    logs.some(
      (l) =>
        l.msg === "zip download broken off: an output could not be read" &&
        l.level === 50 &&
        l.taskId === taskId &&
        l.runId === late &&
        l.outputKey === `${taskId}/${late}.1.ab` &&
        l.file === "result.json",
    ),
  );
  const early = byKey[3] as string;
  await env.storage.delete([`outputs/${taskId}/${early}.1.ab/result.json`]);
  const refused = await fetch();
  assert.equal(refused.statusCode, 500);
  assert.equal(refused.json().code, "ANALYSIS_OUTPUT_MISSING");
  assert.ok(logs.some((l) => l.msg === "a succeeded run's output is missing" && l.runId === early));
});

test("a client that leaves while an output's read is stalled releases that read at once", {
  timeout: 60_000,
}, async () => {
  // An object body that sends a little and then nothing (an S3 response on a half-dead connection).
  const local = new LocalStore(scratchDir("assay-dl-stall-"));
  let stalled: Readable | undefined;
  let opened: () => void = () => {};
  const stalledOpened = new Promise<void>((resolve) => {
    opened = resolve;
  });
  const store = new Proxy(local, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (prop !== "open" || typeof value !== "function") return value;
      return async (key: string) => {
        const real = await value.call(target, key);
        if (stalled || !key.startsWith("outputs/")) return real;
        real.stream.destroy();
        stalled = new Readable({ read() {} });
        stalled.push(Buffer.alloc(1000, 1));
        opened();
        return { ...real, stream: stalled };
      };
    },
  });
  const stalling = await runnerEnv({ store });
  try {
    const stallApp = await stalling.app();
    const user = (await tokenCreate(stalling.db.sql, "staller")).token;
    const w = stalling.worker([fixtureProgram("dl-stall")]);
    await w.start();
    const taskId = await stalling.task(
      "dl-stall",
      [await stalling.file("a\n1\n"), await stalling.file("b\n2\n")],
      { mode: "ok" },
    );
    await waitForTerminal(stalling.db.sql, taskId);
    await w.stop();
    await stalling.db.sql`update tasks set owner_id = (select id from users where name = 'staller')`;
    await stallApp.listen({ port: 0, host: "127.0.0.1" });
    const { port } = stallApp.server.address() as AddressInfo;
    const req = http.get({
      host: "127.0.0.1",
      port,
      path: `/api/analysis-tasks/${taskId}/download`,
      headers: bearer(user),
    });
    const [res] = (await once(req, "response")) as [http.IncomingMessage];
    assert.equal(res.statusCode, 200);
    res.resume();
    await stalledOpened;
    const body = stalled as Readable;
    assert.equal(body.destroyed, false);
    req.destroy(); // the client leaves mid-entry
    const released = await Promise.race([
      once(body, "close").then(() => true),
      new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 5000).unref()),
    ]);
    assert.ok(released, "the stalled read was released when the client left");
  } finally {
    await stalling.close();
  }
});

test("HEAD on an output, a view link, a zip or results.csv is 405 and reads nothing from the store", async () => {
  const local = new LocalStore(scratchDir("assay-dl-head-"));
  const opened: string[] = [];
  const store = new Proxy(local, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (prop !== "open" || typeof value !== "function") return value;
      return async (key: string) => {
        opened.push(key);
        return value.call(target, key);
      };
    },
  });
  const heads = await runnerEnv({ store });
  try {
    const logs: Record<string, unknown>[] = [];
    const headApp = await heads.app(logs);
    const user = (await tokenCreate(heads.db.sql, "héad-user")).token;
    const w = heads.worker([fixtureProgram("dl-head")]);
    await w.start();
    const one = await heads.task("dl-head", [await heads.file("a\n1\n")], { mode: "ok" });
    const many = await heads.task("dl-head", [await heads.file("a\n1\n"), await heads.file("b\n22\n")], {
      mode: "ok",
    });
    await waitForTerminal(heads.db.sql, one);
    await waitForTerminal(heads.db.sql, many);
    await w.stop();
    await heads.db.sql`update tasks set owner_id = (select id from users where name = 'héad-user')`;
    const [run] = await heads.db.sql<{ id: string }[]>`
      select r.id::text as id from runs r where r.task_id = ${many} order by r.id limit 1`;
    const runUrl = `/api/analysis-tasks/${many}/runs/${run?.id}`;
    const link = await headApp.inject({
      method: "POST",
      url: `${runUrl}/outputs/out.json/link`,
      headers: bearer(user),
    });
    assert.equal(link.statusCode, 200, link.body);
    const urls = [
      `/api/analysis-tasks/${one}/download`,
      `/api/analysis-tasks/${many}/download`,
      `/api/analysis-tasks/${many}/results.csv`,
      `${runUrl}/download`,
      `${runUrl}/outputs/out.json`,
      link.json().data.url as string,
    ];
    const answers = [];
    for (const url of urls)
      answers.push(await headApp.inject({ method: "HEAD", url, headers: bearer(user) }));
    // A GET handler opens its object before it answers (inject resolves after the answer): none did.
    assert.deepEqual(opened, []);
    assert.deepEqual(
      logs.filter((l) => (l.level as number) >= 40),
      [],
    );
    // A view link is a capability: not in the log for a HEAD either.
    const linkPath = (link.json().data.url as string).split("/")[2] as string;
    assert.ok(!JSON.stringify(logs).includes(linkPath), "the view link stays out of the log");
    for (const [i, res] of answers.entries()) {
      assert.equal(res.statusCode, 405, urls[i]);
      assert.equal(res.headers.allow, "GET", urls[i]);
      assert.equal(res.rawPayload.length, 0, urls[i]);
    }
    // GET still serves, and opens what it serves (the wrapper sees it).
    for (const url of urls) {
      const res = await headApp.inject({ url, headers: bearer(user) });
      assert.equal(res.statusCode, 200, url);
    }
    assert.ok(opened.length >= urls.length - 1, opened.join(" "));
  } finally {
    await heads.close();
  }
});

test("a task's zip is the same bytes whenever it is downloaded: every entry dated at the task's end", async () => {
  const taskId = await finishedTask("dl-same", ["a\n1\n", "bb\n22\n"], { mode: "ok" });
  // An end long ago: an entry dated when the zip was made would differ from it (and between two
  // downloads a DOS time's two seconds apart: a link's and the route's zips differed by that).
  const ended = new Date("2026-03-04T05:06:08.000Z");
  await env.db.sql`update tasks set finished_at = ${ended} where id = ${taskId}`;
  const first = (await get(`/api/analysis-tasks/${taskId}/download`)).rawPayload;
  const dates = JSON.parse(
    execFileSync("python3", [
      "-c",
      "import json,sys,zipfile; print(json.dumps([list(i.date_time) for i in zipfile.ZipFile(sys.argv[1]).infolist()]))",
      (() => {
        const file = path.join(env.dataDir, "same.zip");
        fs.writeFileSync(file, first);
        return file;
      })(),
    ]).toString(),
  ) as number[][];
  // DOS times are local times of the server's zone, to the even second.
  const local = [
    ended.getFullYear(),
    ended.getMonth() + 1,
    ended.getDate(),
    ended.getHours(),
    ended.getMinutes(),
    ended.getSeconds() - (ended.getSeconds() % 2),
  ];
  assert.ok(dates.length >= 3, JSON.stringify(dates));
  for (const d of dates) assert.deepEqual(d, local);
  // Past the next even second: a zip dated when it is made would differ now.
  const made = Date.now();
  await waitFor(
    async () => Math.floor(Date.now() / 2000) > Math.floor(made / 2000),
    5_000,
    "the next even second",
  );
  const again = (await get(`/api/analysis-tasks/${taskId}/download`)).rawPayload;
  assert.ok(first.equals(again), "the same bytes");
});
