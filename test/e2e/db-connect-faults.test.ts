// A server command whose database connections die as they open. postgres.js (3.4.9) reads the array
// types on each new connection and drops that read's promise: a connection that dies during it leaves
// an unhandled rejection (porsager/postgres#1192, #1223), which shut `assay all` down as an unexpected
// error — during a failover, every process at once. Now it is a warning, and the process goes on.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { after, before, test } from "node:test";
import postgres from "postgres";
import { rejectionHandler } from "../../src/cli/serve.ts";
import { createLogger } from "../../src/log.ts";
import { cleanEnv, collect, spawnCli, watch } from "../helpers/cli.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { waitFor } from "../helpers/queue.ts";
import { startTcpProxy } from "../helpers/tcp-proxy.ts";

let db: TestDatabase;
let dataDir: string;
before(async () => {
  db = await createTestDatabase();
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-connect-faults-"));
});
after(async () => {
  await db.drop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

/** The ErrorResponse of a backend terminated by pg_terminate_backend (57P01, FATAL). */
const TERMINATED = (() => {
  const fields = Buffer.from(
    "SFATAL\0VFATAL\0C57P01\0Mterminating connection due to administrator command\0\0",
  );
  const head = Buffer.alloc(5);
  head.write("E");
  head.writeInt32BE(fields.length + 4, 1);
  return Buffer.concat([head, fields]);
})();

/**
 * A TCP proxy in front of the database that, while `state.cuts` is above 0, cuts each connection
 * whose client sends postgres.js's array-type read (the first query of every new connection): it
 * answers as a backend terminated at that moment does.
 */
async function typeReadCutter(dbUrl: string) {
  const state = { cuts: 0 };
  const proxy = await startTcpProxy(dbUrl, {
    fromClient: (chunk) => {
      if (state.cuts === 0 || !chunk.includes("typarray")) return "pass";
      state.cuts--;
      // What pg_terminate_backend sends, then the end of the connection.
      return { cutAfterSending: TERMINATED };
    },
  });
  return { ...proxy, state };
}

test("a connection that dies while postgres.js reads the array types: a warning, and assay all goes on", async () => {
  const proxy = await typeReadCutter(db.url);
  const child = spawnCli(
    ["all", "--concurrency", "1"],
    cleanEnv({ DATABASE_URL: proxy.url, ASSAY_DATA_DIR: dataDir, PORT: "0", LOG_LEVEL: "info" }),
  );
  const out = watch(child);
  const done = collect(child);
  const admin = postgres(db.url, { max: 1, onnotice: () => {} });
  try {
    const [, port] = await out.waitFor(/Server listening at http:\/\/127\.0\.0\.1:(\d+)/, 30_000);
    await out.waitFor(/"msg":"worker started"/, 30_000);
    // Every connection of the process dies, and the next one opened dies in its type read.
    proxy.state.cuts = 1;
    await admin`
      select pg_terminate_backend(pid) from pg_stat_activity
      where datname = current_database() and application_name = 'assay-all'`;
    await waitFor(async () => proxy.cuts() === 1, 30_000, "a connection cut in its type read");
    await out.waitFor(/a new database connection failed as it opened/, 30_000);
    // Still serving, with a database it can use again.
    await waitFor(
      async () => (await fetch(`http://127.0.0.1:${port}/readyz`).catch(() => undefined))?.status === 200,
      30_000,
      "/readyz to answer 200 again",
    );
    assert.equal(child.exitCode, null, "the process is still running");
    assert.doesNotMatch(out.stdout(), /shutting down after an unexpected error/);
  } finally {
    await admin.end({ timeout: 5 });
    child.kill("SIGTERM");
    await proxy.close();
  }
  const exit = await done;
  assert.equal(exit.code, 0, exit.stderr.slice(-2000));
});

test("rejectionHandler: any other unhandled rejection is still an unexpected error (passed on)", () => {
  const lines: string[] = [];
  const logger = createLogger({
    level: "warn",
    destination: new Writable({
      write(chunk, _encoding, next) {
        lines.push(chunk.toString());
        next();
      },
    }),
  });
  const failed: unknown[] = [];
  const handle = rejectionHandler(logger, (err) => failed.push(err));
  const typeRead = Object.assign(new Error("terminating connection due to administrator command"), {
    query:
      "select b.oid, b.typarray from pg_catalog.pg_type a left join pg_catalog.pg_type b on b.oid = a.typelem",
  });
  handle(typeRead);
  assert.equal(failed.length, 0);
  assert.match(lines.join(""), /a new database connection failed as it opened/);
  const other = Object.assign(new Error("a query of ours"), { query: "select * from runs" });
  for (const reason of [other, new Error("no query"), "a string", undefined]) handle(reason);
  assert.deepEqual(failed, [other, failed[1], "a string", undefined]);
  assert.equal((failed[1] as Error).message, "no query");
});
