// View links: short-lived URLs that show one output of one run, for what cannot send an Authorization
// header — an <iframe> showing an HTML report. A blob: URL cannot do it: a document made from one
// inherits the dashboard's own Content-Security-Policy, which blocks the report's inline styles; a
// document the server sends carries its own policy (a sandbox, its styles allowed, nothing fetched).
//
// A link names the token it was made with and is signed with that token's stored hash as the key
// (HMAC-SHA256 over what it shows and when it expires). It is not the token: it shows one output, for
// a few minutes (never past the token's own expiry), and stops working when the token is revoked or
// expires. Nothing is stored to make or check one,
// so any API instance checks a link any other made. A link is checked on the database's clock, the
// one every instance shares (databaseNow() in src/db/clock.ts gives it to the one that makes a link): an instance whose
// own clock was behind took an expired link for a live one, and a fresh one for one made too far
// ahead; one whose clock was ahead took every link for expired.
//
// Download links are made and checked the same way, for what must not go through fetch: a download the
// browser saves itself, streamed to disk (a zip of several GB read with fetch is held whole in the tab's
// memory). One names a task's download, its results.csv, a run's download or one output of a run, and
// is served as an attachment from /view/download/…, under /view/ so that its path stays out of the log
// as a view link's does (src/log.ts).
import { createHmac, timingSafeEqual } from "node:crypto";
import type { Sql } from "../db/client.ts";
import type { Authenticated, Role } from "./tokens.ts";

/** How long a view link works. The dashboard makes a new one each time it shows a report. */
export const VIEW_LINK_TTL_SECONDS = 600;
/**
 * How far ahead of the database's clock the clock a link was made by may be: such a link expires up to
 * this much later than one made on the database's clock, and is still valid (an instance that makes
 * links from its own clock rather than databaseNow()'s).
 */
const CLOCK_SKEW_SECONDS = 60;

export interface ViewTarget {
  taskId: string;
  runId: string;
  name: string;
}

const ID = "[1-9][0-9]{0,14}";
const LINK_SHAPE = new RegExp(`^(${ID})\\.(${ID})\\.(${ID})\\.([0-9]{1,12})\\.([A-Za-z0-9_-]{43})$`);

function mac(key: string, t: ViewTarget, expires: number): string {
  return createHmac("sha256", key)
    .update(`assay view link\n${t.taskId}\n${t.runId}\n${t.name}\n${expires}`)
    .digest("base64url");
}

/**
 * A link's expiry, in Unix seconds: `ttlSeconds` from `now`, or the token's own expiry (`tokenExpires`,
 * ms since the epoch) when that comes first — the link stops working then anyway.
 */
function linkExpiry(now: number, ttlSeconds: number, tokenExpires: number | undefined): number {
  const expires = Math.floor(now / 1000) + ttlSeconds;
  return tokenExpires === undefined ? expires : Math.min(expires, Math.floor(tokenExpires / 1000));
}

/**
 * The path of a view link: `/view/<tokenId>.<taskId>.<runId>.<expires>.<mac>/<name>`; it expires with
 * the token (`tokenExpires`, ms since the epoch) if that comes first. `now` and `tokenExpires` should
 * be on the database's clock (databaseNow()), which the link is checked by.
 */
export function viewLinkPath(
  tokenId: number,
  tokenHash: string,
  t: ViewTarget,
  now = Date.now(),
  tokenExpires?: number,
): { path: string; expiresAt: string } {
  const expires = linkExpiry(now, VIEW_LINK_TTL_SECONDS, tokenExpires);
  const link = `${tokenId}.${t.taskId}.${t.runId}.${expires}.${mac(tokenHash, t, expires)}`;
  return {
    path: `/view/${link}/${encodeURIComponent(t.name)}`,
    expiresAt: new Date(expires * 1000).toISOString(),
  };
}

/**
 * The principal (with its token's id and expiry) and target of a view link, or undefined when it is
 * malformed, expired, altered, or its token is unknown, revoked or expired (all alike: the caller
 * answers 404). Expired by the database's clock, or by `now` (ms since the epoch) when given.
 */
export async function viewLinkCheck(
  sql: Sql,
  link: string,
  name: string,
  now?: number,
): Promise<{ principal: Authenticated; target: ViewTarget } | undefined> {
  const m = LINK_SHAPE.exec(link);
  if (!m) return undefined;
  const [, tokenId, taskId, runId, expiresText, given] = m as unknown as string[];
  const target = { taskId: taskId as string, runId: runId as string, name };
  const expires = Number(expiresText);
  const principal = await signedBy(
    sql,
    tokenId as string,
    expires,
    VIEW_LINK_TTL_SECONDS,
    now,
    given as string,
    (key) => mac(key, target, expires),
  );
  return principal && { principal, target };
}

/**
 * The principal of the token `tokenId` when `given` is the MAC `macOf` makes with its key, the token is
 * live (neither revoked nor expired), and the link has not expired (nor expires later than one made
 * now could) by the database's clock, or by `now` when given; undefined otherwise.
 */
async function signedBy(
  sql: Sql,
  tokenId: string,
  expires: number,
  ttlSeconds: number,
  now: number | undefined,
  given: string,
  macOf: (key: string) => string,
): Promise<Authenticated | undefined> {
  // The token's time left is counted from before the question (as tokenAuthenticate does).
  const asked = performance.now();
  const [row] = await sql<
    { tokenHash: string; userId: number; name: string; role: Role; leftMs: number | null; at: number }[]
  >`
    select t.token_hash as "tokenHash", u.id::float8 as "userId", u.name, u.role,
           extract(epoch from t.expires_at - now())::float8 * 1000 as "leftMs",
           extract(epoch from now())::float8 * 1000 as at
    from api_tokens t join users u on u.id = t.user_id
    where t.id = ${tokenId} and t.revoked_at is null and (t.expires_at is null or t.expires_at > now())`;
  if (!row) return undefined;
  // The database's clock, not this instance's: the link may have been made by another instance.
  const at = now ?? row.at;
  // Expired from `expires` on, to the millisecond: compared in whole seconds, a link still worked for
  // up to a second after the expiresAt it was made with.
  if (expires * 1000 <= at || expires > Math.floor(at / 1000) + ttlSeconds + CLOCK_SKEW_SECONDS)
    return undefined;
  const expected = Buffer.from(macOf(row.tokenHash));
  const actual = Buffer.from(given);
  if (expected.length !== actual.length || !timingSafeEqual(expected, actual)) return undefined;
  const principal: Authenticated = {
    userId: row.userId,
    name: row.name,
    role: row.role,
    tokenId: Number(tokenId),
  };
  if (row.leftMs !== null) principal.deadline = asked + row.leftMs;
  return principal;
}

/**
 * How long a download link works: long enough to start the download, and for the browser to resume
 * one the network broke (a resume asks the same URL again). A download under way is not cut off when
 * its link expires — only when its token is revoked or expires (downloads.ts).
 */
export const DOWNLOAD_LINK_TTL_SECONDS = 300;

/**
 * What a download link saves: a task's download (`task`: its zip, or its one file), its results table
 * (`results`), one run's download (`run`) or one output of a run by name (`output`). `name` is the
 * link's last path segment — for `output` the output's, for the others what the browser would save it
 * as, the response's Content-Disposition having the last word — and is signed like the rest.
 */
export type DownloadTarget =
  | { kind: "task"; taskId: string; name: string }
  | { kind: "results"; taskId: string; name: string }
  | { kind: "run"; taskId: string; runId: string; name: string }
  | { kind: "output"; taskId: string; runId: string; name: string };

const DOWNLOAD_SHAPE = new RegExp(
  `^(${ID})\\.(task|results|run|output)\\.(${ID})(?:\\.(${ID}))?\\.([0-9]{1,12})\\.([A-Za-z0-9_-]{43})$`,
);

/** The MAC of a download link: over a JSON array of everything it grants, so no two read alike. */
function downloadMac(key: string, t: DownloadTarget, expires: number): string {
  const runId = "runId" in t ? t.runId : null;
  return createHmac("sha256", key)
    .update(JSON.stringify(["assay download link", t.kind, t.taskId, runId, t.name, expires]))
    .digest("base64url");
}

/**
 * The path of a download link: `/view/download/<tokenId>.<kind>.<taskId>[.<runId>].<expires>.<mac>/<name>`
 * (a run only for `run` and `output`); `now` and `tokenExpires` as for viewLinkPath().
 */
export function downloadLinkPath(
  tokenId: number,
  tokenHash: string,
  t: DownloadTarget,
  now = Date.now(),
  tokenExpires?: number,
): { path: string; expiresAt: string } {
  const expires = linkExpiry(now, DOWNLOAD_LINK_TTL_SECONDS, tokenExpires);
  const run = "runId" in t ? `.${t.runId}` : "";
  const link = `${tokenId}.${t.kind}.${t.taskId}${run}.${expires}.${downloadMac(tokenHash, t, expires)}`;
  return {
    path: `/view/download/${link}/${encodeURIComponent(t.name)}`,
    expiresAt: new Date(expires * 1000).toISOString(),
  };
}

/**
 * The principal (with its token's id and expiry) and target of a download link, or undefined when it
 * is malformed, expired, altered, or its token is unknown, revoked or expired (all alike: the caller
 * answers 404). Expired by the database's clock, or by `now` (ms since the epoch) when given.
 */
export async function downloadLinkCheck(
  sql: Sql,
  link: string,
  name: string,
  now?: number,
): Promise<{ principal: Authenticated; target: DownloadTarget } | undefined> {
  const m = DOWNLOAD_SHAPE.exec(link);
  if (!m) return undefined;
  const [, tokenId, kind, taskId, runId, expiresText, given] = m as unknown as (string | undefined)[];
  const perRun = kind === "run" || kind === "output";
  if (perRun !== (runId !== undefined)) return undefined;
  const target = (perRun ? { kind, taskId, runId, name } : { kind, taskId, name }) as DownloadTarget;
  const expires = Number(expiresText);
  const principal = await signedBy(
    sql,
    tokenId as string,
    expires,
    DOWNLOAD_LINK_TTL_SECONDS,
    now,
    given as string,
    (key) => downloadMac(key, target, expires),
  );
  return principal && { principal, target };
}
