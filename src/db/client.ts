// The connection pool (postgres.js). One pool per process; LISTEN uses postgres.js's own dedicated
// connection.
//
// Queries are postgres.js tagged templates. drizzle is used for the schema and migrations only: its
// postgres-js driver rewrites the parsers and serializers of the client it wraps (dates come back as
// strings, sql.json() stops encoding), which would break every raw statement sharing that client.
import postgres from "postgres";

export type Sql = postgres.Sql;

export interface Database {
  readonly sql: Sql;
  close(): Promise<void>;
}

export interface PoolOptions {
  max?: number;
  applicationName?: string;
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

export function createDatabase(url: string, options: PoolOptions = {}): Database {
  const sql = postgres(url, {
    max: options.max ?? 10,
    onnotice: () => {},
    connection: { application_name: options.applicationName ?? "assay" },
  });
  return { sql, close: () => sql.end({ timeout: 5 }) };
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
