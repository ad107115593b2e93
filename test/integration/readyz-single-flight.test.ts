// /readyz while the database or the object store does not answer: every probe is a 503 within its
// 2 s, and the probes share one check rather than leave one each behind. The database is reached
// through a TCP relay this file controls (it closes every connection it accepts, holds them without
// a word, or passes them through to the real PostgreSQL): postgres.js keeps a query waiting through
// either, making the connection again and again, and a load balancer probing every second from a
// few places piled up readiness queries without bound, all run at once when the database came back.
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { loadConfig } from "../../src/config.ts";
import { createDatabase, type Database } from "../../src/db/client.ts";
import { expectedMigrationCount } from "../../src/db/migrate.ts";
import { buildServer } from "../../src/http/server.ts";
import { createLogger } from "../../src/log.ts";
import { LocalStore } from "../../src/storage/local.ts";
import { S3Store } from "../../src/storage/s3.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { DbRelay } from "../helpers/db-relay.ts";
import { waitFor } from "../helpers/queue.ts";

const BOUND_MS = 2500;
let db: TestDatabase;
let dataDir: string;
const closers: (() => Promise<void> | void)[] = [];

before(async () => {
  db = await createTestDatabase();
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-readyz-"));
});

after(async () => {
  for (const close of closers.reverse()) await close();
  await db.drop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

async function app(database: Database, storage: LocalStore | S3Store): Promise<FastifyInstance> {
  const config = loadConfig({ ASSAY_DATA_DIR: dataDir, DATABASE_URL: db.url });
  const server = await buildServer(
    { config, database, storage, expectedMigrations: expectedMigrationCount() },
    createLogger({ level: "silent" }),
  );
  closers.push(() => server.close());
  return server;
}

/** `n` probes, one every `everyMs` (0: all at once), each answered; their answers and times. */
async function probes(server: FastifyInstance, n: number, everyMs: number) {
  const answers: Promise<{ status: number; body: unknown; ms: number }>[] = [];
  for (let i = 0; i < n; i++) {
    if (i > 0 && everyMs > 0) await new Promise((r) => setTimeout(r, everyMs));
    const started = performance.now();
    answers.push(
      server.inject({ url: "/readyz" }).then((res) => ({
        status: res.statusCode,
        body: res.json(),
        ms: performance.now() - started,
      })),
    );
  }
  return Promise.all(answers);
}

function allNotReady(answers: Awaited<ReturnType<typeof probes>>, message: string): void {
  for (const a of answers) {
    assert.equal(a.status, 503);
    assert.deepEqual(a.body, { code: "NOT_READY", message });
    assert.ok(a.ms < BOUND_MS, `a probe took ${Math.round(a.ms)} ms`);
  }
}

test("a database that does not answer: every probe is a 503 in time, and one readiness query waits, not forty", async () => {
  const u = new URL(db.url);
  const relay = new DbRelay({ host: u.hostname, port: Number(u.port) }, "forward");
  await relay.listen();
  closers.push(() => relay.close());
  u.hostname = "127.0.0.1";
  u.port = String(relay.port);
  const database = createDatabase(u.toString(), { max: 3 });
  closers.push(() => database.close());
  // The readiness queries the app asks its pool for (they wait there while the database does not
  // answer): the real client, only counted.
  let asked = 0;
  const sql = new Proxy(database.sql, {
    apply(target, self, args: unknown[]) {
      const strings = args[0];
      if (Array.isArray(strings) && strings.join("").includes("to_regclass('drizzle.__drizzle_migrations')"))
        asked++;
      return Reflect.apply(target, self, args);
    },
  });
  // Built while the database answers (its caches' LISTEN waits up to 10 s for one that does not);
  // the pool has made no connection yet, so the first probe's query is the first to meet the relay.
  const server = await app({ ...database, sql }, new LocalStore(dataDir));
  // Every connection closed as soon as it is made: postgres.js makes it again at once, for ever.
  relay.set("close");
  allNotReady(await probes(server, 20, 0), "The database is unreachable.");
  // Then held without a word (postgres.js waits 30 s for each), probes arriving one at a time.
  relay.set("hold");
  allNotReady(await probes(server, 20, 100), "The database is unreachable.");
  assert.equal(asked, 1, "one readiness query waits in the pool, shared by every probe");

  relay.set("forward");
  const started = performance.now();
  await waitFor(async () => (await server.inject({ url: "/readyz" })).statusCode === 200, 10_000, "ready");
  assert.ok(performance.now() - started < 5000, "ready within a few seconds of the database's return");
});

test("an object store that does not answer: every probe is a 503 in time, and one check is made, not forty", async () => {
  // A server that accepts connections and never answers, counting them: each check that waits holds
  // a connection of its own (the S3 client gives up after 10 s).
  const sockets = new Set<net.Socket>();
  let connections = 0;
  const silent = net.createServer((socket) => {
    connections++;
    sockets.add(socket);
    socket.on("error", () => {});
    socket.on("close", () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
  closers.push(() => {
    for (const s of sockets) s.destroy();
    silent.close();
  });
  const store = new S3Store({
    bucket: "assay-readyz",
    endpoint: `http://127.0.0.1:${(silent.address() as net.AddressInfo).port}`,
    forcePathStyle: true,
    region: "us-east-1",
  });
  closers.push(() => store.client.destroy());
  const server = await app(db, store);

  allNotReady(await probes(server, 20, 0), "The object store is unreachable.");
  allNotReady(await probes(server, 20, 100), "The object store is unreachable.");
  assert.equal(connections, 1, "one check waits for the store, shared by every probe");
});
