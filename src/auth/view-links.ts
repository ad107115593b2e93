// View links: short-lived URLs that show one output of one run, for what cannot send an Authorization
// header — an <iframe> showing an HTML report. A blob: URL cannot do it: a document made from one
// inherits the dashboard's own Content-Security-Policy, which blocks the report's inline styles; a
// document the server sends carries its own policy (a sandbox, its styles allowed, nothing fetched).
//
// A link names the token it was made with and is signed with that token's stored hash as the key
// (HMAC-SHA256 over what it shows and when it expires). It is not the token: it shows one output, for
// a few minutes, and stops working when the token is revoked. Nothing is stored to make or check one,
// so any API instance checks a link any other made.
import { createHmac, timingSafeEqual } from "node:crypto";
import type { Sql } from "../db/client.ts";
import type { Principal, Role } from "./tokens.ts";

/** How long a view link works. The dashboard makes a new one each time it shows a report. */
export const VIEW_LINK_TTL_SECONDS = 600;
/**
 * How far ahead of this instance's clock another instance's may be: a link it minted a moment ago
 * expires up to this much later than one minted here, and is still valid (behind a load balancer
 * the dashboard's frame loads from whichever instance answers).
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

/** The path of a view link: `/view/<tokenId>.<taskId>.<runId>.<expires>.<mac>/<name>`. */
export function viewLinkPath(
  tokenId: number,
  tokenHash: string,
  t: ViewTarget,
  now = Date.now(),
): { path: string; expiresAt: string } {
  const expires = Math.floor(now / 1000) + VIEW_LINK_TTL_SECONDS;
  const link = `${tokenId}.${t.taskId}.${t.runId}.${expires}.${mac(tokenHash, t, expires)}`;
  return {
    path: `/view/${link}/${encodeURIComponent(t.name)}`,
    expiresAt: new Date(expires * 1000).toISOString(),
  };
}

/**
 * The principal and target of a view link, or undefined when it is malformed, expired, altered, or
 * its token is unknown or revoked (all alike: the caller answers 404).
 */
export async function viewLinkCheck(
  sql: Sql,
  link: string,
  name: string,
  now = Date.now(),
): Promise<{ principal: Principal; target: ViewTarget } | undefined> {
  const m = LINK_SHAPE.exec(link);
  if (!m) return undefined;
  const [, tokenId, taskId, runId, expiresText, given] = m as unknown as string[];
  const expires = Number(expiresText);
  const nowSeconds = Math.floor(now / 1000);
  // Expired from `expires` on, to the millisecond: compared in whole seconds, a link still worked for
  // up to a second after the expiresAt it was made with.
  if (expires * 1000 <= now || expires > nowSeconds + VIEW_LINK_TTL_SECONDS + CLOCK_SKEW_SECONDS)
    return undefined;
  const [row] = await sql<{ tokenHash: string; userId: number; name: string; role: Role }[]>`
    select t.token_hash as "tokenHash", u.id::float8 as "userId", u.name, u.role
    from api_tokens t join users u on u.id = t.user_id
    where t.id = ${tokenId as string} and t.revoked_at is null`;
  if (!row) return undefined;
  const target = { taskId: taskId as string, runId: runId as string, name };
  const expected = Buffer.from(mac(row.tokenHash, target, expires));
  const actual = Buffer.from(given as string);
  if (expected.length !== actual.length || !timingSafeEqual(expected, actual)) return undefined;
  return { principal: { userId: row.userId, name: row.name, role: row.role }, target };
}
