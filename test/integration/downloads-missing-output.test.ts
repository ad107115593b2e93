// A recorded output missing from the store (a restore from an older backup, an object deleted by hand):
// every route that serves it answers the same 500 ANALYSIS_OUTPUT_MISSING before any byte, logged at
// error level with the run and its output key; a zip that meets one after its first byte is broken off,
// logged with the task, the run and the key. No program runs: the runs are made succeeded in SQL and
// their outputs stored as a worker would have.
import assert from "node:assert/strict";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { LocalStore } from "../../src/storage/local.ts";
import { ObjectMissingError, type ObjectStore } from "../../src/storage/store.ts";
import { bearer } from "../helpers/app.ts";
import { type RunnerEnv, runnerEnv } from "../helpers/runner.ts";
import { createTestBucket } from "../helpers/s3.ts";
import { scratchDir } from "../helpers/tmp.ts";

const MISSING = {
  code: "ANALYSIS_OUTPUT_MISSING",
  message: "This run's output is missing from the store; an administrator must restore it.",
};

/** Keys whose open() fails as if the object had been deleted after the zip's listing. */
const goneOnOpen = new Set<string>();
let env: RunnerEnv;
let app: FastifyInstance;
const logs: Record<string, unknown>[] = [];
let token: string;

before(async () => {
  const local = new LocalStore(scratchDir("assay-dl-missing-"));
  const store = new Proxy(local, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (prop !== "open" || typeof value !== "function") return value;
      return (key: string, ...rest: unknown[]) => {
        if (goneOnOpen.has(key)) return Promise.reject(new ObjectMissingError(key));
        return value.apply(target, [key, ...rest]);
      };
    },
  }) as ObjectStore;
  env = await runnerEnv({ store });
  app = await env.app(logs);
  // The user env.task() creates its tasks for.
  token = (await tokenCreate(env.db.sql, "runner")).token;
});
after(() => env.close());

/**
 * A finished task of `n` succeeded runs in `on` (the file's own environment by default), each with its
 * result.json stored under its output key.
 */
async function succeededTask(
  n: number,
  on: RunnerEnv = env,
): Promise<{ taskId: string; runs: { id: string; key: string }[] }> {
  const { sql } = on.db;
  const files: string[] = [];
  for (let i = 0; i < n; i++) files.push(await on.file(`a\n${i}\n`));
  const taskId = await on.task("dl-missing", files, {});
  await sql`update runs set status = 'starting' where task_id = ${taskId}`;
  const runs = await sql<{ id: string; key: string }[]>`
    update runs set status = 'succeeded', output_key = task_id::text || '/' || id::text || '.1.ab',
      result = jsonb_build_object('outputFileName', 'result.json',
                                  'files', jsonb_build_array(jsonb_build_object('name', 'result.json', 'size', 12)))
    where task_id = ${taskId} returning id::text, output_key as key`;
  await sql`update tasks set status = 'succeeded', succeeded_count = total_count where id = ${taskId}`;
  runs.sort((a, b) => Number(a.id) - Number(b.id));
  for (const r of runs)
    await on.storage.put(`outputs/${r.key}/result.json`, Readable.from([Buffer.from(`{"run":"ok"}`)]));
  return { taskId, runs };
}

const get = (url: string) => app.inject({ url, headers: bearer(token) });
const post = (url: string) => app.inject({ method: "POST", url, headers: bearer(token) });

/** The error lines logged since `from` that name `runId`. */
const loggedFor = (from: number, runId: string) =>
  logs.slice(from).filter((l) => (l.level as number) >= 50 && l.runId === runId);

test("every route serving a lost output answers 500 ANALYSIS_OUTPUT_MISSING, logged with the run and its key", async () => {
  const one = await succeededTask(1);
  const many = await succeededTask(2);
  const lost = [one.runs[0], many.runs[0]] as { id: string; key: string }[];
  for (const r of lost) await env.storage.delete([`outputs/${r.key}/result.json`]);
  const [single, first] = lost as [{ id: string; key: string }, { id: string; key: string }];

  // A link to one output is refused as it is made (the dashboard's buttons send the browser to a link,
  // which cannot show the message); a zip's link is refused when it is used.
  const link = async (url: string) => {
    const res = await post(url);
    assert.equal(res.statusCode, 200, `${url}: ${res.body}`);
    return res.json().data.url as string;
  };
  const viaLink = (url: string) => async () => app.inject({ url: await link(url) });
  const cases: [string, string, () => Promise<{ statusCode: number; json(): unknown; headers: object }>][] = [
    ["a one-file task's download", single.id, () => get(`/api/analysis-tasks/${one.taskId}/download`)],
    [
      "a run's download",
      single.id,
      () => get(`/api/analysis-tasks/${one.taskId}/runs/${single.id}/download`),
    ],
    ["a zip whose first page has it", first.id, () => get(`/api/analysis-tasks/${many.taskId}/download`)],
    [
      "the output itself",
      first.id,
      () => get(`/api/analysis-tasks/${many.taskId}/runs/${first.id}/outputs/result.json`),
    ],
    [
      "a resumed output (If-None-Match asks the store for its size first)",
      first.id,
      () =>
        app.inject({
          url: `/api/analysis-tasks/${many.taskId}/runs/${first.id}/outputs/result.json`,
          headers: { ...bearer(token), "if-none-match": '"x"' },
        }),
    ],
    [
      "a view link",
      first.id,
      () => post(`/api/analysis-tasks/${many.taskId}/runs/${first.id}/outputs/result.json/link`),
    ],
    [
      "a download link to a one-file task",
      single.id,
      () => post(`/api/analysis-tasks/${one.taskId}/download/link`),
    ],
    ["a download link to a zip", first.id, viaLink(`/api/analysis-tasks/${many.taskId}/download/link`)],
    [
      "a download link to a run",
      single.id,
      () => post(`/api/analysis-tasks/${one.taskId}/runs/${single.id}/download/link`),
    ],
    [
      "a download link to an output",
      first.id,
      () => post(`/api/analysis-tasks/${many.taskId}/runs/${first.id}/outputs/result.json/download-link`),
    ],
  ];
  for (const [what, runId, request] of cases) {
    const from = logs.length;
    const res = await request();
    assert.equal(res.statusCode, 500, what);
    assert.deepEqual(res.json(), MISSING, what);
    assert.ok(!("content-disposition" in res.headers), `${what}: no file was begun`);
    const lines = loggedFor(from, runId);
    assert.ok(
      lines.some((l) => l.msg === "a succeeded run's output is missing" && typeof l.outputKey === "string"),
      `${what}: logged at error level with the run and its key`,
    );
  }
  // The other run of the zip is served as ever.
  const other = many.runs[1] as { id: string };
  const ok = await get(`/api/analysis-tasks/${many.taskId}/runs/${other.id}/download`);
  assert.equal(ok.statusCode, 200, ok.body);
});

test("a run from before its files were recorded: its lost result file is missing too, not a 404", async () => {
  const { taskId, runs } = await succeededTask(1);
  const run = runs[0] as { id: string; key: string };
  await env.db.sql`update runs set result = result - 'files' where id = ${run.id}`;
  const url = `/api/analysis-tasks/${taskId}/runs/${run.id}/outputs/result.json`;
  const served = await get(url);
  assert.equal(served.statusCode, 200, served.body);
  await env.storage.delete([`outputs/${run.key}/result.json`]);
  for (const res of [await get(url), await post(`${url}/link`), await post(`${url}/download-link`)]) {
    assert.equal(res.statusCode, 500, res.body);
    assert.deepEqual(res.json(), MISSING);
  }
  // Another name of such a run is still looked for in the store's listing.
  assert.equal((await get(url.replace("result.json", "other.json"))).statusCode, 404);
});

test("a run row that names no servable output stays a bug's 500 INTERNAL_ERROR", async () => {
  const { taskId, runs } = await succeededTask(1);
  const run = runs[0] as { id: string };
  await env.db.sql`update runs set output_key = '../../etc' where id = ${run.id}`;
  const from = logs.length;
  const res = await get(`/api/analysis-tasks/${taskId}/runs/${run.id}/download`);
  assert.equal(res.statusCode, 500);
  assert.deepEqual(res.json(), { code: "INTERNAL_ERROR", message: "An internal error occurred." });
  assert.ok(loggedFor(from, run.id).length > 0, "logged at error level with the run");
});

test("an output gone once the zip has begun breaks it off, logged with the task, the run and the key", async () => {
  const { taskId, runs } = await succeededTask(2);
  const late = runs[1] as { id: string; key: string };
  goneOnOpen.add(`outputs/${late.key}/result.json`);
  try {
    const from = logs.length;
    await assert.rejects(get(`/api/analysis-tasks/${taskId}/download`), /destroyed before completion/);
    const line = logs
      .slice(from)
      .find((l) => l.msg === "zip download broken off: an output could not be read");
    assert.ok(line, "logged");
    assert.equal(line.level, 50);
    assert.equal(line.taskId, taskId);
    assert.equal(line.runId, late.id);
    assert.equal(line.outputKey, late.key);
    assert.equal(line.file, "result.json");
  } finally {
    goneOnOpen.clear();
  }
});

test("a bucket that is gone: a link to one file is the store's failure (503 NOT_READY, as /readyz says), not a lost output", async () => {
  // S3 answers a HEAD in a missing bucket with a bare 404, as for a missing object.
  const bucket = await createTestBucket();
  let dropped = false;
  const s3env = await runnerEnv({ store: bucket.store() });
  try {
    const s3logs: Record<string, unknown>[] = [];
    const s3app = await s3env.app(s3logs);
    const s3token = (await tokenCreate(s3env.db.sql, "runner")).token;
    const {
      taskId,
      runs: [run],
    } = await succeededTask(1, s3env);
    const url = `/api/analysis-tasks/${taskId}/runs/${run?.id}/download/link`;
    const made = await s3app.inject({ method: "POST", url, headers: bearer(s3token) });
    assert.equal(made.statusCode, 200, made.body);
    await bucket.drop();
    dropped = true;
    const res = await s3app.inject({ method: "POST", url, headers: bearer(s3token) });
    // The store fails its check too: it cannot be used (a 500 INTERNAL_ERROR until 2026-12-07).
    assert.equal(res.statusCode, 503, res.body);
    assert.equal(res.json().code, "NOT_READY");
    assert.equal(res.headers["retry-after"], "2");
    assert.ok(
      !s3logs.some((l) => l.msg === "a succeeded run's output is missing"),
      "not logged as a lost output",
    );
  } finally {
    await s3env.close();
    if (!dropped) await bucket.drop();
  }
});
