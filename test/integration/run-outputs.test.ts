// Per-run outputs: GET …/runs/:runId/outputs lists a run's files, GET …/outputs/:name serves one inline
// in a sandbox. Real programs (the behave fixture), a real worker, the local store.
import assert from "node:assert/strict";
import { Readable } from "node:stream";
import { after, before, describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate, tokenRevoke } from "../../src/auth/tokens.ts";
import { VIEW_LINK_TTL_SECONDS, viewLinkCheck, viewLinkPath } from "../../src/auth/view-links.ts";
import { VIEW_CSP } from "../../src/http/routes/downloads.ts";
import { outputObjectKey } from "../../src/storage/store.ts";
import { bearer } from "../helpers/app.ts";
import { waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";

let env: RunnerEnv;
let app: FastifyInstance;
const logs: Record<string, unknown>[] = [];
let token: string;
let stranger: string;
let admin: string;
let taskId: string;
let okRun: string;
let failedRun: string;

const FILES: Record<string, { content: string; type: string }> = {
  "report.html": {
    content: '<!doctype html><h1>Report ✓</h1><script>fetch("/api/files")</script>',
    type: "text/html; charset=utf-8",
  },
  "chart.svg": {
    content: '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
    type: "image/svg+xml",
  },
  "out.json": { content: '{"rows":3}', type: "application/json" },
  "data.csv": { content: "a,b\n1,2\n", type: "text/csv; charset=utf-8" },
  "Notes.txt": { content: "plain ünïcode text\n", type: "text/plain; charset=utf-8" },
};

before(async () => {
  env = await runnerEnv();
  app = await env.app(logs);
  token = (await tokenCreate(env.db.sql, "runner")).token;
  stranger = (await tokenCreate(env.db.sql, "stranger")).token;
  admin = (await tokenCreate(env.db.sql, "root", "admin")).token;
  const files = Object.fromEntries(Object.entries(FILES).map(([n, f]) => [n, f.content]));
  const good = await env.file(JSON.stringify({ files, result: "out.json", metrics: { rows: 3 } }));
  const bad = await env.file(JSON.stringify({ files: { "partial.json": "{}" }, exit: 3 }));
  taskId = await env.task("outputs", [good, bad], { mode: "input" });
  const w = env.worker([fixtureProgram("outputs")]);
  await w.start();
  await waitForTerminal(env.db.sql, taskId);
  await w.stop();
  const runs = await env.db.sql<{ id: string; status: string }[]>`
    select r.id::text as id, r.status from runs r where r.task_id = ${taskId} order by r.id`;
  assert.deepEqual(
    runs.map((r) => r.status),
    ["succeeded", "failed"],
  );
  [okRun, failedRun] = runs.map((r) => r.id) as [string, string];
});
after(() => env.close());

const get = (url: string, t = token) => app.inject({ url, headers: bearer(t) });
const base = () => `/api/analysis-tasks/${taskId}/runs/${okRun}/outputs`;
const expectedList = () =>
  Object.entries(FILES)
    .map(([name, f]) => ({ name, sizeBytes: Buffer.byteLength(f.content), contentType: f.type }))
    .sort((a, b) => (a.name < b.name ? -1 : 1));

test("a succeeded run lists its files with size and content type; owner and admin alike", async () => {
  for (const t of [token, admin]) {
    const res = await get(base(), t);
    assert.equal(res.statusCode, 200);
    assert.deepEqual(res.json(), { code: "OK", message: "OK", data: { items: expectedList() } });
  }
});

test("each file is served inline with its type, length, nosniff and a sandboxing CSP", async () => {
  for (const [name, f] of Object.entries(FILES)) {
    const res = await get(`${base()}/${name}`);
    assert.equal(res.statusCode, 200, name);
    assert.equal(res.headers["content-type"], f.type, name);
    assert.equal(res.headers["content-length"], String(Buffer.byteLength(f.content)), name);
    assert.equal(res.headers["x-content-type-options"], "nosniff", name);
    assert.equal(res.headers["content-security-policy"], "sandbox", name);
    assert.equal(
      res.headers["content-disposition"],
      `inline; filename="${name}"; filename*=UTF-8''${encodeURIComponent(name)}`,
      name,
    );
    assert.equal(res.body, f.content, name);
  }
});

test("a run that did not succeed has no outputs (even what its failed attempt wrote)", async () => {
  const res = await get(`/api/analysis-tasks/${taskId}/runs/${failedRun}/outputs`);
  assert.equal(res.statusCode, 200);
  assert.deepEqual(res.json().data, { items: [] });
  const file = await get(`/api/analysis-tasks/${taskId}/runs/${failedRun}/outputs/partial.json`);
  assert.equal(file.statusCode, 404);
  assert.equal(file.json().code, "OUTPUT_NOT_FOUND");
});

test("another user's task, a run of another task, odd ids → 404 ANALYSIS_TASK_NOT_FOUND", async () => {
  const other = await env.task("outputs-other", [await env.file("{}")], { mode: "input" });
  const urls = [
    [base(), stranger],
    [`${base()}/out.json`, stranger],
    [`/api/analysis-tasks/${other}/runs/${okRun}/outputs`, token],
    [`/api/analysis-tasks/${other}/runs/${okRun}/outputs/out.json`, token],
    [`/api/analysis-tasks/${taskId}/runs/999999999999999/outputs`, token],
    [`/api/analysis-tasks/${taskId}/runs/abc/outputs/out.json`, token],
    [`/api/analysis-tasks/01/runs/${okRun}/outputs`, token],
  ] as const;
  for (const [url, t] of urls) {
    const res = await get(url, t);
    assert.equal(res.statusCode, 404, url);
    assert.equal(res.json().code, "ANALYSIS_TASK_NOT_FOUND", url);
  }
  assert.equal((await get(base(), "")).statusCode, 401);
});

test("a name that is not one of the run's outputs, or a path trick → 404 OUTPUT_NOT_FOUND", async () => {
  const [input] = await env.db.sql<{ key: string }[]>`
    select input_storage_key as key from runs where id = ${okRun}`;
  for (const name of ["missing.json", "out.JSON", "partial.json", "...", "report.html.json"]) {
    const res = await get(`${base()}/${name}`);
    assert.equal(res.statusCode, 404, name);
    assert.equal(res.json().code, "OUTPUT_NOT_FOUND", name);
  }
  // A path trick is never served: the route refuses it (OUTPUT_NOT_FOUND), or — a bare `..`, which the
  // URL parser resolves — no route matches (NOT_FOUND).
  const names = [
    "..",
    "%2e%2e",
    `..%2F..%2F..%2F${encodeURIComponent(input?.key ?? "")}`,
    "..%2Fout.json",
    "%2Fetc%2Fpasswd",
    "sub%2Fout.json",
    "out.json%00",
    "out.json%2F",
    ".out.json",
    "out.json%20",
    "%C3%A9.json",
  ];
  for (const name of names) {
    const res = await get(`${base()}/${name}`);
    assert.equal(res.statusCode, 404, name);
    assert.ok(["OUTPUT_NOT_FOUND", "NOT_FOUND"].includes(res.json().code), name);
  }
  // Unencoded dot segments never reach another route's file either.
  for (const url of [`${base()}/../../download`, `${base()}/./out.json/..`]) {
    const res = await get(url);
    assert.ok(res.statusCode === 404 || res.headers["content-type"] === "application/json", url);
    assert.notEqual(res.headers["content-type"], "application/zip", url);
  }
});

test("a run from before result.files was kept: its files are listed from the store", async () => {
  await env.db.sql`update runs set result = result - 'files' where id = ${okRun}`;
  try {
    assert.deepEqual((await get(base())).json().data, { items: expectedList() });
    assert.equal((await get(`${base()}/chart.svg`)).body, FILES["chart.svg"]?.content);
    assert.equal((await get(`${base()}/nothing.svg`)).json().code, "OUTPUT_NOT_FOUND");
  } finally {
    await env.db.sql`
      update runs set result = result || ${env.db.sql.json({
        files: expectedList().map((f) => ({ name: f.name, size: f.sizeBytes })),
      })} where id = ${okRun}`;
  }
});

test("an output recorded before device names were refused (aux.json) is still listed and served", async () => {
  const [row] = await env.db.sql<
    { key: string; result: { outputFileName: string; files: { name: string; size: number }[] } }[]
  >`
    select output_key as key, result from runs where id = ${okRun}`;
  assert.ok(row);
  const content = '{"legacy":true}';
  await env.storage.put(outputObjectKey(row.key, "aux.json"), Readable.from([Buffer.from(content)]));
  await env.db.sql`
    update runs set result = result || ${env.db.sql.json({
      outputFileName: "aux.json",
      files: [...row.result.files, { name: "aux.json", size: content.length }],
    })} where id = ${okRun}`;
  try {
    const listed = (await get(base())).json().data.items.map((f: { name: string }) => f.name);
    assert.ok(listed.includes("aux.json"), String(listed));
    const served = await get(`${base()}/aux.json`);
    assert.equal(served.statusCode, 200);
    assert.equal(served.body, content);
  } finally {
    await env.db.sql`update runs set result = ${env.db.sql.json(row.result)} where id = ${okRun}`;
    await env.storage.delete([outputObjectKey(row.key, "aux.json")]);
  }
});

test("a recorded output missing from the store is a logged 500 ANALYSIS_OUTPUT_MISSING", async () => {
  const [row] = await env.db.sql<{ key: string }[]>`select output_key as key from runs where id = ${okRun}`;
  await env.storage.delete([`outputs/${row?.key}/data.csv`]);
  const res = await get(`${base()}/data.csv`);
  assert.equal(res.statusCode, 500);
  assert.deepEqual(res.json(), {
    code: "ANALYSIS_OUTPUT_MISSING",
    message: "This run's output is missing from the store; an administrator must restore it.",
  });
  assert.ok(logs.some((l) => l.msg === "a succeeded run's output is missing" && l.runId === okRun));
  // The listing still names what the completion recorded.
  assert.equal((await get(base())).statusCode, 200);
});

describe("view links", () => {
  const linkOf = async (name: string, t = token) =>
    app.inject({ method: "POST", url: `${base()}/${name}/link`, headers: bearer(t) });

  test("a link shows the output without a token, sandboxed, with its styles allowed; it is never logged", async () => {
    const res = await linkOf("report.html");
    assert.equal(res.statusCode, 200, res.body);
    const { url, expiresAt } = res.json().data as { url: string; expiresAt: string };
    assert.match(url, /^\/view\/\d+\.\d+\.\d+\.\d+\.[\w-]{43}\/report\.html$/);
    const ttl = Date.parse(expiresAt) - Date.now();
    assert.ok(ttl > (VIEW_LINK_TTL_SECONDS - 5) * 1000 && ttl <= VIEW_LINK_TTL_SECONDS * 1000, `${ttl}`);
    const view = await app.inject({ url });
    assert.equal(view.statusCode, 200);
    assert.equal(view.body, FILES["report.html"]?.content);
    assert.equal(view.headers["content-type"], "text/html; charset=utf-8");
    assert.equal(view.headers["content-security-policy"], VIEW_CSP);
    assert.match(VIEW_CSP, /^sandbox; default-src 'none'/);
    assert.equal(view.headers["x-content-type-options"], "nosniff");
    assert.equal(view.headers["cache-control"], "private, no-store");
    assert.equal(view.headers["referrer-policy"], "no-referrer");
    const signature = url.split("/")[2]?.split(".").at(-1) as string;
    assert.ok(!JSON.stringify(logs).includes(signature), "the link's signature reached the log");
    // A non-ASCII name travels encoded and is served as itself.
    const notes = (await linkOf("Notes.txt")).json().data.url as string;
    assert.equal((await app.inject({ url: notes })).body, FILES["Notes.txt"]?.content);
  });

  test("a link in a request no route takes (another method, a trailing slash, a bad escape) stays out of the log", async () => {
    const { url } = (await linkOf("out.json")).json().data as { url: string };
    const link = url.split("/")[2] as string;
    const signature = link.split(".").at(-1) as string;
    const from = logs.length;
    const tries: [string, string][] = [
      ["POST", url],
      ["OPTIONS", url],
      ["GET", `${url}/`],
      ["GET", `/view/${link}`],
      ["GET", `/view/${link}/`],
      ["GET", `/view//${link}/out.json`],
      ["GET", `/view/${link}//out.json`],
      ["GET", `/view/${link}/%zz`],
      ["GET", `/VIEW/${link}/out.json`],
    ];
    for (const [method, u] of tries) {
      const res = await app.inject({ method: method as "GET", url: u });
      assert.ok(res.statusCode >= 400, `${method} ${u}: ${res.statusCode}`);
    }
    const lines = logs.slice(from);
    assert.ok(
      lines.some((l) => (l.req as { url?: string } | undefined)?.url === "/view/[redacted]"),
      "the requests are logged, their path redacted",
    );
    assert.ok(!JSON.stringify(lines).includes(signature), "the link's signature reached the log");
  });

  test("a link stops working at its expiresAt, not up to a second later", async () => {
    const { url, expiresAt } = (await linkOf("out.json")).json().data as { url: string; expiresAt: string };
    const [, , link = "", name = ""] = url.split("/");
    const at = Date.parse(expiresAt);
    assert.ok(await viewLinkCheck(env.db.sql, link, name, at - 1), "valid until its expiry");
    assert.equal(await viewLinkCheck(env.db.sql, link, name, at), undefined, "expired at expiresAt");
    assert.equal(await viewLinkCheck(env.db.sql, link, name, at + 999), undefined, "and after it");
  });

  test("altered, expired, foreign, revoked or made for another output → 404, nothing served", async () => {
    const { url } = (await linkOf("out.json")).json().data as { url: string };
    const [, , link = "", name = ""] = url.split("/");
    const [tokenId, task, run, expires, sig = ""] = link.split(".");
    const flipped = `${sig.slice(0, -1)}${sig.endsWith("A") ? "B" : "A"}`;
    const [row] = await env.db.sql<
      { hash: string }[]
    >`select token_hash as hash from api_tokens where id = ${tokenId ?? ""}`;
    const hash = row?.hash as string;
    const target = { taskId, runId: okRun, name: "out.json" } as {
      taskId: string;
      runId: string;
      name: string;
    };
    const bad = [
      `/view/${tokenId}.${task}.${run}.${expires}.${flipped}/${name}`,
      `/view/${tokenId}.${task}.${run}.${expires}.${sig}/data.csv`,
      `/view/${tokenId}.${task}.${failedRun}.${expires}.${sig}/${name}`,
      `/view/${tokenId}.${task}.${run}.${Number(expires) + 1}.${sig}/${name}`,
      `/view/${tokenId}.${task}.${run}.${expires}/${name}`,
      `/view/0${tokenId}.${task}.${run}.${expires}.${sig}/${name}`,
      // Made with the right key, but expired, or valid for longer than a link may be.
      viewLinkPath(Number(tokenId), hash, target, Date.now() - (VIEW_LINK_TTL_SECONDS + 5) * 1000).path,
      viewLinkPath(Number(tokenId), hash, target, Date.now() + 3600_000).path,
    ];
    for (const u of bad) {
      const res = await app.inject({ url: u });
      assert.equal(res.statusCode, 404, u);
      assert.equal(res.json().code, "OUTPUT_NOT_FOUND", u);
    }
    // The right key and a fresh expiry is what the API makes: served.
    assert.equal(
      (await app.inject({ url: viewLinkPath(Number(tokenId), hash, target).path })).statusCode,
      200,
    );
    // Another user cannot make a link to this task; a name the run did not record has none.
    assert.equal((await linkOf("out.json", stranger)).json().code, "ANALYSIS_TASK_NOT_FOUND");
    assert.equal((await linkOf("nothing.json")).json().code, "OUTPUT_NOT_FOUND");
    // Revoking the token ends its links.
    const extra = await tokenCreate(env.db.sql, "runner");
    const made = (await linkOf("out.json", extra.token)).json().data.url as string;
    assert.equal((await app.inject({ url: made })).statusCode, 200);
    assert.ok(await tokenRevoke(env.db.sql, extra.tokenId));
    assert.equal((await app.inject({ url: made })).statusCode, 404);
  });
});
