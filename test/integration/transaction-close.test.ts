// A transaction whose connection closes under it (bin/patch-deps.js, postgres.js's `sql.begin`): a
// failover, `pg_terminate_backend`, a restart, a proxy's reset or the silent sweep can close a pool
// connection at any statement of a transaction. postgres.js 3.4.9 unpatched ended the process there
// (its ROLLBACK written to the nulled socket from a setImmediate: porsager/postgres#1208), left the
// connection unable to connect again (a stale write timer: every reconnect a CONNECT_TIMEOUT), failed
// the next statement with the old backend's error, and could run the dead transaction's later
// statements on the reconnected connection, outside any transaction. Here every cut — the backend
// terminated (its FATAL, then FIN), the connection ended (FIN) and reset (RST) — at every point of a
// transaction must fail that transaction's work, commit none of it, and leave the pool serving.
import assert from "node:assert/strict";
import type net from "node:net";
import { after, before, describe, test } from "node:test";
import type { TransactionSql } from "postgres";
import { createDatabase, type Database } from "../../src/db/client.ts";
import { tcpRelay, within } from "../helpers/client.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { deferred, waitFor } from "../helpers/queue.ts";

let db: TestDatabase;
const closers: (() => Promise<void> | void)[] = [];

before(async () => {
  db = await createTestDatabase();
  // A commit that takes 30 s: a deferred constraint trigger on the rows noted 'slow-commit'.
  await db.sql.unsafe(`
    create table tx_probe (id bigint primary key, note text not null);
    create function tx_probe_slow() returns trigger language plpgsql as
      $$ begin perform pg_sleep(30); return null; end $$;
    create constraint trigger tx_probe_slow after insert on tx_probe deferrable initially deferred
      for each row when (new.note = 'slow-commit') execute function tx_probe_slow();
  `);
});

after(async () => {
  for (const close of closers.reverse()) await close();
  await db.drop();
});

type Cut = "terminate" | "end" | "reset";

/** A pool of one connection (the same connection object is reused) through a relay the test cuts. */
async function cuttablePool(
  hosts = 1,
): Promise<{ database: Database; cut(how: Cut, pid: number): Promise<void> }> {
  const pairs = new Set<{ client: net.Socket; upstream: net.Socket }>();
  const relay = await tcpRelay(new URL(db.url), (client, upstream) => {
    const pair = { client, upstream };
    pairs.add(pair);
    client.pipe(upstream);
    upstream.pipe(client);
    client.on("close", () => pairs.delete(pair));
  });
  const url = new URL(db.url);
  url.port = String(relay.port);
  // With several hosts (a failover's URL: `host1:port,host2:port`), the relay's address each time.
  const address = `${url.hostname}:${relay.port}`;
  const target = url.toString().replace(`@${address}/`, `@${Array(hosts).fill(address).join(",")}/`);
  const database = createDatabase(target, { max: 1, connectTimeoutMs: 5_000 });
  closers.push(
    () => relay.close(),
    () => database.close(),
  );
  return {
    database,
    cut: async (how, pid) => {
      if (how === "terminate") {
        await db.sql`select pg_terminate_backend(${pid})`;
        return;
      }
      assert.equal(pairs.size, 1, "one connection through the relay");
      for (const { client, upstream } of pairs) {
        upstream.unpipe(client);
        client.unpipe(upstream);
        if (how === "reset") client.resetAndDestroy();
        else client.destroy(); // a FIN
        // The backend lives on until it writes: end it, so nothing of its transaction can commit.
        await db.sql`select pg_terminate_backend(${pid})`;
      }
    },
  };
}

/** Resolves once backend `pid` is running a statement matching `like`. */
async function running(pid: number, like: string): Promise<void> {
  await waitFor(
    async () =>
      (
        await db.sql`select 1 from pg_stat_activity
          where pid = ${pid} and state = 'active' and query like ${like}`
      ).length === 1,
    10_000,
    `backend ${pid} running ${like}`,
  );
}

/** `work` settled within 10 s (a hang fails the test naming `what`, instead of the whole file). */
async function settled<T>(work: Promise<T>, what: string): Promise<PromiseSettledResult<T>> {
  const [result] = await within(Promise.allSettled([work]), 10_000, `${what} to settle`);
  return result;
}

async function pidOf(t: TransactionSql): Promise<number> {
  const [row] = await t<{ pid: number }[]>`select pg_backend_pid() as pid`;
  assert.ok(row);
  return row.pid;
}

let nextId = 9_999_999_990n;

/**
 * After the cut: the pool serves the next statement on a new connection (not the old backend's error,
 * not a CONNECT_TIMEOUT), a new transaction commits, and no row of the dead transaction was committed.
 */
async function poolRecovered(database: Database, deadIds: bigint[], oldPid: number): Promise<void> {
  const next = await settled(
    database.sql<{ pid: number }[]>`select pg_backend_pid() as pid`,
    "the next statement",
  );
  assert.equal(next.status, "fulfilled", String((next as PromiseRejectedResult).reason));
  const [row] = (next as PromiseFulfilledResult<{ pid: number }[]>).value;
  assert.ok(row && row.pid !== oldPid, "the next statement runs on a new backend");
  const id = nextId++;
  const tx = await settled(
    database.sql.begin(async (t) => {
      await t`insert into tx_probe (id, note) values (${id.toString()}, 'after')`;
    }),
    "a new transaction",
  );
  assert.equal(tx.status, "fulfilled", String((tx as PromiseRejectedResult).reason));
  const found = await db.sql<{ id: string }[]>`
    select id::text from tx_probe where id = any(${[...deadIds, id].map(String)}::bigint[])`;
  assert.deepEqual(
    found.map((r) => r.id),
    [id.toString()],
    "the new transaction committed, nothing of the dead one did",
  );
}

/**
 * `sql.begin(fn)`, and fn's own outcome: postgres.js rejects the transaction as soon as its connection
 * closes, while fn may still be running (and issuing statements).
 */
function begin(
  database: Database,
  fn: (t: TransactionSql) => Promise<void>,
): { tx: Promise<unknown>; scope: Promise<void> } {
  const scope = deferred();
  const tx = database.sql.begin(async (t) => {
    try {
      await fn(t);
      scope.resolve();
    } catch (e) {
      scope.reject(e);
      throw e;
    }
  });
  // Rejections are awaited later (after the cut), not left unhandled meanwhile.
  scope.promise.catch(() => {});
  tx.catch(() => {});
  return { tx, scope: scope.promise };
}

/** Both the transaction and its scope rejected, within 10 s each; the transaction's reason. */
async function bothRejected(tx: Promise<unknown>, scope: Promise<void>): Promise<unknown> {
  const [txResult, scopeResult] = [await settled(tx, "the transaction"), await settled(scope, "its scope")];
  assert.equal(txResult.status, "rejected", "the transaction rejected");
  assert.equal(scopeResult.status, "rejected", "its scope rejected");
  return (txResult as PromiseRejectedResult).reason;
}

function closedError(e: unknown): boolean {
  const code = (e as { code?: string }).code;
  return (
    code === "CONNECTION_CLOSED" ||
    code === "ECONNRESET" ||
    code === "57P01" ||
    code === "CONNECTION_DESTROYED"
  );
}

for (const how of ["terminate", "end", "reset"] as const) {
  describe(`a transaction's connection ${how === "terminate" ? "terminated by the server" : how === "end" ? "ended (FIN)" : "reset (RST)"}`, () => {
    test("under a statement: the transaction rejects, the pool serves", async () => {
      const { database, cut } = await cuttablePool();
      const id = nextId++;
      let pid = 0;
      const started = deferred();
      const { tx, scope } = begin(database, async (t) => {
        pid = await pidOf(t);
        await t`insert into tx_probe (id, note) values (${id.toString()}, 'dead')`;
        started.resolve();
        await t`select pg_sleep(30)`;
      });
      await started.promise;
      await running(pid, "select pg_sleep%");
      await cut(how, pid);
      const reason = await bothRejected(tx, scope);
      assert.ok(closedError(reason), String(reason));
      await poolRecovered(database, [id], pid);
    });

    test("idle between statements: the next statement rejects and never runs", async () => {
      const { database, cut } = await cuttablePool();
      const [first, second] = [nextId++, nextId++];
      let pid = 0;
      const inside = deferred();
      const go = deferred();
      let secondError: unknown;
      const { tx, scope } = begin(database, async (t) => {
        pid = await pidOf(t);
        await t`insert into tx_probe (id, note) values (${first.toString()}, 'dead')`;
        inside.resolve();
        await go.promise;
        try {
          await t`insert into tx_probe (id, note) values (${second.toString()}, 'dead')`;
        } catch (e) {
          secondError = e;
          throw e;
        }
      });
      await inside.promise;
      await cut(how, pid);
      // The close is seen (postgres.js rejects the transaction then) before the transaction goes on.
      await settled(tx, "the transaction");
      // The pool makes a new connection in the same slot (max 1) for its next statement: the
      // transaction's next statement must not run there, outside any transaction.
      const [row] = await database.sql<{ pid: number }[]>`select pg_backend_pid() as pid`;
      assert.ok(row && row.pid !== pid);
      go.resolve();
      await bothRejected(tx, scope);
      assert.ok(secondError !== undefined, "the statement after the close rejected");
      assert.ok(closedError(secondError), String(secondError));
      await poolRecovered(database, [first, second], pid);
    });

    test("a closed statement caught inside the transaction: what follows rejects and commits nothing", async () => {
      const { database, cut } = await cuttablePool();
      const [first, second] = [nextId++, nextId++];
      let pid = 0;
      const sleeping = deferred();
      let caught: unknown;
      const { tx, scope } = begin(database, async (t) => {
        pid = await pidOf(t);
        await t`insert into tx_probe (id, note) values (${first.toString()}, 'dead')`;
        sleeping.resolve();
        try {
          await t`select pg_sleep(30)`;
        } catch (e) {
          caught = e;
        }
        // A caller that goes on after a failed statement: this must not run anywhere.
        await t`insert into tx_probe (id, note) values (${second.toString()}, 'dead')`;
      });
      await sleeping.promise;
      await running(pid, "select pg_sleep%");
      await cut(how, pid);
      await bothRejected(tx, scope);
      assert.ok(caught !== undefined && closedError(caught), String(caught));
      await poolRecovered(database, [first, second], pid);
    });

    test("statements queued behind the one cut: every one settles", async () => {
      const { database, cut } = await cuttablePool();
      const ids = [nextId++, nextId++, nextId++];
      let pid = 0;
      const sleeping = deferred();
      const outcomes: PromiseSettledResult<unknown>[][] = [];
      const { tx, scope } = begin(database, async (t) => {
        pid = await pidOf(t);
        // A statement's first run waits for its Describe (the connection full): the first insert waits
        // on the connection behind the sleep, the two after it in the transaction's own queue.
        const all = [
          t`select pg_sleep(30)`,
          ...ids.map((id) => t`insert into tx_probe (id, note) values (${id.toString()}, ${`dead-${id}`})`),
        ];
        sleeping.resolve();
        const each = await Promise.allSettled(all);
        outcomes.push(each);
        const failed = each.find((o) => o.status === "rejected");
        if (failed) throw failed.reason;
      });
      await sleeping.promise;
      await running(pid, "select pg_sleep%");
      await cut(how, pid);
      await bothRejected(tx, scope);
      assert.equal(outcomes.length, 1, "every statement of the transaction settled");
      assert.ok(
        outcomes[0]?.every((o) => o.status === "rejected"),
        JSON.stringify(outcomes[0]?.map((o) => o.status)),
      );
      await poolRecovered(database, ids, pid);
    });

    test("a reserved connection: its next statement rejects, the pool serves", async () => {
      // Not a transaction (Assay reserves none): a statement sent on a closed connection by a caller
      // holding it, which postgres.js wrote to the nulled socket from a setImmediate.
      const { database, cut } = await cuttablePool();
      const reserved = await database.sql.reserve();
      const [row] = await reserved<{ pid: number }[]>`select pg_backend_pid() as pid`;
      assert.ok(row);
      const sleeping = reserved`select pg_sleep(30)`;
      sleeping.catch(() => {});
      await running(row.pid, "select pg_sleep%");
      await cut(how, row.pid);
      assert.equal((await settled(sleeping, "the statement cut")).status, "rejected");
      const next = await settled(reserved`select 1`, "the next statement");
      assert.equal(next.status, "rejected");
      assert.ok(
        closedError((next as PromiseRejectedResult).reason),
        String((next as PromiseRejectedResult).reason),
      );
      await poolRecovered(database, [], row.pid);
    });

    test("a new connection's first statement, the URL naming two hosts: it rejects, the pool serves", async () => {
      // Until its first statement's ReadyForQuery a connection is in the pool's connecting queue, where
      // postgres.js's error() does nothing when the URL has another host to try.
      const { database, cut } = await cuttablePool(2);
      const first = database.sql`select pg_sleep(30), 'first statement' as tag`;
      first.catch(() => {});
      const pid = await waitFor(
        async () => {
          const [r] = await db.sql<{ pid: number }[]>`
            select pid from pg_stat_activity where query like '%''first statement''%' and pid <> pg_backend_pid()
              and state = 'active'`;
          return r?.pid;
        },
        10_000,
        "the first statement running",
      );
      await cut(how, pid);
      const result = await settled(first, "the first statement");
      assert.equal(result.status, "rejected");
      assert.ok(
        closedError((result as PromiseRejectedResult).reason),
        String((result as PromiseRejectedResult).reason),
      );
      await poolRecovered(database, [], pid);
    });

    for (const endFirst of [false, true]) {
      test(
        endFirst
          ? "a pool ending while a statement runs ends when the connection is cut"
          : "after the cut, the pool ends without a timeout",
        async () => {
          // A query that stayed the connection's current one after its close kept sql.end() waiting
          // for good (porsager/postgres#1142); an end already waiting for the statement was never told.
          const { database, cut } = await cuttablePool();
          const [row] = await database.sql<{ pid: number }[]>`select pg_backend_pid() as pid`;
          assert.ok(row);
          const sleeping = database.sql`select pg_sleep(30)`;
          sleeping.catch(() => {});
          await running(row.pid, "select pg_sleep%");
          const ending = endFirst ? database.sql.end() : undefined;
          await cut(how, row.pid);
          assert.equal((await settled(sleeping, "the statement cut")).status, "rejected");
          assert.equal((await settled(ending ?? database.sql.end(), "sql.end()")).status, "fulfilled");
        },
      );
    }

    test("under its commit: the transaction rejects, the pool serves", async () => {
      const { database, cut } = await cuttablePool();
      const id = nextId++;
      let pid = 0;
      const inside = deferred();
      const { tx } = begin(database, async (t) => {
        pid = await pidOf(t);
        await t`insert into tx_probe (id, note) values (${id.toString()}, 'slow-commit')`;
        inside.resolve();
      });
      await inside.promise;
      await running(pid, "commit");
      await cut(how, pid);
      // Its scope ended before the commit: only the transaction rejects.
      const result = await settled(tx, "the transaction");
      assert.equal(result.status, "rejected");
      const reason = (result as PromiseRejectedResult).reason;
      assert.ok(closedError(reason), String(reason));
      await poolRecovered(database, [id], pid);
    });
  });
}
