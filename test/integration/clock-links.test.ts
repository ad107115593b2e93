// View and download links on API instances whose clocks disagree with the database's: a link is made by
// one instance and checked by whichever answers next, so it is checked on the database's clock, the one
// they share. An instance's own clock is moved here by replacing Date.now (what the checks read when
// given no time, as the /view routes call them).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { tokenCreate } from "../../src/auth/tokens.ts";
import {
  DOWNLOAD_LINK_TTL_SECONDS,
  downloadLinkCheck,
  downloadLinkPath,
  VIEW_LINK_TTL_SECONDS,
  viewLinkCheck,
  viewLinkPath,
} from "../../src/auth/view-links.ts";
import type { Sql } from "../../src/db/client.ts";
import { databaseNow } from "../../src/db/clock.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";

let db: TestDatabase;
let tokenId: number;
let hash: string;

before(async () => {
  db = await createTestDatabase();
  tokenId = (await tokenCreate(db.sql, "clocks")).tokenId;
  const [row] = await db.sql<
    { hash: string }[]
  >`select token_hash as hash from api_tokens where id = ${tokenId}`;
  hash = row?.hash as string;
});
after(() => db.drop());

const TEN_MINUTES = 10 * 60_000;

/** Runs `fn` on a host whose wall clock is `offsetMs` off the database's (and this machine's). */
async function onHostClock<T>(offsetMs: number, fn: () => Promise<T>): Promise<T> {
  const real = Date.now;
  Date.now = () => real.call(Date) + offsetMs;
  try {
    return await fn();
  } finally {
    Date.now = real;
  }
}

/** The two kinds of link: made at `now` (ms, database clock), checked as the /view routes check them. */
const kinds: {
  kind: string;
  ttlSeconds: number;
  make: (now: number) => { path: string; expiresAt: string };
  check: (sql: Sql, path: string) => Promise<unknown>;
}[] = [
  {
    kind: "view link",
    ttlSeconds: VIEW_LINK_TTL_SECONDS,
    make: (now) => viewLinkPath(tokenId, hash, { taskId: "7", runId: "8", name: "report.html" }, now),
    check: (sql, path) => {
      const [, , link = "", name = ""] = path.split("/");
      return viewLinkCheck(sql, link, decodeURIComponent(name));
    },
  },
  {
    kind: "download link",
    ttlSeconds: DOWNLOAD_LINK_TTL_SECONDS,
    make: (now) => downloadLinkPath(tokenId, hash, { kind: "task", taskId: "7", name: "task-7.zip" }, now),
    check: (sql, path) => {
      const [, , , link = "", name = ""] = path.split("/");
      return downloadLinkCheck(sql, link, decodeURIComponent(name));
    },
  },
];

for (const { kind, ttlSeconds, make, check } of kinds) {
  test(`${kind}: a fresh link works on an instance whose clock is ten minutes behind or ahead`, async () => {
    const { path } = make(await databaseNow(db.sql));
    for (const offset of [-TEN_MINUTES, TEN_MINUTES]) {
      // Behind, it read as made too far ahead to be genuine; ahead, as expired: 404 either way.
      assert.ok(await onHostClock(offset, () => check(db.sql, path)), `clock off by ${offset / 1000} s`);
    }
  });

  test(`${kind}: expired by the database's clock, it is refused on an instance whose clock is behind`, async () => {
    // Made its lifetime and a second ago: expired a second ago.
    const { path } = make((await databaseNow(db.sql)) - (ttlSeconds + 1) * 1000);
    assert.equal(await check(db.sql, path), undefined, "expired");
    // Behind by ten minutes, the instance took it for one with nine minutes left.
    assert.equal(await onHostClock(-TEN_MINUTES, () => check(db.sql, path)), undefined, "expired everywhere");
    // And one made as far ahead as a link never is, refused on an instance whose clock is ahead.
    const far = make((await databaseNow(db.sql)) + TEN_MINUTES);
    assert.equal(await onHostClock(TEN_MINUTES, () => check(db.sql, far.path)), undefined, "too far ahead");
  });
}
