// `assay migrate` and `assay token` bound their first query (firstAnswer) at 30 s. A database that
// authenticates and then never answers that query is ended at the bound while postgres.js is reading
// the array types, a read whose promise it drops (droppedTypeRead): the commands crashed on that
// unhandled CONNECTION_DESTROYED with a stack, instead of saying that the database gave no answer.
// And a database slow to wake (a paused serverless one resuming in 15–30 s) is waited for: with a
// 10 s bound a deploy script's `assay migrate` failed where it used to succeed.
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";
import { type CliResult, cleanEnv, runCli } from "../helpers/cli.ts";
import { within } from "../helpers/client.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { scratchDir } from "../helpers/tmp.ts";

let db: TestDatabase;
let dataDir: string;
before(async () => {
  db = await createTestDatabase();
  dataDir = scratchDir("assay-first-query-stall-");
});
after(async () => {
  await db.drop();
});

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

const env = (url: string) => cleanEnv({ DATABASE_URL: url, ASSAY_DATA_DIR: dataDir });

/** Runs `assay <args>` and how long it took, failing when it runs past `ms`. */
async function timed(args: string[], url: string, ms: number): Promise<CliResult & { ms: number }> {
  const t0 = performance.now();
  const r = await within(runCli(args, env(url)), ms, `assay ${args.join(" ")}`);
  return { ...r, ms: performance.now() - t0 };
}

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
