// What `assay migrate` says it did (src/cli/migrate.ts), for every case of before / after / expected.
import assert from "node:assert/strict";
import { test } from "node:test";
import { migrationReport } from "../../src/cli/migrate.ts";

test("assay migrate's line says what was applied, and never 'all' when some are missing", () => {
  assert.equal(
    migrationReport({ before: 0, after: 14 }, 14),
    "applied 14 migrations: the database has all 14",
  );
  assert.equal(
    migrationReport({ before: 13, after: 14 }, 14),
    "applied 1 migration: the database has all 14",
  );
  assert.equal(
    migrationReport({ before: 14, after: 14 }, 14),
    "nothing to apply: the database has all 14 migrations",
  );
  assert.equal(
    migrationReport({ before: 15, after: 15 }, 14),
    "nothing applied: the database has 15 migrations, more than this release's 14 (a newer release migrated it)",
  );
  // Drizzle skips a migration older than the last one applied: the count says some are missing.
  assert.equal(
    migrationReport({ before: 12, after: 12 }, 14),
    "the database has 12 of this release's 14 migrations: 2 older than its last were not applied",
  );
});
