// The database's clock: the one every host shares. Hosts' own clocks may be minutes apart (NTP not yet
// synced after boot, a VM resumed), so a time one host writes and another judges is taken from here.
import type { Sql } from "./client.ts";

/** The database's `now()`, ms since the epoch. */
export async function databaseNow(sql: Sql): Promise<number> {
  const [row] = await sql<{ ms: number }[]>`select extract(epoch from now())::float8 * 1000 as ms`;
  return (row as { ms: number }).ms;
}
