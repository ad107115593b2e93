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
