// The connection pool (postgres.js). One pool per process; LISTEN uses postgres.js's own dedicated
// connection.
//
// Queries are postgres.js tagged templates. drizzle is used for the schema and migrations only: its
// postgres-js driver rewrites the parsers and serializers of the client it wraps (dates come back as
// strings, sql.json() stops encoding), which would break every raw statement sharing that client.
import net from "node:net";
import postgres from "postgres";

export type Sql = postgres.Sql;

export interface Database {
  readonly sql: Sql;
  close(): Promise<void>;
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

/** The first pause after a connection the other end closed without a word (see pacedSocket). */
const SILENT_CLOSE_FIRST_PAUSE_MS = 25;
/** The longest such pause: the pool's connections come back within about this of the database. */
const SILENT_CLOSE_MAX_PAUSE_MS = 2_000;

/** pacedSocket's factory, with what ends it. */
export interface PacedSocket {
  (o: { host: string[]; port: number[]; path?: string | false }): Promise<net.Socket>;
  /** Cancels a pause in progress and refuses later connections: the pool is ending. */
  stop(): void;
}

/** A socket that pacedSocket handed out, and the host it went to. */
interface Handed {
  socket: net.Socket;
  host: number;
}

/**
 * postgres.js's `socket` option for a pool: connections made to the pool's host (or socket path), but
 * paced after connections that ended before the other end sent a byte. postgres.js (3.4.9,
 * connection.js `closed`) makes a connection closed that way again at once, without its backoff, while
 * a query waits: against a proxy or port forward with nothing behind it, a process made over a
 * thousand connections a second, for as long as it lasted, at ~15% of a core. After n such ends in a
 * row (across the pool) the next connection waits 25 ms × 2^(n-1), at most 2 s, with jitter; one that
 * has read anything ends the pause. Refused connections (an error) are not counted: postgres.js rejects
 * the waiting queries and backs off itself. A connection postgres.js gave up on (its connect timeout)
 * counts, as does the connection of a query cancellation (the server closes it without a word; Assay
 * cancels none).
 *
 * The sockets are judged when the next is asked for, not by listeners: postgres.js removes every
 * listener of the plain socket when it wraps it in TLS (`secure`). With several hosts in the URL, each
 * connection goes to the host the last one that ended went to, and to the next after one ended without
 * a byte — as postgres.js moves on from a host that failed.
 */
export function pacedSocket(): PacedSocket {
  let silentEnds = 0;
  let host = 0;
  let stopped = false;
  const handed: Handed[] = [];
  const pauses = new Set<{ timer: NodeJS.Timeout; cancel: () => void }>();
  const judge = () => {
    for (let i = 0; i < handed.length; ) {
      const h = handed[i] as Handed;
      if (h.socket.bytesRead > 0) silentEnds = 0;
      else if (h.socket.destroyed) {
        if (!h.socket.errored) silentEnds++;
        host = h.host + 1;
      } else {
        i++;
        continue;
      }
      handed.splice(i, 1);
    }
  };
  const refuse = () => new Error("the pool is ending: no new connection");
  const paced = async (o: { host: string[]; port: number[]; path?: string | false }) => {
    // Before anything else: postgres.js adds its listeners once this promise resolves, and an error
    // net.connect reports at once (ENETUNREACH, EADDRNOTAVAIL) is emitted on the next tick — which runs
    // after the microtasks this await belongs to, so after postgres.js listens. Called synchronously
    // from postgres.js's timer, it was an unhandled 'error' event that ended the process.
    await null;
    if (stopped) throw refuse();
    judge();
    if (silentEnds > 0) {
      const pause = Math.min(SILENT_CLOSE_MAX_PAUSE_MS, SILENT_CLOSE_FIRST_PAUSE_MS * 2 ** (silentEnds - 1));
      await new Promise<void>((resolve, reject) => {
        const p = {
          timer: setTimeout(
            () => {
              pauses.delete(p);
              resolve();
            },
            pause * (0.5 + Math.random() / 2),
          ),
          cancel: () => reject(refuse()),
        };
        pauses.add(p);
      });
    }
    let socket: net.Socket & { host?: string; port?: number };
    const i = host % Math.max(1, o.host.length);
    if (o.path) socket = net.connect(o.path);
    else {
      const name = o.host[i] as string;
      const port = (o.port[i] ?? o.port[0]) as number;
      // host and port: postgres.js's errors name them.
      socket = Object.assign(net.connect(port, name), { host: name, port });
    }
    handed.push({ socket, host: i });
    return socket;
  };
  return Object.assign(paced, {
    stop: () => {
      stopped = true;
      for (const p of pauses) {
        clearTimeout(p.timer);
        p.cancel();
      }
      pauses.clear();
    },
  });
}

/** Ends `sql`, first stopping its pacedSocket (a pause in progress would connect after the end). */
export function endPool(sql: Sql, timeoutSeconds: number): Promise<void> {
  (sql.options as { socket?: Partial<PacedSocket> }).socket?.stop?.();
  return sql.end({ timeout: timeoutSeconds });
}

export function createDatabase(url: string, options: PoolOptions = {}): Database {
  // postgres.js reads `socket` (connection.js createSocket) but its types do not declare it.
  const paced = { socket: pacedSocket() };
  const sql = postgres(url, {
    ...paced,
    max: options.max ?? 10,
    onnotice: () => {},
    ...(options.connectTimeoutMs === undefined ? {} : { connect_timeout: options.connectTimeoutMs / 1000 }),
    connection: { application_name: options.applicationName ?? "assay" },
  });
  return { sql, close: () => endPool(sql, 5) };
}

/** firstAnswer's failure when the database gave no answer in time. */
export class NoAnswerError extends Error {
  override name = "NoAnswerError";
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
  let timer: NodeJS.Timeout | undefined;
  const end = () => void endPool(sql, 0);
  signal?.addEventListener("abort", end, { once: true });
  try {
    await Promise.race([
      sql`select 1`,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          // First: the query's own CONNECTION_DESTROYED, which follows, would say less.
          reject(new NoAnswerError(`the database at ${where(sql)} gave no answer within ${ms / 1000} s`));
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
  return typeof query === "string" && query.includes("pg_catalog.pg_type") && query.includes("typarray");
}
