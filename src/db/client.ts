// The connection pool (postgres.js). One pool per process; LISTEN uses postgres.js's own dedicated
// connection.
//
// Queries are postgres.js tagged templates. drizzle is used for the schema and migrations only: its
// postgres-js driver rewrites the parsers and serializers of the client it wraps (dates come back as
// strings, sql.json() stops encoding), which would break every raw statement sharing that client.
import net from "node:net";
import postgres from "postgres";
import { POSTGRES_PATCH } from "../../bin/patch-deps.js";
import { Conversation } from "./wire.ts";

export type Sql = postgres.Sql;

export interface Database {
  readonly sql: Sql;
  close(): Promise<void>;
  /**
   * Resolves when the database answers a query on a connection of its own within `ms`, opened
   * whatever the pool is doing (a pool whose connections are all busy is no sign of an outage); rejects
   * with the failure, or NoAnswerError. The connection is closed either way. (DatabaseGate's probe.)
   * With `pids`, the answer is pg_stat_activity's of those backends (the probe of silent pool
   * connections), or null when the pids BackendKeyData names are not pg_stat_activity's (the probe's
   * own is not: a pooler in between, or TLS, where no pid is read); else empty.
   */
  answers?(ms: number, pids?: readonly number[]): Promise<BackendStates | null>;
  /**
   * Ends the backends named (`pg_terminate_backend`), each only while its `backend_start` is still the
   * one named (its pid not taken again) and it is a client backend of this role, on a connection of
   * its own within `ms`; how many it ended.
   * For a silent pool connection closed while its backend lives on (idle in a transaction, holding
   * its locks, until the server's keepalive ends it: two hours by default).
   */
  endBackends?(ms: number, backends: readonly { pid: number; start: string }[]): Promise<number>;
}

/**
 * What pg_stat_activity says of some backends, by process id: `state` (null for another role's),
 * `waitEvent`, and how long ago the backend started (`ageMs`, on the server's clock). A backend
 * missing there has ended, or is another server's.
 */
export type BackendStates = ReadonlyMap<number, BackendState>;

export interface BackendState {
  state: string | null;
  waitEvent: string | null;
  ageMs: number | null;
  /** `backend_start` as PostgreSQL prints it (null for another role's): the session's identity. */
  start: string | null;
  /**
   * A client backend of this role (a superuser, or a member of pg_read_all_stats, sees other roles'
   * sessions' states too).
   */
  own: boolean;
}

export interface PoolOptions {
  max?: number;
  applicationName?: string;
  /**
   * How long a connection may take to open (postgres.js's default: 30 s). A client that firstAnswer()
   * bounds gives BOUNDED_CONNECT_MS: a connection still opening when it ends stays open until then
   * (the end sends the other side a Terminate, which a database that never answers never acts on),
   * and so does the process. (`assay migrate` and `assay token`: COMMAND_CONNECT_MS, src/db/migrate.ts.)
   */
  connectTimeoutMs?: number;
  /** Keeps connections for good (postgres.js ends each after 30–60 minutes by default). */
  keepConnections?: true;
}

/** A timestamp from a query (Date, or text from a JSON aggregate) as ISO 8601. */
export function isoTime(value: string | Date): string {
  return new Date(value).toISOString();
}

/**
 * SQL that formats a timestamptz column exactly as isoTime() does (`2026-12-01T06:00:00.123Z`), for
 * values that leave PostgreSQL as JSON text, where its own format (microseconds, `+00:00`) would
 * otherwise reach clients. `column` is a trusted identifier, never user input.
 */
export function isoTimeSql(sql: Pick<Sql, "unsafe">, column: string) {
  return sql.unsafe(`to_char(${column} at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`);
}

/**
 * Connections a pool may make at once (pacedSocket), at least: a pool's own maximum and its LISTEN
 * connection come back together after a restart, and a burst of demand opens up to the maximum.
 */
const CONNECT_BURST = 12;
/** Connections a pool makes a second at most, once its burst is spent. */
const CONNECTS_PER_SECOND = 2;

/** pacedSocket's mark(): each confirmed open connection and what it had read. */
export type ReadMark = ReadonlyMap<net.Socket, number>;

/**
 * What pacedSocket reads of the options postgres.js hands a `socket` factory (connection.js
 * createSocket): where to connect, and `onnotify`, set only on the client postgres.js makes for
 * `sql.listen` (with the pool's options, `socket` included).
 */
interface ConnectOptions {
  host: string[];
  port: number[];
  path?: string | false;
  onnotify?: unknown;
}

/** A pool connection that silent() found owed an answer and reading nothing. */
export interface SilentConnection {
  /** Its backend's process id. */
  readonly pid: number;
  readonly socket: net.Socket;
  /** Its socket's bytesRead when found. */
  readonly read: number;
  /** Since when it has been owed an answer and read nothing (performance.now()). */
  readonly since: number;
  /** Node still holds bytes written to it (a large statement still going out, or a path that takes none). */
  readonly sending: boolean;
  /**
   * How long ago its start-up named its backend (BackendKeyData read, ms): the backend is at least
   * this old (the connect before — DNS, handshake, a proxy's own dial — is left out).
   */
  readonly age: number;
}

/** pacedSocket's factory, with what ends it and what it has seen of its connections. */
export interface PacedSocket {
  (o: ConnectOptions): Promise<net.Socket>;
  /** Cancels a wait in progress and refuses later connections: the pool is ending. */
  stop(): void;
  /**
   * When the oldest connection asked for since the last confirm() was asked for (performance.now()),
   * or null: none since. A pool asks for connections when it grows, renews one, or loses one — and, in
   * an outage, over and over. (DatabaseGate reads it on every API request: it must stay this cheap.)
   */
  unconfirmedSince(): number | null;
  /**
   * The database answered something asked at `before` (performance.now()): every
   * connection asked for so far is confirmed, and every one open that was made before `before`.
   */
  confirm(before: number): void;
  /**
   * What the pool's confirmed connections open now have read (answeredSince's mark). A connection
   * still opening is left out (its TLS handshake, or a FATAL refusing it, is no answer), and so is the
   * LISTEN client's (only paced here).
   */
  mark(): ReadMark;
  /**
   * Whether the database has answered on a connection of `mark` since: a byte read, on a connection
   * that had reached it (a statement's rows or end). Counts under TLS too (the plain
   * socket's `bytesRead` counts what the TLS socket reads through it).
   */
  answeredSince(mark: ReadMark): boolean;
  /**
   * The pool's plain connections owed an answer (a statement written, its ReadyForQuery not read; or
   * a Flush written, nothing read since), inside a transaction or not, that have read nothing for `ms` or
   * longer, with their backends' process ids: a long statement, or a connection that stopped
   * answering without closing (DatabaseGate's probes and SilentSweep, src/db/silent.ts, look their
   * backends up).
   */
  silent(ms: number): SilentConnection[];
  /**
   * Destroys `c`'s socket if it has still read nothing since silent() found it (postgres.js then
   * fails its queries at once, CONNECTION_CLOSED, and makes another connection when asked). Whether
   * it did.
   */
  drop(c: SilentConnection): boolean;
  /** The backend process ids of the plain connections open now, as their BackendKeyData named them. */
  pids(): number[];
  /** Connections waiting for their turn now. */
  readonly waiting: number;
}

/** The error of a connection asked for after the pool's end (postgres.js's own code for it). */
class PoolEndedError extends Error {
  readonly code = "CONNECTION_ENDED";
}

/**
 * postgres.js's `socket` option for a pool: connections made as postgres.js makes them (TCP to the
 * pool's hosts in turn, or the socket path), at most `burst` at once and CONNECTS_PER_SECOND after
 * that (a token bucket). postgres.js makes some connections again at once, without its backoff, for as
 * long as they keep ending that way: one the other end closes before the database answers (a proxy or
 * port forward with nothing behind it; a TLS proxy that completes its handshake and then closes; 3.4.9,
 * connection.js `closed`), a standby refused under `target_session_attrs`, and, with several hosts in
 * the URL, refused ones. A process made over a thousand connections a second, for as long as it lasted,
 * at ~15% of a core. A pool makes few connections when all is well (its maximum, then one per
 * `max_lifetime` each), so the bound is not felt then; the queries waiting in an outage run on the
 * first connection after it.
 *
 * The connect runs after an await: postgres.js adds its listeners once this promise resolves, and an
 * error net.connect reports at once (ENETUNREACH) is emitted on the next tick, after the microtasks
 * this await belongs to. Called synchronously from postgres.js's timer, that was an unhandled 'error'
 * event that ended the process.
 */
export function pacedSocket(burst = CONNECT_BURST): PacedSocket {
  let tokens = burst;
  let refilledAt = performance.now();
  let next = 0;
  let stopped = false;
  let firstAsked: number | null = null;
  const waits = new Set<{ timer: NodeJS.Timeout; cancel: () => void }>();
  const paced = async (o: ConnectOptions) => {
    // The LISTEN client's connection is paced with the pool's and otherwise left out: it is not the
    // pool (a notification arriving on it, or its start-up answered, says nothing of whether the
    // pool's connections can be made or answer).
    const pooled = !o.onnotify;
    if (pooled) firstAsked ??= performance.now();
    await null;
    for (;;) {
      if (stopped) throw new PoolEndedError("the pool is ending: no new connection");
      const now = performance.now();
      tokens = Math.min(burst, tokens + ((now - refilledAt) / 1000) * CONNECTS_PER_SECOND);
      refilledAt = now;
      if (tokens >= 1) break;
      // Until a whole token is back, with jitter, so the pools of a fleet do not come back in step.
      const ms = ((1 - tokens) / CONNECTS_PER_SECOND) * 1000 * (1 + Math.random() / 2);
      await new Promise<void>((resolve, reject) => {
        const w = {
          timer: setTimeout(() => {
            waits.delete(w);
            resolve();
          }, ms),
          cancel: () => reject(new PoolEndedError("the pool is ending: no new connection")),
        };
        waits.add(w);
      });
    }
    tokens -= 1;
    const keep = (socket: net.Socket) => (pooled ? watched(socket) : socket);
    if (o.path) return keep(net.connect(o.path));
    const i = next++ % Math.max(1, o.host.length);
    const host = o.host[i] as string;
    const port = (o.port[i] ?? o.port[0]) as number;
    // host and port: postgres.js's errors name them.
    return keep(Object.assign(net.connect(port, host), { host, port }));
  };
  // Connections made here and not yet seen destroyed (pruned on each ask and look), when each was
  // made, and those that have reached the database (`confirmed`). Pruned by `destroyed`: postgres.js
  // removes every listener of a socket it hands to TLS, so a `close` listener cannot be relied on.
  const open = new Map<net.Socket, number>();
  const confirmed = new WeakSet<net.Socket>();
  const prune = () => {
    for (const socket of open.keys()) if (socket.destroyed) open.delete(socket);
  };
  // The database answered something asked at `before` or later: every ask is confirmed, and the
  // connections made before then (one still opening at the time may be among them: a pooler holding it).
  const confirm = (before: number) => {
    firstAsked = null;
    for (const [socket, madeAt] of open) if (madeAt < before) confirmed.add(socket);
  };
  // Each pool connection's conversation (src/db/wire.ts): a ReadyForQuery read means the database
  // answered on this connection — a start-up done, a statement done — and it is confirmed, it alone;
  // its backend's pid and the answers it is owed tell silent() which have stopped answering. Plain
  // connections only (under TLS the plain socket's listeners are removed when the TLS socket takes it
  // over, and it carries ciphertext; confirm() comes from the gate's answered probe there).
  const talks = new WeakMap<net.Socket, Conversation>();
  const watched = (socket: net.Socket) => {
    prune();
    open.set(socket, performance.now());
    const talk = new Conversation(() => {
      firstAsked = null;
      confirmed.add(socket);
    });
    talks.set(socket, talk);
    // postgres.js writes Buffers (a string would be the caller's encoding: not followed).
    const write = socket.write;
    socket.write = function (this: net.Socket, chunk: unknown, ...rest: unknown[]) {
      if (Buffer.isBuffer(chunk)) talk.wrote(chunk);
      else talk.lose();
      return (write as (...args: unknown[]) => boolean).call(this, chunk, ...rest);
    } as typeof socket.write;
    return socket.on("data", (chunk: Buffer) => talk.got(chunk));
  };
  const pacer = Object.assign(paced, {
    unconfirmedSince: () => firstAsked,
    confirm,
    mark: (): ReadMark => {
      prune();
      const mark = new Map<net.Socket, number>();
      for (const socket of open.keys()) if (confirmed.has(socket)) mark.set(socket, socket.bytesRead);
      return mark;
    },
    silent: (ms: number): SilentConnection[] => {
      prune();
      const now = performance.now();
      const found: SilentConnection[] = [];
      for (const socket of open.keys()) {
        const talk = talks.get(socket);
        // Inside a transaction too: with bin/patch-deps.js's patches, a transaction whose connection
        // closes fails its statements (CONNECTION_CLOSED) and sends none of them elsewhere; unpatched,
        // postgres.js 3.4.9 ended the process (porsager/postgres#1208).
        if (talk?.pid === undefined || talk.lost || !talk.waiting) continue;
        if (now - talk.movedAt < ms) continue;
        found.push({
          pid: talk.pid,
          socket,
          read: socket.bytesRead,
          since: talk.movedAt,
          sending: socket.writableLength > 0,
          age: now - talk.keyAt,
        });
      }
      return found;
    },
    pids: () => {
      prune();
      const pids: number[] = [];
      for (const socket of open.keys()) {
        const pid = talks.get(socket)?.pid;
        if (pid !== undefined) pids.push(pid);
      }
      return pids;
    },
    drop: (c: SilentConnection) => {
      if (c.socket.destroyed || c.socket.bytesRead !== c.read) return false;
      // A reset, not a FIN: what the kernel still holds unsent (a statement, a COMMIT) is dropped with
      // it, and cannot reach the database later, when the path heals.
      try {
        c.socket.resetAndDestroy();
      } catch {
        c.socket.destroy(); // not TCP (a Unix socket): no reset to send
      }
      return true;
    },
    answeredSince: (mark: ReadMark) => {
      for (const [socket, read] of mark) if (socket.bytesRead > read) return true;
      return false;
    },
    stop: () => {
      stopped = true;
      for (const w of waits) {
        clearTimeout(w.timer);
        w.cancel();
      }
      waits.clear();
    },
  });
  return Object.defineProperty(pacer, "waiting", { get: () => waits.size }) as PacedSocket;
}

/**
 * Ends `sql`, first stopping its pacedSocket: a wait in progress would connect after the end. The
 * refusal reaches postgres.js on a later turn, before the end looks at the connections (else the end
 * waits out its whole timeout for a connection that was still opening).
 */
export async function endPool(sql: Sql, timeoutSeconds: number): Promise<void> {
  (sql.options as { socket?: Partial<PacedSocket> }).socket?.stop?.();
  await new Promise((resolve) => setImmediate(resolve));
  await sql.end({ timeout: timeoutSeconds });
}

/**
 * Refuses a postgres.js that bin/patch-deps.js did not patch (installed with --ignore-scripts, by hand,
 * or patched by another version of that file): without its patches, a transaction whose connection
 * closes under a statement ends the process (porsager/postgres#1208) or strands its pool slot.
 */
export function assertPostgresPatched(): void {
  const mark = (postgres as unknown as { assayPatch?: unknown }).assayPatch;
  if (mark !== POSTGRES_PATCH) {
    throw new Error(
      `postgres.js is not patched (${mark === undefined ? "no mark" : `mark ${String(mark)}`}, want ${POSTGRES_PATCH}): ` +
        "run `node bin/patch-deps.js` (npm ci runs it), then rebuild (`make bundle`)",
    );
  }
}

export function createDatabase(url: string, options: PoolOptions = {}): Database {
  assertPostgresPatched();
  // postgres.js reads `socket` (connection.js createSocket) but its types do not declare it.
  const max = options.max ?? 10;
  const paced = { socket: pacedSocket(Math.max(CONNECT_BURST, max + 2)) };
  const sql = postgres(url, {
    ...paced,
    max,
    onnotice: () => {},
    ...(options.connectTimeoutMs === undefined ? {} : { connect_timeout: options.connectTimeoutMs / 1000 }),
    connection: { application_name: options.applicationName ?? "assay" },
    ...(options.keepConnections ? { max_lifetime: null } : {}),
  });
  /** A client of one connection of its own (`socket`), opened within about `ms`: the probes'. */
  const probeClient = (socket: PacedSocket, ms: number): Sql =>
    postgres(url, {
      ...{ socket },
      max: 1,
      onnotice: () => {},
      fetch_types: false,
      connect_timeout: (ms + 1000) / 1000,
      connection: { application_name: options.applicationName ?? "assay" },
    });
  return {
    sql,
    close: () => endPool(sql, 5),
    answers: async (ms, pids) => {
      const probeSocket = pacedSocket(1);
      const probe = probeClient(probeSocket, ms);
      try {
        if (pids === undefined || pids.length === 0) {
          await firstAnswer(probe, ms);
          return new Map();
        }
        // The pids inline (int32s read from BackendKeyData; anything else is left out): with a
        // parameter, postgres.js would Describe the statement first, a round trip more.
        const list = pids.filter((pid) => Number.isSafeInteger(pid)).join(",") || "null";
        const rows = await answerWithin(probe, ms, () =>
          probe.unsafe<
            {
              pid: number | null;
              state: string | null;
              waitEvent: string | null;
              ageMs: number | null;
              start: string | null;
              own: boolean | null;
              self: number;
            }[]
          >(`select pid, state, wait_event as "waitEvent",
                    (extract(epoch from clock_timestamp() - backend_start) * 1000)::float8 as "ageMs",
                    backend_start::text as start,
                    (usename = session_user and backend_type = 'client backend') as own,
                    pg_backend_pid() as self
             from pg_stat_activity where pid in (${list})
             union all select null, null, null, null, null, null, pg_backend_pid()`),
        );
        // The pids BackendKeyData names are pg_stat_activity's only when nothing stands between: a
        // pooler (PgBouncer) sends a key of its own, and nothing can be judged by them then.
        const self = rows.find((r) => r.pid === null)?.self;
        if (self === undefined || !probeSocket.pids().includes(self)) return null;
        return new Map(
          rows.flatMap(({ pid, state, waitEvent, ageMs, start, own }) =>
            pid === null ? [] : [[pid, { state, waitEvent, ageMs, start, own: own === true }]],
          ),
        );
      } finally {
        await endPool(probe, 0);
      }
    },
    endBackends: async (ms, backends) => {
      if (backends.length === 0) return 0;
      const probe = probeClient(pacedSocket(1), ms);
      try {
        // Materialized: pg_terminate_backend runs only for the rows the join kept (a condition on
        // pg_stat_activity alone could be evaluated while scanning it, for every backend).
        const [row] = await answerWithin(
          probe,
          ms,
          () => probe<{ ended: number }[]>`
            with named as materialized (
              select a.pid from pg_stat_activity a
              join jsonb_to_recordset(${probe.json(backends.map(({ pid, start }) => ({ pid, start })))})
                as t(pid int4, start timestamptz)
                on a.pid = t.pid and a.backend_start = t.start
              where a.usename = session_user and a.backend_type = 'client backend'
            )
            select (count(*) filter (where pg_terminate_backend(pid)))::int as ended from named`,
        );
        return row?.ended ?? 0;
      } finally {
        await endPool(probe, 0);
      }
    },
  };
}

/** firstAnswer's failure when the database gave no answer in time. */
export class NoAnswerError extends Error {
  override name = "NoAnswerError";
}

/** postgres.js's own codes for a connection that timed out, or was closed or cut. */
export const CONNECTION_LOST: ReadonlySet<string> = new Set([
  "CONNECT_TIMEOUT",
  "CONNECTION_CLOSED",
  "CONNECTION_DESTROYED",
  "CONNECTION_ENDED",
]);

/** An error of the database's: a statement it refused, or a connection to it that failed. */
export const isDatabaseError = (err: unknown): boolean =>
  (err instanceof Error && err.name === "PostgresError") || connectionFailed(err);

/**
 * Whether a query failed because its connection did, not because the database refused the statement:
 * one of postgres.js's CONNECTION_LOST (the pool's own, for a query or not), or its error for a query
 * (it names the query, `query`) that is an errno (`ECONNREFUSED`, `ECONNRESET`, `ETIMEDOUT`…) or a
 * FATAL or PANIC of PostgreSQL's (its shutdown, too many connections: a connection ended); or no
 * answer in time (NoAnswerError). An ERROR of PostgreSQL's is its answer to the statement, class 08
 * included (08P01, a protocol violation the server reports): not this.
 */
export function connectionFailed(err: unknown): boolean {
  if (err instanceof NoAnswerError) return true;
  if (!(err instanceof Error)) return false;
  const { name, code, severity } = err as { name: string; code?: unknown; severity?: unknown };
  if (typeof code !== "string") return false;
  if (name !== "PostgresError" && CONNECTION_LOST.has(code)) return true;
  if (!("query" in err)) return false;
  if (name === "PostgresError") return severity === "FATAL" || severity === "PANIC";
  return /^E[A-Z]+$/.test(code);
}
/** How long a first query waits for the database to answer before it counts as not answering. */
export const DB_ANSWER_MS = 10_000;
/** The connect timeout of a client that firstAnswer() bounds: just after it, so its message wins. */
export const BOUNDED_CONNECT_MS = DB_ANSWER_MS + 1_000;

/**
 * Runs `select 1` on `sql` and waits at most `ms` for it: resolves when the database answers, and
 * otherwise rejects with the query's error, or — when it never answers (a firewall that drops packets,
 * an address nothing answers at, a proxy with no database behind it) — ends `sql` at once and rejects
 * with "the database at host:port gave no answer within 10 s". postgres.js alone is no bound: its
 * connect timeout (30 s) is restarted on each attempt, and a connection that the other end closes
 * before the database answers is made again, for ever, at once, with the query still waiting (3.4.9,
 * connection.js `closed`). `signal` ends `sql` too, and the wait with it.
 */
export async function firstAnswer(sql: Sql, ms = DB_ANSWER_MS, signal?: AbortSignal): Promise<void> {
  await answerWithin(sql, ms, () => sql`select 1`, signal);
}

/** firstAnswer() with a query of the caller's instead of `select 1`: its answer. */
async function answerWithin<T>(
  sql: Sql,
  ms: number,
  query: () => Promise<T>,
  signal?: AbortSignal,
): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const end = () => void endPool(sql, 0);
  signal?.addEventListener("abort", end, { once: true });
  try {
    return await Promise.race([
      query(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          // First: the query's own CONNECTION_DESTROYED, which follows, would say less.
          const err = new NoAnswerError(`the database at ${where(sql)} gave no answer within ${ms / 1000} s`);
          // Its stack formatted now: unformatted, its call sites hold this timer's closure, `sql`
          // and all, for as long as the error is kept (the database gate keeps a probe's).
          void err.stack;
          reject(err);
          end();
        }, ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", end);
  }
}

/** Where `sql` connects: its socket path, or each host:port, as postgres.js's own errors say it. */
function where(sql: Sql): string {
  const { path, host, port } = sql.options as { path?: string | false; host: string[]; port: number[] };
  return path || host.map((h, i) => `${h}:${port[i] ?? port[0]}`).join(",");
}

/**
 * The error of the array-type read postgres.js (3.4.9) makes on each new connection before its first
 * query, whose promise it drops: when the connection dies during that read (a failover, a restart, a
 * terminated backend), the rejection is unhandled (porsager/postgres#1192, #1223) — and an unhandled
 * rejection shuts a server command down as an unexpected error. The connection is made again on the
 * next query, so the process itself is fine. Told apart by the query postgres.js attaches to it.
 */
export function droppedTypeRead(err: unknown): boolean {
  const query = typeof err === "object" && err !== null ? (err as { query?: unknown }).query : undefined;
  if (typeof query !== "string") return false;
  // Its read of the session's state (with `target_session_attrs`), made the same way and dropped too.
  return (
    (query.includes("pg_catalog.pg_type") && query.includes("typarray")) ||
    (query.includes("show transaction_read_only") && query.includes("pg_is_in_recovery"))
  );
}
