// The link routes on API instances whose clocks disagree with the database's: made on one instance
// (clock ten minutes ahead), used on another (ten minutes behind).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { DOWNLOAD_LINK_TTL_SECONDS, VIEW_LINK_TTL_SECONDS } from "../../src/auth/view-links.ts";
import { databaseNow } from "../../src/db/clock.ts";
import { bearer } from "../helpers/app.ts";
import { waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";

let env: RunnerEnv;
let app: FastifyInstance;
let token: string;
let taskId: string;
let runId: string;

before(async () => {
  env = await runnerEnv();
  app = await env.app([]);
  token = (await tokenCreate(env.db.sql, "runner")).token;
  const good = JSON.stringify({ files: { "report.html": "<h1>r</h1>" }, result: "report.html" });
  taskId = await env.task("outputs", [await env.file(good)], { mode: "input" });
  const w = env.worker([fixtureProgram("outputs")]);
  await w.start();
  await waitForTerminal(env.db.sql, taskId);
  await w.stop();
  const [run] = await env.db.sql<{ id: string }[]>`select id::text from runs where task_id = ${taskId}`;
  runId = run?.id as string;
});
after(() => env.close());

const TEN_MINUTES = 10 * 60_000;
async function onHostClock<T>(offsetMs: number, fn: () => Promise<T>): Promise<T> {
  const real = Date.now;
  Date.now = () => real.call(Date) + offsetMs;
  try {
    return await fn();
  } finally {
    Date.now = real;
  }
}

for (const [kind, url, ttl] of [
  [
    "view link",
    () => `/api/analysis-tasks/${taskId}/runs/${runId}/outputs/report.html/link`,
    VIEW_LINK_TTL_SECONDS,
  ],
  ["download link", () => `/api/analysis-tasks/${taskId}/download/link`, DOWNLOAD_LINK_TTL_SECONDS],
] as const) {
  test(`${kind}: made on an instance ten minutes ahead, it lives its lifetime and works on one ten minutes behind`, async () => {
    const res = await onHostClock(TEN_MINUTES, () =>
      app.inject({ method: "POST", url: url(), headers: bearer(token) }),
    );
    assert.equal(res.statusCode, 200, res.body);
    const { url: link, expiresAt } = res.json().data as { url: string; expiresAt: string };
    const left = Date.parse(expiresAt) - (await databaseNow(env.db.sql));
    assert.ok(left > (ttl - 5) * 1000 && left <= ttl * 1000, `expires in ${left} ms`);
    const used = await onHostClock(-TEN_MINUTES, () => app.inject({ url: link }));
    assert.equal(used.statusCode, 200, used.body);
  });
}
