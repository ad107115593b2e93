// `assay storage migrate`: a local installation's files and outputs move into a bucket under the same
// keys; after the switch to ASSAY_STORAGE=s3 the API serves them from there; running it again copies
// nothing.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { loadConfig } from "../../src/config.ts";
import { expectedMigrationCount } from "../../src/db/migrate.ts";
import { buildServer } from "../../src/http/server.ts";
import { createLogger } from "../../src/log.ts";
import { openStore } from "../../src/storage/open.ts";
import { bearer } from "../helpers/app.ts";
import { cleanEnv, runCli } from "../helpers/cli.ts";
import { waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";
import { createTestBucket, type TestBucket } from "../helpers/s3.ts";

let env: RunnerEnv;
let bucket: TestBucket;
before(async () => {
  env = await runnerEnv();
  bucket = await createTestBucket();
});
after(async () => {
  await env.close();
  await bucket.drop();
});

test("a local installation migrates into a bucket and is served from it", async () => {
  const files = [];
  for (const c of ["a,b\n1,2\n", "c\n3\n", "d\n4\n"]) files.push(await env.file(c));
  const taskId = await env.task("migrate", files, { mode: "ok" });
  const w = env.worker([fixtureProgram("migrate")]);
  await w.start();
  await waitForTerminal(env.db.sql, taskId);
  await w.stop();

  const s3Env = { ...bucket.env, ASSAY_S3_PREFIX: "moved/", DATABASE_URL: env.db.url };
  const first = await runCli(["storage", "migrate", "--from", env.dataDir], cleanEnv(s3Env));
  assert.equal(first.code, 0, first.stderr);
  const summary = JSON.parse(first.stdout.trim().split("\n").at(-1) as string);
  assert.equal(summary.copied, 6, "3 files and 3 outputs");
  assert.equal(summary.skipped, 0);

  const again = await runCli(["storage", "migrate", "--from", env.dataDir], cleanEnv(s3Env));
  assert.equal(again.code, 0, again.stderr);
  assert.deepEqual(JSON.parse(again.stdout.trim().split("\n").at(-1) as string).copied, 0);

  // The same database, now with the bucket: the outputs are served from it.
  const config = loadConfig({ ...s3Env, ASSAY_DATA_DIR: `${env.dataDir}-elsewhere` });
  const storage = await openStore(config);
  const app = await buildServer(
    { config, database: env.db, storage, expectedMigrations: expectedMigrationCount() },
    createLogger({ level: "silent" }),
  );
  try {
    const token = (await tokenCreate(env.db.sql, "runner")).token;
    const zip = await app.inject({ url: `/api/analysis-tasks/${taskId}/download`, headers: bearer(token) });
    assert.equal(zip.statusCode, 200);
    assert.equal(zip.headers["content-type"], "application/zip");
    assert.equal((await storage.list("files/")).length, 3);
  } finally {
    await app.close();
  }
  const bad = await runCli(["storage", "migrate"], cleanEnv({ DATABASE_URL: env.db.url }));
  assert.equal(bad.code, 2, "without ASSAY_STORAGE=s3 it refuses");
  assert.match(bad.stderr, /ASSAY_STORAGE=s3/);
});
