// Download links: POST …/link makes a short-lived URL under /view/download/ that saves a task's
// download, its results.csv, a run's download or one output of a run, without a token — what the
// dashboard's download buttons navigate to, so the browser streams the file to disk. Real programs
// (the behave fixture), a real worker, the local store, a real PostgreSQL.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate, tokenRevoke } from "../../src/auth/tokens.ts";
import {
  DOWNLOAD_LINK_TTL_SECONDS,
  type DownloadTarget,
  downloadLinkCheck,
  downloadLinkPath,
} from "../../src/auth/view-links.ts";
import { bearer } from "../helpers/app.ts";
import { waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";
import { zipNames } from "../helpers/zip.ts";

let env: RunnerEnv;
let app: FastifyInstance;
const logs: Record<string, unknown>[] = [];
let token: string;
let tokenId: number;
let stranger: string;
/** A task of two inputs (a zip): one run succeeded, one failed. */
let manyTask: string;
let okRun: string;
let failedRun: string;
/** A task of one input: its download is the one file. */
let oneTask: string;

const FILES: Record<string, string> = {
  "out.json": '{"rows":3,"name":"données"}',
  "report.html": "<!doctype html><h1>Rapport ✓</h1><script>alert(1)</script>",
  "data.csv": `a,b\n${"1,2\n".repeat(5000)}`,
};

async function finishedTask(inputs: string[]): Promise<string> {
  const ids: string[] = [];
  for (const c of inputs) ids.push(await env.file(c));
  // Names as users give them: non-ASCII, quotes, markup.
  await env.db.sql`update files set name = 'données "α" <b>.csv' where id = ${ids[0] as string}`;
  const taskId = await env.task("outputs", ids, { mode: "input" });
  const w = env.worker([fixtureProgram("outputs")]);
  await w.start();
  await waitForTerminal(env.db.sql, taskId);
  await w.stop();
  return taskId;
}

before(async () => {
  env = await runnerEnv();
  app = await env.app(logs);
  const made = await tokenCreate(env.db.sql, "runner");
  token = made.token;
  tokenId = made.tokenId;
  stranger = (await tokenCreate(env.db.sql, "stranger")).token;
  const good = JSON.stringify({ files: FILES, result: "out.json", metrics: { rows: 3 } });
  const bad = JSON.stringify({ files: { "partial.json": "{}" }, exit: 3 });
  manyTask = await finishedTask([good, bad]);
  const runs = await env.db.sql<{ id: string; status: string }[]>`
    select r.id::text as id, r.status from runs r where r.task_id = ${manyTask} order by r.id`;
  assert.deepEqual(
    runs.map((r) => r.status),
    ["succeeded", "failed"],
  );
  [okRun, failedRun] = runs.map((r) => r.id) as [string, string];
  oneTask = await finishedTask([good]);
});
after(() => env.close());

const api = (url: string, t = token) => app.inject({ url: `/api${url}`, headers: bearer(t) });
const post = (url: string, t = token) =>
  app.inject({ method: "POST", url: `/api${url}`, headers: bearer(t) });
const outputs = () => `/analysis-tasks/${manyTask}/runs/${okRun}/outputs`;

/** Makes a link with POST `url`; returns its url and expiresAt. */
async function linkOf(url: string, t = token): Promise<{ url: string; expiresAt: string }> {
  const res = await post(url, t);
  assert.equal(res.statusCode, 200, `${url}: ${res.body}`);
  return res.json().data as { url: string; expiresAt: string };
}

/** What each kind of link saves, and the /api route that saves the same. */
const kinds = () => [
  { make: `/analysis-tasks/${manyTask}/download/link`, same: `/analysis-tasks/${manyTask}/download` },
  { make: `/analysis-tasks/${oneTask}/download/link`, same: `/analysis-tasks/${oneTask}/download` },
  {
    make: `/analysis-tasks/${manyTask}/results.csv/link`,
    same: `/analysis-tasks/${manyTask}/results.csv`,
  },
  {
    make: `/analysis-tasks/${manyTask}/runs/${okRun}/download/link`,
    same: `/analysis-tasks/${manyTask}/runs/${okRun}/download`,
  },
  { make: `${outputs()}/data.csv/download-link`, same: `${outputs()}/data.csv` },
  { make: `${outputs()}/report.html/download-link`, same: `${outputs()}/report.html` },
];

test("each kind of link saves what its /api route serves, as an attachment, without a token, never cached", async () => {
  for (const { make, same } of kinds()) {
    const { url, expiresAt } = await linkOf(make);
    assert.match(
      url,
      /^\/view\/download\/\d+\.(task|results|run|output)\.\d+(\.\d+)?\.\d+\.[\w-]{43}\/[^/]+$/,
    );
    const ttl = Date.parse(expiresAt) - Date.now();
    assert.ok(
      ttl > (DOWNLOAD_LINK_TTL_SECONDS - 5) * 1000 && ttl <= DOWNLOAD_LINK_TTL_SECONDS * 1000,
      `${ttl}`,
    );
    const res = await app.inject({ url });
    const expected = await api(same);
    assert.equal(res.statusCode, 200, `${url}: ${res.body}`);
    assert.deepEqual(res.rawPayload, expected.rawPayload, make);
    assert.equal(res.headers["content-type"], expected.headers["content-type"], make);
    // Saved, never shown: the one file of /api's inline route too.
    const disposition = String(expected.headers["content-disposition"]).replace(/^inline/, "attachment");
    assert.equal(res.headers["content-disposition"], disposition, make);
    assert.equal(res.headers["cache-control"], "private, no-store", make);
    assert.equal(res.headers["referrer-policy"], "no-referrer", make);
    assert.equal(res.headers["x-content-type-options"], "nosniff", make);
    assert.equal(res.headers["content-security-policy"], "sandbox", make);
  }
  // The zip holds the hostile input name as its folder (as the zip names folders).
  const zip = await app.inject({ url: (await linkOf(kinds()[0]?.make as string)).url });
  assert.ok(
    zipNames(zip.rawPayload).includes("données _α_ _b_.csv/out.json"),
    zipNames(zip.rawPayload).join(),
  );
  // A one-file task's link is named for its file; a zip's for the task.
  assert.match((await linkOf(kinds()[1]?.make as string)).url, /\/out\.json$/);
  assert.match((await linkOf(kinds()[0]?.make as string)).url, new RegExp(`/task-${manyTask}\\.zip$`));
});

test("a file's link resumes as /api does: the same ETag, one Range answered 206, If-Range honoured", async () => {
  for (const make of [
    `${outputs()}/data.csv/download-link`,
    `/analysis-tasks/${manyTask}/runs/${okRun}/download/link`,
    `/analysis-tasks/${oneTask}/download/link`,
  ]) {
    const { url } = await linkOf(make);
    const whole = await app.inject({ url });
    const etag = String(whole.headers.etag);
    assert.match(etag, /^"[\w-]+"$/);
    assert.equal(whole.headers["accept-ranges"], "bytes");
    const part = await app.inject({ url, headers: { range: "bytes=5-", "if-range": etag } });
    assert.equal(part.statusCode, 206, make);
    assert.deepEqual(part.rawPayload, whole.rawPayload.subarray(5));
    assert.equal(
      part.headers["content-range"],
      `bytes 5-${whole.rawPayload.length - 1}/${whole.rawPayload.length}`,
    );
    assert.equal(part.headers["content-disposition"], whole.headers["content-disposition"]);
    const stale = await app.inject({ url, headers: { range: "bytes=5-", "if-range": '"other"' } });
    assert.equal(stale.statusCode, 200);
    const cached = await app.inject({ url, headers: { "if-none-match": etag } });
    assert.equal(cached.statusCode, 304);
  }
  const data = await api(`${outputs()}/data.csv`);
  const viaLink = await app.inject({ url: (await linkOf(`${outputs()}/data.csv/download-link`)).url });
  assert.equal(viaLink.headers.etag, data.headers.etag);
});

test("a link is refused by the POST as its download would be: not ready, not found, another user's", async () => {
  const cases: [string, string, number, string][] = [
    [`/analysis-tasks/${manyTask}/runs/${failedRun}/download/link`, token, 409, "ANALYSIS_TASK_NOT_READY"],
    [`/analysis-tasks/${manyTask}/download/link`, stranger, 404, "ANALYSIS_TASK_NOT_FOUND"],
    [`/analysis-tasks/${manyTask}/results.csv/link`, stranger, 404, "ANALYSIS_TASK_NOT_FOUND"],
    [`/analysis-tasks/${manyTask}/runs/${okRun}/download/link`, stranger, 404, "ANALYSIS_TASK_NOT_FOUND"],
    [`${outputs()}/out.json/download-link`, stranger, 404, "ANALYSIS_TASK_NOT_FOUND"],
    [`${outputs()}/nothing.json/download-link`, token, 404, "OUTPUT_NOT_FOUND"],
    [`${outputs()}/..%2F..%2Fetc%2Fpasswd/download-link`, token, 404, "OUTPUT_NOT_FOUND"],
    [
      `/analysis-tasks/${manyTask}/runs/${failedRun}/outputs/partial.json/download-link`,
      token,
      404,
      "OUTPUT_NOT_FOUND",
    ],
    [`/analysis-tasks/${oneTask}/runs/${okRun}/download/link`, token, 404, "ANALYSIS_TASK_NOT_FOUND"],
    ["/analysis-tasks/0x1/download/link", token, 404, "ANALYSIS_TASK_NOT_FOUND"],
    ["/analysis-tasks/99999999999999999999/results.csv/link", token, 404, "ANALYSIS_TASK_NOT_FOUND"],
    [`/analysis-tasks/${manyTask}/runs/-1/download/link`, token, 404, "ANALYSIS_TASK_NOT_FOUND"],
  ];
  for (const [url, t, status, code] of cases) {
    const res = await post(url, t);
    assert.equal(res.statusCode, status, `${url}: ${res.body}`);
    assert.equal(res.json().code, code, url);
  }
  // Not finished yet: the task's download has none to give.
  const queued = await env.task("outputs", [await env.file("{}")], { mode: "input" });
  const res = await post(`/analysis-tasks/${queued}/download/link`);
  assert.equal(res.statusCode, 409);
  assert.equal(res.json().code, "ANALYSIS_TASK_NOT_READY");
  // No token, no link.
  const anonymous = await app.inject({
    method: "POST",
    url: `/api/analysis-tasks/${manyTask}/download/link`,
  });
  assert.equal(anonymous.statusCode, 401);
});

describe("a link that is not valid is a 404 OUTPUT_NOT_FOUND, and nothing is served", () => {
  test("altered in any part, made for another kind, run, name or task, or moved between view and download", async () => {
    const { url } = await linkOf(`/analysis-tasks/${manyTask}/runs/${okRun}/download/link`);
    const [, , , link = "", name = ""] = url.split("/");
    const [id, kind, task, run, expires, sig = ""] = link.split(".");
    assert.equal(kind, "run");
    const flipped = `${sig.slice(0, -1)}${sig.endsWith("A") ? "B" : "A"}`;
    const view = (await linkOf(`${outputs()}/out.json/link`)).url.split("/")[2] as string;
    const bad = [
      `/view/download/${id}.${kind}.${task}.${run}.${expires}.${flipped}/${name}`,
      `/view/download/${id}.output.${task}.${run}.${expires}.${sig}/${name}`,
      `/view/download/${id}.task.${task}.${expires}.${sig}/${name}`,
      `/view/download/${id}.task.${task}.${run}.${expires}.${sig}/${name}`,
      `/view/download/${id}.results.${task}.${expires}.${sig}/${name}`,
      `/view/download/${id}.${kind}.${task}.${failedRun}.${expires}.${sig}/${name}`,
      `/view/download/${id}.${kind}.${oneTask}.${run}.${expires}.${sig}/${name}`,
      `/view/download/${id}.${kind}.${task}.${run}.${Number(expires) + 1}.${sig}/${name}`,
      `/view/download/${id}.${kind}.${task}.${run}.${expires}.${sig}/data.csv`,
      `/view/download/${id}.${kind}.${task}.${run}.${expires}.${sig}/${name}x`,
      `/view/download/${id}.${kind}.${task}.${run}.${expires}/${name}`,
      `/view/download/0${id}.${kind}.${task}.${run}.${expires}.${sig}/${name}`,
      `/view/download/${Number(id) + 1}.${kind}.${task}.${run}.${expires}.${sig}/${name}`,
      `/view/download/${id}.RUN.${task}.${run}.${expires}.${sig}/${name}`,
      `/view/download/${id}.${kind}.${task}.${run}.${expires}.${sig}.${sig}/${name}`,
      // A view link is no download link, and a download link no view link.
      `/view/download/${view}/out.json`,
      `/view/${link}/${name}`,
    ];
    for (const u of bad) {
      const res = await app.inject({ url: u });
      assert.equal(res.statusCode, 404, u);
      assert.equal(res.json().code, "OUTPUT_NOT_FOUND", u);
      assert.equal(res.headers["content-disposition"], undefined, u);
    }
  });

  test("expired at its expiresAt, or valid for longer than a link may be", async () => {
    const { url, expiresAt } = await linkOf(`${outputs()}/out.json/download-link`);
    const [, , , link = "", name = ""] = url.split("/");
    const at = Date.parse(expiresAt);
    assert.ok(await downloadLinkCheck(env.db.sql, link, name, at - 1), "valid until its expiry");
    assert.equal(await downloadLinkCheck(env.db.sql, link, name, at), undefined, "expired at expiresAt");
    const [row] = await env.db.sql<{ hash: string }[]>`
      select token_hash as hash from api_tokens where id = ${tokenId}`;
    const hash = row?.hash as string;
    const target: DownloadTarget = { kind: "output", taskId: manyTask, runId: okRun, name: "out.json" };
    const old = downloadLinkPath(tokenId, hash, target, Date.now() - (DOWNLOAD_LINK_TTL_SECONDS + 1) * 1000);
    const far = downloadLinkPath(tokenId, hash, target, Date.now() + 3600_000);
    for (const u of [old.path, far.path]) assert.equal((await app.inject({ url: u })).statusCode, 404, u);
    // The right key and a fresh expiry is what the API makes: served.
    assert.equal((await app.inject({ url: downloadLinkPath(tokenId, hash, target).path })).statusCode, 200);
  });

  test("its token revoked, or its user no longer able to see the task", async () => {
    const extra = await tokenCreate(env.db.sql, "runner");
    const { url } = await linkOf(`/analysis-tasks/${manyTask}/download/link`, extra.token);
    assert.equal((await app.inject({ url })).statusCode, 200);
    assert.ok(await tokenRevoke(env.db.sql, extra.tokenId));
    const res = await app.inject({ url });
    assert.equal(res.statusCode, 404);
    assert.equal(res.json().code, "OUTPUT_NOT_FOUND");
    // Signed with another user's token for this user's task: access is checked on use.
    const [other] = await env.db.sql<{ id: number; hash: string }[]>`
      select t.id::float8 as id, t.token_hash as hash from api_tokens t join users u on u.id = t.user_id
      where u.name = 'stranger'`;
    const forged = downloadLinkPath(other?.id as number, other?.hash as string, {
      kind: "task",
      taskId: manyTask,
      name: `task-${manyTask}.zip`,
    });
    const refused = await app.inject({ url: forged.path });
    assert.equal(refused.statusCode, 404);
    assert.equal(refused.json().code, "ANALYSIS_TASK_NOT_FOUND");
  });
});

test("a link stays out of the log, and HEAD is refused without reading anything", async () => {
  const from = logs.length;
  const { url } = await linkOf(`/analysis-tasks/${manyTask}/download/link`);
  const signature = (url.split("/")[3] as string).split(".").at(-1) as string;
  for (const [method, u] of [
    ["GET", url],
    ["HEAD", url],
    ["POST", url],
    ["GET", `${url}/`],
    ["GET", `${url.replace(/\/[^/]+$/, "")}`],
    ["GET", `${url}%zz`],
  ] as const) {
    const res = await app.inject({ method, url: u });
    if (method === "HEAD") {
      assert.equal(res.statusCode, 405);
      assert.equal(res.headers.allow, "GET");
    }
  }
  assert.ok(!JSON.stringify(logs.slice(from)).includes(signature), "the link's signature reached the log");
});
