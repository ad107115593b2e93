// /metrics of an API whose database fails or stops answering: the app talks to the real PostgreSQL
// through a TCP proxy that this file controls (forward, refuse every connection, or accept them and
// never answer). A scrape must answer in time with the process's own metrics, leave the queue gauges
// out rather than pass last scrape's values off as current, and count the failure in that scrape.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { loadConfig } from "../../src/config.ts";
import { createDatabase, type Database } from "../../src/db/client.ts";
import { expectedMigrationCount } from "../../src/db/migrate.ts";
import { buildServer } from "../../src/http/server.ts";
import { createLogger } from "../../src/log.ts";
import { QUEUE_READ_TIMEOUT_MS } from "../../src/metrics/api.ts";
import { LocalStore } from "../../src/storage/local.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { type DbRelay, relayTo, throughRelay } from "../helpers/db-relay.ts";
import { createTask, seedUser, waitFor } from "../helpers/queue.ts";

let db: TestDatabase;
let proxy: DbRelay;
let viaProxy: Database;
let app: FastifyInstance;
let dataDir: string;
const logs: Record<string, unknown>[] = [];

before(async () => {
  db = await createTestDatabase();
  proxy = await relayTo(db.url, "forward");
  const url = throughRelay(db.url, proxy);
  viaProxy = createDatabase(url, { max: 3 });
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-metrics-down-"));
  const config = loadConfig({ ASSAY_DATA_DIR: dataDir, DATABASE_URL: url });
  const destination = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split("\n")) if (line) logs.push(JSON.parse(line));
      done();
    },
  });
  app = await buildServer(
    {
      config,
      database: viaProxy,
      storage: new LocalStore(dataDir),
      expectedMigrations: expectedMigrationCount(),
    },
    createLogger({ level: "info", destination }),
  );
  const owner = await seedUser(db.sql, "down");
  await createTask(db.sql, owner, "down-type", 2);
});

after(async () => {
  proxy.set("forward");
  await app.close();
  await viaProxy.close();
  await proxy.close();
  await db.drop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

const DEPTH = /^assay_queue_depth\{analysis_type="down-type"\} 2$/m;
const errorsIn = (body: string) =>
  Number(/^assay_metrics_scrape_errors_total (\d+)$/m.exec(body)?.[1] ?? Number.NaN);

async function scrape(): Promise<{ body: string; ms: number }> {
  const started = performance.now();
  const res = await app.inject({ url: "/metrics" });
  assert.equal(res.statusCode, 200);
  return { body: res.body, ms: performance.now() - started };
}

test("a database that fails: the queue gauges are left out (not last scrape's), the error counted in that scrape", async () => {
  const up = await scrape();
  assert.ok(DEPTH.test(up.body), "the queue depth");
  assert.ok(
    /^assay_runs_finished\{analysis_type="down-type",status="succeeded"\} 0$/m.test(up.body),
    "the finished totals",
  );
  const errorsBefore = errorsIn(up.body);
  assert.equal(errorsBefore, 0);

  proxy.set("refuse");
  const down = await scrape();
  assert.ok(!/^assay_queue_depth\{/m.test(down.body), "no stale queue depth");
  assert.ok(!/^assay_runs_finished\{/m.test(down.body), "no stale totals");
  assert.ok(/^assay_process_resident_memory_bytes \d+/m.test(down.body), "the process's own metrics stay");
  assert.equal(errorsIn(down.body), errorsBefore + 1, "counted in the scrape that failed");
  assert.ok(
    logs.some((l) => l.level === 40 && /queue read failed/.test(String(l.msg))),
    "the failure is logged",
  );

  proxy.set("forward");
  const back = await waitFor(async () => {
    const s = await scrape();
    return DEPTH.test(s.body) ? s : undefined;
  });
  assert.equal(errorsIn(back.body), errorsBefore + 1);
});

test("a database that does not answer: the scrape answers within the read timeout, without the queue gauges", async () => {
  proxy.set("hold");
  // The pool's connections were cut: the first read may fail at once on one of them. From then on
  // every connection hangs (PostgreSQL's side never answers; postgres.js gives up after 30 s).
  const first = await scrape();
  assert.ok(!/^assay_queue_depth\{/m.test(first.body), "no assay_queue_depth line");
  const before = errorsIn(first.body);
  // Two scrapes in a row, each bounded. (That the second shares the read still in flight rather than
  // starting another is checked in metrics-queue-read.test.ts, where the reads can be counted.)
  for (const n of [1, 2]) {
    const hung = await scrape();
    assert.ok(
      hung.ms >= QUEUE_READ_TIMEOUT_MS - 100 && hung.ms < QUEUE_READ_TIMEOUT_MS + 3000,
      `scrape ${n} took ${Math.round(hung.ms)} ms (Prometheus gives up at 10 s)`,
    );
    assert.ok(!/^assay_queue_depth\{/m.test(hung.body), "no assay_queue_depth line");
    assert.ok(/^assay_process_resident_memory_bytes \d+/m.test(hung.body), "the process's own metrics stay");
    assert.equal(errorsIn(hung.body), before + n);
  }
  proxy.set("forward");
  await waitFor(async () => DEPTH.test((await scrape()).body));
});
