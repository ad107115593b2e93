// PostgreSQL stopped for a while mid-run and started again: API and worker processes reconnect by
// themselves, /readyz says so, running processes are not killed, every run finishes, counters exact.
// This file runs its own embedded server (the shared one cannot be stopped under other tests).
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import postgres from "postgres";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { type EmbeddedPostgres, freePort, startEmbeddedPostgres } from "../../src/db/embedded.ts";
import { runMigrations } from "../../src/db/migrate.ts";
import { taskCreate } from "../../src/tasks/create.ts";
import { cleanEnv, collect, removeWithClusters, spawnCli, watch } from "../helpers/cli.ts";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-outage-"));
let port: number;
let pg: EmbeddedPostgres;
let sql: postgres.Sql;

const start = async () =>
  startEmbeddedPostgres({
    dataDir: path.join(dir, "pg"),
    persistent: true,
    port,
    settings: { fsync: "off" },
  });

before(async () => {
  port = await freePort();
  pg = await start();
  await runMigrations(pg.url);
  sql = postgres(pg.url, { max: 2, onnotice: () => {} });
});
after(async () => {
  await sql.end({ timeout: 1 });
  await pg.stop();
  // As root the cluster lives under /var/lib/assay-embedded/clusters, and `dir` holds only a link to
  // it: removing `dir` alone left ~50 MB there on every run.
  const cluster = fs.realpathSync(path.join(dir, "pg"));
  removeWithClusters(dir);
  assert.equal(fs.existsSync(cluster), false, `the embedded cluster ${cluster} is left behind`);
});

test("the database stops for 10 s mid-run: everything reconnects and every run finishes, counted once", async () => {
  const dataDir = path.join(dir, "data");
  fs.mkdirSync(path.join(dataDir, "files"), { recursive: true });
  await tokenCreate(sql, "outage", "admin");
  const [user] = await sql<{ id: number }[]>`select id::float8 from users where name = 'outage'`;
  const rows = ["a,b"];
  for (let i = 0; i < 1_500_000; i++) rows.push(`${i},${i % 7}`);
  const content = `${rows.join("\n")}\n`;
  const ids: string[] = [];
  for (let i = 0; i < 4; i++) {
    const [f] = await sql<{ id: string }[]>`
      with next as (select nextval(pg_get_serial_sequence('files', 'id')) as id)
      insert into files (id, owner_id, name, content_type, size_bytes, sha256, storage_key)
      select id, ${user?.id as number}, 'big.csv', 'text/csv', ${content.length}, repeat('0', 64), 'files/' || id from next
      returning id::text`;
    fs.writeFileSync(path.join(dataDir, "files", f?.id as string), content, { mode: 0o640 });
    ids.push(f?.id as string);
  }
  const env = cleanEnv({
    DATABASE_URL: pg.url,
    ASSAY_DATA_DIR: dataDir,
    PORT: "0",
    LOG_LEVEL: "info",
    ASSAY_POLL_INTERVAL_MS: "200",
  });
  const api = spawnCli(["api"], env);
  const apiOut = watch(api);
  const apiDone = collect(api);
  const worker = spawnCli(["worker", "--concurrency", "2"], env);
  const workerOut = watch(worker);
  const workerDone = collect(worker);
  try {
    const [, address] = await apiOut.waitFor(/Server listening at (http:\/\/127\.0\.0\.1:\d+)/);
    await workerOut.waitFor(/worker started/);
    const created = await taskCreate(
      sql,
      { userId: user?.id as number, name: "outage", role: "admin" },
      {
        analysisType: "summary",
        fileIds: ids,
        parameters: {},
        maxAttempts: 1,
      },
    );
    assert.equal(created.kind, "created");
    const taskId = created.kind === "created" ? created.taskId : "";
    for (;;) {
      const [r] =
        await sql`select count(*)::int as n from runs where task_id = ${taskId} and status = 'running'`;
      if ((r?.n ?? 0) >= 1) break;
      await new Promise((res) => setTimeout(res, 20));
    }
    await sql.end({ timeout: 1 });
    await pg.stop();
    const down = await fetch(`${address}/readyz`);
    assert.equal(down.status, 503, "readyz reports the outage");
    // Ten seconds: shorter than the lease (30 s by default), so no attempt may be lost to it.
    await new Promise((res) => setTimeout(res, 10_000));
    pg = await start();
    sql = postgres(pg.url, { max: 2, onnotice: () => {} });
    for (let i = 0; ; i++) {
      if ((await fetch(`${address}/readyz`)).status === 200) break;
      assert.ok(i < 100, "readyz recovers");
      await new Promise((res) => setTimeout(res, 100));
    }
    for (let i = 0; ; i++) {
      const [t] =
        await sql`select status, succeeded_count, failed_count, total_count from tasks where id = ${taskId}`;
      if (t && ["succeeded", "partially_succeeded", "failed"].includes(t.status)) {
        assert.deepEqual(
          { ...t },
          { status: "succeeded", succeeded_count: 4, failed_count: 0, total_count: 4 },
        );
        break;
      }
      assert.ok(i < 600, "the task finishes after the outage");
      await new Promise((res) => setTimeout(res, 100));
    }
    const runs = await sql`select attempt from runs where task_id = ${taskId}`;
    assert.ok(
      runs.every((r) => r.attempt === 1),
      "no attempt was lost to the outage",
    );
  } finally {
    worker.kill("SIGTERM");
    api.kill("SIGTERM");
    await Promise.all([workerDone, apiDone]);
  }
});
