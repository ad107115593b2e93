// The connection pool (postgres.js) and its drizzle wrapper. One pool per process; the LISTEN
// connection of the event hub is separate (it arrives with the events issue).
import { drizzle, type PostgresJsDatabase } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import * as schema from "./schema.ts";

export type Sql = postgres.Sql;
export type Db = PostgresJsDatabase<typeof schema>;

export interface Database {
  readonly sql: Sql;
  readonly db: Db;
  close(): Promise<void>;
}

export interface PoolOptions {
  max?: number;
  applicationName?: string;
}

/**
 * A timestamp from a query as ISO 8601. drizzle installs pass-through parsers for date types on the
 * shared postgres.js client, so raw queries see PostgreSQL's text form, not a Date.
 */
export function isoTime(value: string | Date): string {
  return new Date(value).toISOString();
}

export function createDatabase(url: string, options: PoolOptions = {}): Database {
  const sql = postgres(url, {
    max: options.max ?? 10,
    onnotice: () => {},
    connection: { application_name: options.applicationName ?? "assay" },
  });
  const db = drizzle(sql, { schema });
  return {
    sql,
    db,
    close: () => sql.end({ timeout: 5 }),
  };
}
