// A server command whose database connections die as they open. postgres.js (3.4.9) reads the array
// types on each new connection and drops that read's promise: a connection that dies during it leaves
// an unhandled rejection (porsager/postgres#1192, #1223), which shut `assay all` down as an unexpected
// error — during a failover, every process at once. Now it is a warning, and the process goes on.
// And start-up against a database that cannot be reached: it is waited for with a warning each attempt
// (`worker`, `all`; `api` listens meanwhile, not ready), or fails after 30 s (`migrate`, `token`),
// where it hung without a word.
//
// `assay migrate` and `assay token` also bound their first query (firstAnswer) at 30 s. A database that
// authenticates and then never answers that query is ended at the bound while postgres.js is reading
// the array types, a read whose promise it drops (droppedTypeRead): the commands crashed on that
// unhandled CONNECTION_DESTROYED with a stack, instead of saying that the database gave no answer.
// And a database slow to wake (a paused serverless one resuming in 15–30 s) is waited for: with a
// 10 s bound a deploy script's `assay migrate` failed where it used to succeed.
//
// The three tests that wait out those bounds (30 s, 30 s, a 15 s wake) run side by side with each
// other and with the rest of the file, which runs one test at a time: one after another they held a
// slot of `make test` for 80 s. Nothing they do touches another test's processes or database rows.
import assert from "node:assert/strict";
import { once } from "node:events";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { after, before, describe, test } from "node:test";
import postgres from "postgres";
import { databaseMayComeUp, rejectionHandler } from "../../src/cli/serve.ts";
import { NoAnswerError } from "../../src/db/client.ts";
import { createLogger } from "../../src/log.ts";
import { type CliResult, cleanEnv, collect, exitWithin, runCli, spawnCli, watch } from "../helpers/cli.ts";
import { within } from "../helpers/client.ts";
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

/**
 * Two database addresses that never answer. `closingUrl` takes each connection and closes it as soon
 * as the client speaks (a proxy or port forward with no database behind it: postgres.js made such a
 * connection again at once, for ever, and start-up waited on it without a word) — until `state.relay`
 * is set, when it passes connections on to the real database (it came up). `silentUrl` takes each
 * connection and never reads nor answers (a hung server).
 */
async function deafDatabase(dbUrl: string) {
  const state = { relay: false };
  const proxy = await startTcpProxy(dbUrl, { fromClient: () => (state.relay ? "pass" : "cut") });
  const sockets = new Set<net.Socket>();
  const silent = net.createServer((socket) => {
    sockets.add(socket);
    socket.on("error", () => {});
    socket.on("close", () => sockets.delete(socket));
  });
  silent.listen(0, "127.0.0.1");
  await once(silent, "listening");
  const silentUrl = new URL(dbUrl);
  silentUrl.port = String((silent.address() as net.AddressInfo).port);
  silentUrl.pathname = "/assay_ünï_10000000000";
  return {
    state,
    closingUrl: proxy.url,
    silentUrl: silentUrl.toString(),
    close: async () => {
      for (const s of sockets) s.destroy();
      silent.close();
      await proxy.close();
    },
  };
}

/** The HTTP status of GET `url`, or 0 when nothing answers. */
async function statusOf(url: string): Promise<number> {
  try {
    return (await fetch(url, { signal: AbortSignal.timeout(5_000) })).status;
  } catch {
    return 0;
  }
}

interface Relay {
  readonly url: string;
  /** How many connections the database has authenticated (sent its first ReadyForQuery on). */
  readonly ready: () => number;
  close(): void;
}

/** Listens on 127.0.0.1 and calls `onConnection` with each client and a socket to the database. */
async function relay(
  dbUrl: string,
  onConnection: (client: net.Socket, server: net.Socket) => void,
): Promise<Omit<Relay, "ready">> {
  const upstream = new URL(dbUrl);
  const sockets = new Set<net.Socket>();
  const listener = net.createServer((client) => {
    const server = net.connect(Number(upstream.port), upstream.hostname);
    for (const s of [client, server]) {
      sockets.add(s);
      s.on("close", () => {
        sockets.delete(s);
        client.destroy();
        server.destroy();
      });
      s.on("error", () => {});
    }
    onConnection(client, server);
  });
  await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
  const url = new URL(dbUrl);
  url.port = String((listener.address() as net.AddressInfo).port);
  return {
    url: url.toString(),
    close: () => {
      for (const s of sockets) s.destroy();
      listener.close();
    },
  };
}

/**
 * A database that passes start-up and authentication and then holds every query: once the server has
 * sent its first ReadyForQuery ('Z'; each server message is a type byte and an int32 length that
 * counts itself), nothing more the client sends reaches it.
 */
async function stallAfterAuthentication(dbUrl: string): Promise<Relay> {
  let ready = 0;
  const r = await relay(dbUrl, (client, server) => {
    let authenticated = false;
    let unread = Buffer.alloc(0);
    server.on("data", (chunk: Buffer) => {
      for (unread = Buffer.concat([unread, chunk]); !authenticated && unread.length >= 5; ) {
        const end = 1 + unread.readInt32BE(1);
        if (unread.length < end) break;
        if (unread[0] === 0x5a) {
          authenticated = true;
          ready++;
        }
        unread = unread.subarray(end);
      }
      client.write(chunk);
    });
    client.on("data", (chunk: Buffer) => {
      if (!authenticated) server.write(chunk);
    });
  });
  return { ...r, ready: () => ready };
}

/** A database that takes `ms` to wake: each connection is passed on only that long after it opens. */
async function slowToWake(dbUrl: string, ms: number): Promise<Relay> {
  let ready = 0;
  const r = await relay(dbUrl, (client, server) => {
    client.pause();
    server.pause();
    setTimeout(() => {
      ready++;
      client.pipe(server);
      server.pipe(client);
    }, ms);
  });
  return { ...r, ready: () => ready };
}

const commandEnv = (url: string) => cleanEnv({ DATABASE_URL: url, ASSAY_DATA_DIR: dataDir });

/** Runs `assay <args>` and how long it took, failing when it runs past `ms`. */
async function timed(args: string[], url: string, ms: number): Promise<CliResult & { ms: number }> {
  const t0 = performance.now();
  const r = await within(runCli(args, commandEnv(url)), ms, `assay ${args.join(" ")}`);
  return { ...r, ms: performance.now() - t0 };
}

describe("databases that fail, stall or are slow as a command connects", { concurrency: 4 }, () => {
  describe("server commands, one test at a time", { concurrency: 1 }, () => {
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

    test("a database that closes every connection unanswered: worker and all say `database unreachable; waiting` and start when it answers; api listens meanwhile, not ready", async () => {
      const deaf = await deafDatabase(db.url);
      const children = (["api", "worker", "all"] as const).map((mode) => {
        const dir = fs.mkdtempSync(path.join(dataDir, `${mode}-`));
        const child = spawnCli(
          mode === "api" ? [mode] : [mode, "--concurrency", "1"],
          cleanEnv({ DATABASE_URL: deaf.closingUrl, ASSAY_DATA_DIR: dir, PORT: "0", LOG_LEVEL: "info" }),
        );
        return { mode, child, out: watch(child), done: collect(child) };
      });
      try {
        let api = "";
        for (const { mode, out } of children) {
          if (mode === "api") {
            // Listening whatever the database does (a liveness probe keeps it), its caches off until
            // they can listen (each LISTEN waits at most 10 s), and not ready.
            const [, address] = (await out.waitFor(
              /Server listening at (http:\/\/[\d.:]+)/,
              30_000,
            )) as string[];
            api = address as string;
            assert.equal(await statusOf(`${api}/healthz`), 200);
            assert.equal(await statusOf(`${api}/readyz`), 503);
            continue;
          }
          // Each attempt waits at most 10 s for an answer; the line says why, never the password.
          const [line] = await out.waitFor(/.*"msg":"database unreachable; waiting".*/, 30_000);
          assert.match(line, /"level":40/, mode);
          assert.match(line, /"reason":"the database at 127\.0\.0\.1:\d+ gave no answer within 10 s"/, mode);
          assert.match(line, /"retryInMs":\d+/, mode);
          const { password } = new URL(db.url);
          assert.ok(password === "" || !line.includes(password), `${mode}: the password is in ${line}`);
          assert.doesNotMatch(out.stdout(), /Server listening|worker started/, mode);
        }
        // The database comes up: each process starts by itself, and the API becomes ready.
        deaf.state.relay = true;
        for (const { mode, out } of children) {
          if (mode === "api") continue;
          await out.waitFor(/"msg":"database reachable"/, 30_000);
          await out.waitFor(/"msg":"worker started"/, 30_000);
        }
        await waitFor(async () => (await statusOf(`${api}/readyz`)) === 200, 30_000);
      } finally {
        for (const { child } of children) child.kill("SIGTERM");
      }
      for (const { mode, done } of children) {
        const exit = await done;
        assert.equal(exit.code, 0, `${mode}: ${exit.stderr.slice(-2000)}`);
      }
      await deaf.close();
    });

    test("a refused database: assay worker, and assay api --dev-token (its token needs the database), wait for it (the worker exited 1 at once, and a supervisor's start limit could leave it down)", async () => {
      // A port nothing listens on: taken and released.
      const server = net.createServer();
      server.listen(0, "127.0.0.1");
      await once(server, "listening");
      const { port } = server.address() as net.AddressInfo;
      await new Promise((resolve) => server.close(resolve));
      for (const args of [
        ["worker", "--concurrency", "1"],
        ["api", "--dev-token"],
      ]) {
        const what = `assay ${args.join(" ")}`;
        const child = spawnCli(
          args,
          cleanEnv({
            DATABASE_URL: `postgres://assay:pw@127.0.0.1:${port}/assay`,
            ASSAY_DATA_DIR: dataDir,
            PORT: "0",
            LOG_LEVEL: "info",
          }),
        );
        const out = watch(child);
        const exited = exitWithin(child, 60_000, what);
        // Two attempts, each saying why: it stays up.
        await out.waitFor(
          /"msg":"database unreachable; waiting"[\s\S]*"msg":"database unreachable; waiting"/,
          30_000,
        );
        assert.match(out.stdout(), /"reason":"[^"]*ECONNREFUSED/, what);
        assert.equal(child.exitCode, null, what);
        child.kill("SIGTERM");
        const exit = await exited;
        assert.equal(exit.code, 0, `${what}: ${exit.stderr}`);
      }
    });

    test("a database whose answer is an error that time does not mend (a wrong password) is not waited for: exit 1 naming it", async () => {
      const wrongPassword = new URL(db.url);
      wrongPassword.password = "not-the-password";
      for (const [what, url, cause] of [
        ["a wrong password", wrongPassword, /password|authentication/i],
      ] as const) {
        const exit = await exitWithin(
          spawnCli(
            ["worker", "--concurrency", "1"],
            cleanEnv({ DATABASE_URL: url.toString(), ASSAY_DATA_DIR: dataDir }),
          ),
          30_000,
          `assay worker with ${what}`,
        );
        assert.equal(exit.code, 1, `${what}: ${exit.stderr}`);
        assert.doesNotMatch(exit.stdout, /database unreachable; waiting/, what);
        assert.match(exit.stderr, cause, what);
      }
    });

    test("databaseMayComeUp: start-up waits out what time may mend, not a wrong password or a certificate", () => {
      const pg = (code: string) => Object.assign(new Error(code), { name: "PostgresError", code });
      const node = (code: string) => Object.assign(new Error(code), { code });
      for (const err of [
        new NoAnswerError("the database at db:5432 gave no answer within 10 s"),
        node("ECONNREFUSED"),
        node("ENOENT"), // a socket file not there yet
        node("EAI_AGAIN"),
        node("ENOTFOUND"),
        node("ECONNRESET"),
        node("EADDRNOTAVAIL"),
        node("CONNECT_TIMEOUT"),
        node("CONNECTION_CLOSED"),
        pg("57P03"),
        pg("57P01"),
        pg("53300"),
        pg("08006"),
      ])
        assert.equal(databaseMayComeUp(err), true, (err as Error).message);
      for (const err of [
        pg("28P01"), // a wrong password
        pg("3D000"), // no such database
        pg("42P01"),
        node("ERR_TLS_CERT_ALTNAME_INVALID"),
        node("CERT_HAS_EXPIRED"),
        node("DEPTH_ZERO_SELF_SIGNED_CERT"),
        node("SASL_SIGNATURE_MISMATCH"),
        new Error("no code"),
        undefined,
      ])
        assert.equal(databaseMayComeUp(err), false, String((err as Error | undefined)?.message));
    });

    test("SIGTERM while start-up waits between attempts for a database that does not answer: exits 0 at once", async () => {
      const deaf = await deafDatabase(db.url);
      try {
        const child = spawnCli(
          ["worker"],
          cleanEnv({ DATABASE_URL: deaf.closingUrl, ASSAY_DATA_DIR: dataDir, PORT: "0", LOG_LEVEL: "info" }),
        );
        const out = watch(child);
        const exited = exitWithin(child, 60_000, "assay worker");
        await out.waitFor(/"msg":"database unreachable; waiting"/, 30_000);
        const t0 = Date.now();
        child.kill("SIGTERM");
        const exit = await exited;
        assert.equal(exit.code, 0, exit.stderr);
        assert.match(exit.stdout, /"msg":"stopped"/);
        assert.ok(Date.now() - t0 < 5_000, `took ${Date.now() - t0} ms to stop`);
      } finally {
        await deaf.close();
      }
    });
  });

  test("assay migrate and assay token against a database that never answers: exit 1 after 30 s, saying so", async () => {
    const deaf = await deafDatabase(db.url);
    try {
      const runs = [
        ["migrate", "closing", deaf.closingUrl],
        ["migrate", "silent", deaf.silentUrl],
        ["token list", "closing", deaf.closingUrl],
        ["token revoke 10000000000", "silent", deaf.silentUrl],
      ].map(async ([args, kind, url]) => {
        const what = `assay ${args} against the ${kind} database`;
        const exit = await exitWithin(
          spawnCli((args as string).split(" "), cleanEnv({ DATABASE_URL: url, ASSAY_DATA_DIR: dataDir })),
          45_000,
          what,
        );
        assert.equal(exit.code, 1, `${what}: ${exit.stderr}`);
        assert.match(exit.stderr, /the database at 127\.0\.0\.1:\d+ gave no answer within 30 s/, what);
        const { password } = new URL(db.url);
        assert.ok(password === "" || !exit.stderr.includes(password), `${what}: the password is printed`);
      });
      await Promise.all(runs);
    } finally {
      await deaf.close();
    }
    // Unchanged: a refused port still fails at once with its own cause.
    const refused = await runCli(["migrate"], cleanEnv({ DATABASE_URL: "postgres://x:y@127.0.0.1:1/none" }));
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /ECONNREFUSED/);
  });

  test("assay migrate and assay token against a database that authenticates, then never answers: exit 1 after 30 s saying so, no crash", async () => {
    const stalled = await stallAfterAuthentication(db.url);
    try {
      const runs = await Promise.all(
        [["migrate"], ["token", "list"], ["token", "revoke", "10000000000"]].map(async (args) => ({
          args: args.join(" "),
          r: await timed(args, stalled.url, 60_000),
        })),
      );
      assert.ok(stalled.ready() >= runs.length, `each was authenticated: ${stalled.ready()}`);
      for (const { args, r } of runs) {
        assert.equal(r.code, 1, `${args}: ${r.stderr}`);
        // The message firstAnswer gives (with its code), alone: not postgres.js's CONNECTION_DESTROYED
        // and its stack.
        assert.match(
          r.stderr,
          /^assay: the database at 127\.0\.0\.1:\d+ gave no answer within 30 s( \([A-Z_]+\))?\n$/,
          args,
        );
        assert.ok(r.ms >= 29_000 && r.ms < 45_000, `${args}: exited after ${Math.round(r.ms)} ms`);
      }
    } finally {
      stalled.close();
    }
  });

  test("assay migrate and assay token wait for a database that takes 15 s to wake", async () => {
    const slow = await slowToWake(db.url, 15_000);
    try {
      const [migrated, created] = await Promise.all([
        timed(["migrate"], slow.url, 60_000),
        timed(["token", "create", "--user", "søren «réveil» 𝔘"], slow.url, 60_000),
      ]);
      assert.equal(migrated.code, 0, migrated.stderr);
      assert.match(migrated.stdout, /^nothing to apply: the database has all \d+ migrations\n$/);
      assert.equal(created.code, 0, created.stderr);
      assert.match(created.stdout, /^token \d+ for user søren «réveil» 𝔘 \(role user\);/);
      for (const r of [migrated, created]) assert.ok(r.ms >= 15_000, `answered after ${Math.round(r.ms)} ms`);
    } finally {
      slow.close();
    }
  });
});
