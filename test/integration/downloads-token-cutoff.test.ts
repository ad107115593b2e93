// A response under way that a token authorised — one output, a zip, results.csv, a link's body — is cut
// off when the token is revoked, its user's role changes, or it expires: the client sees the transfer
// break (a body short of its Content-Length, a chunked body without its last chunk), never a complete
// file. The watch on the token goes away however the response ends.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { once } from "node:events";
import http from "node:http";
import type net from "node:net";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import type { TokenCache } from "../../src/auth/token-cache.ts";
import { type CreatedToken, tokenCreate, tokenRevoke } from "../../src/auth/tokens.ts";
import { bearer } from "../helpers/app.ts";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";

let env: RunnerEnv;
let app: FastifyInstance;
let port: number;
let tokens: TokenCache;
/** onRevoke listeners with no response under way (the events route's own). */
let baseline: number;
const logs: Record<string, unknown>[] = [];
/** The server's side of each connection, in the order they came. */
const serverSockets: net.Socket[] = [];
const clients: http.ClientRequest[] = [];
const USER = "Ģederts «dl» 𝔘";
let one: string;
let many: string;
let runId: string;

/** More than the sockets' buffers hold, zipped or not (random: deflate cannot shrink it much). */
const big = () => randomBytes(8 * 1024 * 1024).toString("base64");

before(async () => {
  env = await runnerEnv();
  app = await env.app(logs);
  tokens = app.services.tokens as TokenCache;
  // Ids past a digit boundary.
  await env.db.sql`select setval('api_tokens_id_seq', 99999)`;
  const w = env.worker([fixtureProgram("dl-cut")]);
  await w.start();
  const spec = (name: string, content: string) =>
    env.file(JSON.stringify({ files: { [name]: content }, result: name, metrics: { rows: 1 } }));
  one = await env.task("dl-cut", [await spec("rapport-ete.html", big())], { mode: "input" });
  many = await env.task("dl-cut", [await spec("r.json", big()), await spec("r.json", "{}")], {
    mode: "input",
  });
  await waitForTerminal(env.db.sql, one);
  await waitForTerminal(env.db.sql, many);
  await w.stop();
  const owner = await tokenCreate(env.db.sql, USER);
  await env.db.sql`update tasks set owner_id = ${owner.userId}`;
  await env.db.sql`update files set owner_id = ${owner.userId}`;
  // A results table wider than the socket buffers: many metric keys on every row.
  await env.db.sql`
    update runs set result = jsonb_set(result, '{metrics}',
      (select jsonb_object_agg('métrique, "n°' || i || '"', i) from generate_series(1, 300000) i))
    where task_id = ${many}`;
  const [run] = await env.db.sql<{ id: string }[]>`select id::text from runs where task_id = ${one}`;
  runId = run?.id as string;
  await app.listen({ port: 0, host: "127.0.0.1" });
  app.server.on("connection", (s: net.Socket) => serverSockets.push(s));
  port = (app.server.address() as net.AddressInfo).port;
  await waitFor(async () => (await app.inject({ url: "/readyz" })).statusCode === 200, 10_000, "ready");
  baseline = tokens.revokeListenerCount;
});
after(async () => {
  for (const c of clients) c.destroy();
  await env.close();
});

interface Paused {
  res: http.IncomingMessage;
  /** Resumes reading; resolves with what arrived and whether the response was complete. */
  finish(): Promise<{ bytes: number; complete: boolean }>;
}

/** A download read as far as its head and then paused while the server still holds more of it. */
async function pausedDownload(url: string, headers: Record<string, string> = {}): Promise<Paused> {
  const known = serverSockets.length;
  const req = http.get({ host: "127.0.0.1", port, path: url, headers, agent: false });
  req.on("error", () => {});
  clients.push(req);
  const [res] = (await once(req, "response")) as [http.IncomingMessage];
  assert.equal(res.statusCode, 200, url);
  res.pause();
  // (results.csv's 300,000 columns take seconds to fill the buffers; over 10 s once on a machine
  // loaded twice over.)
  await waitFor(
    async () => (serverSockets[known]?.writableLength ?? 0) > 0,
    30_000,
    "the response to wait for its reader",
  );
  return {
    res,
    finish: () =>
      new Promise((resolve) => {
        let bytes = 0;
        res.on("data", (c: Buffer) => (bytes += c.length));
        res.on("error", () => {});
        res.on("close", () => resolve({ bytes, complete: res.complete }));
        res.resume();
      }),
  };
}

const apiUrls = () => ({
  single: `/api/analysis-tasks/${one}/download`,
  zip: `/api/analysis-tasks/${many}/download`,
  csv: `/api/analysis-tasks/${many}/results.csv`,
  inline: `/api/analysis-tasks/${one}/runs/${runId}/outputs/rapport-ete.html`,
});

async function link(token: string, url: string): Promise<string> {
  const made = await app.inject({ method: "POST", url, headers: bearer(token) });
  assert.equal(made.statusCode, 200, made.body);
  return made.json().data.url as string;
}

const cutOffLines = () => logs.filter((l) => l.msg === "download cut off: its token is no longer valid");

test("a revoke cuts off every kind of download under way, and its watch goes away", {
  timeout: 120_000,
}, async () => {
  type Made = { url: string; headers: Record<string, string> };
  const byLink = (url: string) => async (t: CreatedToken) => ({ url: await link(t.token, url), headers: {} });
  const cases: [string, (t: CreatedToken) => Promise<Made>][] = [
    ...Object.entries(apiUrls()).map(([kind, url]): [string, (t: CreatedToken) => Promise<Made>] => [
      kind,
      async (t) => ({ url, headers: bearer(t.token) }),
    ]),
    ["zip by download link", byLink(`/api/analysis-tasks/${many}/download/link`)],
    ["results.csv by download link", byLink(`/api/analysis-tasks/${many}/results.csv/link`)],
    ["view link", byLink(`/api/analysis-tasks/${one}/runs/${runId}/outputs/rapport-ete.html/link`)],
  ];
  for (const [kind, make] of cases) {
    const token = await tokenCreate(env.db.sql, USER);
    const { url, headers } = await make(token);
    const cut = cutOffLines().length;
    const paused = await pausedDownload(url, headers);
    assert.equal(tokens.revokeListenerCount, baseline + 1, `${kind}: watched while under way`);
    const length = paused.res.headers["content-length"];
    assert.equal(await tokenRevoke(env.db.sql, token.tokenId), true);
    await waitFor(async () => tokens.revokeListenerCount === baseline, 10_000, `${kind}: the watch to go`);
    const got = await paused.finish();
    assert.equal(got.complete, false, `${kind}: the client sees the transfer broken off`);
    if (length !== undefined) assert.ok(got.bytes < Number(length), `${kind}: short of its Content-Length`);
    if (!url.startsWith("/view/")) {
      // (A link's requests log at `warn` only: the link is a capability.)
      assert.equal(cutOffLines().length, cut + 1, kind);
      assert.equal(cutOffLines().at(-1)?.why, "revoked");
    }
  }
});

test("a download whose token stays valid completes, and its watch goes away; so does one whose client leaves", {
  timeout: 60_000,
}, async () => {
  const token = await tokenCreate(env.db.sql, USER);
  for (const url of Object.values(apiUrls())) {
    const paused = await pausedDownload(url, bearer(token.token));
    assert.equal(tokens.revokeListenerCount, baseline + 1);
    // Another token's revoke, and a role change of another user, do not cut it off.
    const other = await tokenCreate(env.db.sql, USER);
    assert.equal(await tokenRevoke(env.db.sql, other.tokenId), true);
    await tokenCreate(env.db.sql, "someone-else", "admin");
    const got = await paused.finish();
    assert.equal(got.complete, true, url);
    await waitFor(async () => tokens.revokeListenerCount === baseline, 5_000, "the watch to go");
  }
  const left = await pausedDownload(apiUrls().zip, bearer(token.token));
  left.res.destroy();
  await waitFor(async () => tokens.revokeListenerCount === baseline, 5_000, "the watch to go");
});

test("a role change of the token's user cuts off its download; so does the token's expiry", {
  timeout: 60_000,
}, async () => {
  const token = await tokenCreate(env.db.sql, USER);
  const paused = await pausedDownload(apiUrls().zip, bearer(token.token));
  await tokenCreate(env.db.sql, USER, "admin");
  const got = await paused.finish();
  assert.equal(got.complete, false, "cut off by the role change");
  assert.equal(cutOffLines().at(-1)?.why, "role changed");
  await tokenCreate(env.db.sql, USER, "user");

  // No notification: its deadline alone cuts it off.
  const expiring = await tokenCreate(env.db.sql, USER, undefined, 3);
  const single = await pausedDownload(apiUrls().single, bearer(expiring.token));
  const length = Number(single.res.headers["content-length"]);
  // Still paused: only the deadline can end it.
  await waitFor(async () => cutOffLines().at(-1)?.why === "expired", 10_000, "the expiry's cut-off");
  assert.ok(Date.now() >= Date.parse(expiring.expiresAt as string) - 1_000, "not before the expiry");
  const ended = await single.finish();
  assert.equal(ended.complete, false, "cut off at the token's expiry");
  assert.ok(ended.bytes < length);
  await waitFor(async () => tokens.revokeListenerCount === baseline, 5_000, "the watch to go");
});
