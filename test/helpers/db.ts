// Each test file gets its own database, cloned from the migrated template that test/run.ts made.
import { randomBytes } from "node:crypto";
import postgres from "postgres";
import { createDatabase, type Database } from "../../src/db/client.ts";

export interface TestDatabase extends Database {
  readonly url: string;
  /** Closes the pool and drops the database. */
  drop(): Promise<void>;
}

function env(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run tests through \`make test\` or \`npx tsx test/run.ts <files>\``);
  }
  return value;
}

export async function createTestDatabase(): Promise<TestDatabase> {
  const adminUrl = env("ASSAY_TEST_ADMIN_URL");
  const name = `assay_t_${env("ASSAY_TEST_RUN")}_${randomBytes(5).toString("hex")}`;
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    await admin`create database ${admin(name)} template ${admin(env("ASSAY_TEST_TEMPLATE"))}`;
  } finally {
    await admin.end({ timeout: 5 });
  }
  const u = new URL(adminUrl);
  u.pathname = `/${name}`;
  const url = u.toString();
  const database = createDatabase(url, { max: 5 });
  return {
    ...database,
    url,
    drop: async () => {
      await database.close();
      const a = postgres(adminUrl, { max: 1, onnotice: () => {} });
      try {
        await a`drop database if exists ${a(name)} with (force)`;
      } finally {
        await a.end({ timeout: 5 });
      }
    },
  };
}

/**
 * A database migrated up to, not including, migration `tag`: drizzle's own migrator over a copy of
 * migrations/ (in `scratch`) whose journal stops there — the schema of a release before `tag`, for
 * tests of what the code does on a database not migrated for it (and of `assay migrate` applying it).
 */
export async function createTestDatabaseBefore(tag: string, scratch: string): Promise<TestDatabase> {
  const [fs, path, { MIGRATIONS_DIR }] = await Promise.all([
    import("node:fs"),
    import("node:path"),
    import("../../src/db/migrate.ts"),
  ]);
  const db = await createTestDatabase();
  await db.sql`drop schema public cascade`;
  await db.sql`drop schema drizzle cascade`;
  await db.sql`create schema public`;
  const folder = fs.mkdtempSync(path.join(scratch, "migrations-"));
  fs.cpSync(MIGRATIONS_DIR, folder, { recursive: true });
  const journalFile = path.join(folder, "meta", "_journal.json");
  const journal = JSON.parse(fs.readFileSync(journalFile, "utf8")) as { entries: { tag: string }[] };
  const at = journal.entries.findIndex((e) => e.tag === tag);
  if (at <= 0) throw new Error(`${tag} is not a migration after the first in the journal`);
  journal.entries = journal.entries.slice(0, at);
  fs.writeFileSync(journalFile, JSON.stringify(journal));
  const [{ drizzle }, { migrate }] = await Promise.all([
    import("drizzle-orm/postgres-js"),
    import("drizzle-orm/postgres-js/migrator"),
  ]);
  const sql = postgres(db.url, { max: 1, onnotice: () => {} });
  try {
    await migrate(drizzle(sql), { migrationsFolder: folder });
  } finally {
    await sql.end({ timeout: 5 });
  }
  return db;
}
