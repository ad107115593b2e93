// At start, a process on a local store removes partial uploads an hour old: what a process killed
// mid-upload left in `.partial/`. On a data directory several hosts share, the files' times are their
// writers' clocks, so age is judged by the database's clock and this host's alike, as the store sweep
// judges it: a host whose clock ran two hours ahead removed another host's upload under way.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import { removeStalePartialUploads } from "../../src/cli/serve.ts";
import { databaseNow } from "../../src/db/clock.ts";
import { LocalStore } from "../../src/storage/local.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { scratchDir } from "../helpers/tmp.ts";

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(async () => {
  await db.drop();
});

const HOUR = 60 * 60 * 1000;

/** A store with a partial upload written `ageMs` ago for each name. */
function storeWith(partials: Record<string, number>): { store: LocalStore; partial: string } {
  const root = scratchDir("partial-sweep-");
  const partial = path.join(root, ".partial");
  fs.mkdirSync(partial, { recursive: true });
  for (const [name, ageMs] of Object.entries(partials)) {
    const file = path.join(partial, name);
    fs.writeFileSync(file, "1,2\n");
    const at = new Date(Date.now() - ageMs);
    fs.utimesSync(file, at, at);
  }
  return { store: new LocalStore(root), partial };
}

test("a host whose clock runs two hours ahead removes only what is an hour old by the database's clock too", async () => {
  const { store, partial } = storeWith({ "under-way": HOUR / 2, "left-behind": 2 * HOUR });
  const removed = await removeStalePartialUploads(store, databaseNow(db.sql), Date.now() + 2 * HOUR);
  assert.equal(removed, 1);
  assert.deepEqual(fs.readdirSync(partial), ["under-way"]);
});

test("a database clock ahead of the host's does not hurry it either", async () => {
  // The earlier of the two clocks: this host's, an hour behind the database's here.
  const { store, partial } = storeWith({ "under-way": HOUR / 2 });
  assert.equal(await removeStalePartialUploads(store, Promise.resolve(Date.now() + HOUR), Date.now()), 0);
  assert.deepEqual(fs.readdirSync(partial), ["under-way"]);
});

test("without the database's time within two seconds nothing is removed (the store sweep ends them later)", async () => {
  const { store, partial } = storeWith({ "left-behind": 2 * HOUR });
  const started = performance.now();
  assert.equal(await removeStalePartialUploads(store, new Promise<number>(() => {})), undefined);
  assert.ok(performance.now() - started < 10_000, "it gave up in time");
  assert.equal(await removeStalePartialUploads(store, Promise.reject(new Error("ECONNREFUSED"))), undefined);
  assert.deepEqual(fs.readdirSync(partial), ["left-behind"]);
});
