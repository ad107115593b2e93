// API tokens: random secrets shown once, stored only as their SHA-256.
import { createHash, randomBytes } from "node:crypto";
import type { Sql } from "../db/client.ts";
import { TOKENS_CHANNEL, type TokenCache } from "./token-cache.ts";

export type Role = "admin" | "user";
export const ROLES: readonly Role[] = ["admin", "user"];

export interface Principal {
  userId: number;
  name: string;
  role: Role;
}

/** A principal as authenticated by a bearer token, with the token's id. */
export interface Authenticated extends Principal {
  tokenId: number;
  /**
   * When the token expires, on the monotonic clock (performance.now(), ms); absent for a token that
   * never does. Never later than the database's expiry: taken from the time left that the database
   * answered, counted from before the question was sent.
   */
  deadline?: number;
}

/** The longest a token may be made to last (`token create --expires-in`): ten years. */
export const MAX_TOKEN_LIFETIME_SECONDS = 3650 * 86_400;

/**
 * `principal`'s token expiry as a wall-clock time (ms since the epoch), for what is shown or signed
 * (a link's expiry); undefined when it never expires.
 */
export function wallClockDeadline(principal: { deadline?: number }, now = Date.now()): number | undefined {
  return principal.deadline === undefined ? undefined : now + (principal.deadline - performance.now());
}

const TOKEN_PREFIX = "assay_";
/** 32 random bytes → 43 URL-safe characters. */
const TOKEN_BYTES = 32;
const TOKEN_SHAPE = /^assay_[A-Za-z0-9_-]{43}$/;

export function hashToken(token: string): string {
  return createHash("sha256").update(token).digest("hex");
}

export function generateToken(): string {
  return TOKEN_PREFIX + randomBytes(TOKEN_BYTES).toString("base64url");
}

export interface CreatedToken {
  tokenId: number;
  userId: number;
  role: Role;
  token: string;
  /** When it expires (ISO), or null: never. */
  expiresAt: string | null;
}

/**
 * Creates the user when it does not exist (role defaults to `user`), or changes its role when one is
 * given, then issues a new token for it — one that expires `expiresInSeconds` from now (the
 * database's), or never.
 */
export async function tokenCreate(
  sql: Sql,
  userName: string,
  role?: Role,
  expiresInSeconds?: number,
): Promise<CreatedToken> {
  if (
    expiresInSeconds !== undefined &&
    !(expiresInSeconds > 0 && expiresInSeconds <= MAX_TOKEN_LIFETIME_SECONDS)
  )
    throw new RangeError(`a token's lifetime must be over 0 and at most ${MAX_TOKEN_LIFETIME_SECONDS} s`);
  const token = generateToken();
  return sql.begin(async (tx) => {
    const [user] = role
      ? await tx<{ id: number; role: Role }[]>`
          insert into users (name, role) values (${userName}, ${role})
          on conflict (name) do update set role = excluded.role
          returning id::float8, role`
      : await tx<{ id: number; role: Role }[]>`
          insert into users (name) values (${userName})
          on conflict (name) do update set name = excluded.name
          returning id::float8, role`;
    if (!user) throw new Error("user upsert returned no row");
    const [row] = await tx<{ id: number; expiresAt: Date | null }[]>`
      insert into api_tokens (user_id, token_hash, expires_at)
      values (${user.id}, ${hashToken(token)},
              now() + ${expiresInSeconds ?? null}::float8 * interval '1 second')
      returning id::float8, expires_at as "expiresAt"`;
    if (!row) throw new Error("token insert returned no row");
    // A role may have changed: cached principals of the user's other tokens must not keep the old one.
    if (role) await tx`select pg_notify(${TOKENS_CHANNEL}, '*')`;
    const expiresAt = row.expiresAt ? row.expiresAt.toISOString() : null;
    return { tokenId: row.id, userId: user.id, role: user.role, token, expiresAt };
  });
}

/** Revokes a token; false when there is no such live token. API processes forget it at once. */
export async function tokenRevoke(sql: Sql, tokenId: number): Promise<boolean> {
  const rows = await sql`
    with revoked as (
      update api_tokens set revoked_at = now() where id = ${tokenId} and revoked_at is null returning id
    )
    select id, pg_notify(${TOKENS_CHANNEL}, id::text) from revoked`;
  return rows.length === 1;
}

export interface TokenInfo {
  id: number;
  user: string;
  role: Role;
  createdAt: string;
  lastUsedAt: string | null;
  revokedAt: string | null;
  /** When it expires, or null: never. */
  expiresAt: string | null;
  /** Whether `expiresAt` has passed (by the database's clock). */
  expired: boolean;
}

export async function tokenList(sql: Sql): Promise<TokenInfo[]> {
  return sql<TokenInfo[]>`
    select t.id::float8 as id, u.name as user, u.role, t.created_at as "createdAt",
           t.last_used_at as "lastUsedAt", t.revoked_at as "revokedAt", t.expires_at as "expiresAt",
           coalesce(t.expires_at <= now(), false) as expired
    from api_tokens t join users u on u.id = t.user_id
    order by t.id`;
}

/** SQL: the token `t` is live — neither revoked nor expired. */
const LIVE = "t.revoked_at is null and (t.expires_at is null or t.expires_at > now())";

/**
 * The principal a bearer token stands for, or undefined for a malformed, unknown, revoked or expired
 * token.
 */
export async function tokenAuthenticate(
  sql: Sql,
  token: string,
  cache?: TokenCache,
): Promise<Authenticated | undefined> {
  if (!TOKEN_SHAPE.test(token)) return undefined;
  const hash = hashToken(token);
  const cached = cache?.get(hash);
  if (cached) return cached;
  const ticket = cache?.begin() ?? 0;
  // Before the question: the time left that the answer gives is counted from here, so the deadline
  // is never later than the database's expiry, however long the answer took to come back.
  const asked = performance.now();
  const [row] = await sql<(Principal & { tokenId: number; stale: boolean; leftMs: number | null })[]>`
    select u.id::float8 as "userId", u.name, u.role, t.id::float8 as "tokenId",
           (t.last_used_at is null or t.last_used_at < now() - interval '1 minute') as stale,
           extract(epoch from t.expires_at - now())::float8 * 1000 as "leftMs"
    from api_tokens t join users u on u.id = t.user_id
    where t.token_hash = ${hash} and ${sql.unsafe(LIVE)}`;
  if (!row) return undefined;
  if (row.stale) {
    // Coarse bookkeeping, at most once a minute per token; a failure here must not fail the request.
    sql`update api_tokens set last_used_at = now() where id = ${row.tokenId}`.catch(() => {});
  }
  const principal: Authenticated = {
    userId: row.userId,
    name: row.name,
    role: row.role,
    tokenId: row.tokenId,
  };
  if (row.leftMs !== null) principal.deadline = asked + row.leftMs;
  cache?.set(hash, principal, ticket);
  return principal;
}

/**
 * The roles of the live (neither revoked nor expired) tokens among `tokenIds`; a revoked, expired or
 * unknown token is absent.
 */
export async function tokenRoles(sql: Sql, tokenIds: readonly number[]): Promise<Map<number, Role>> {
  const rows = await sql<{ id: number; role: Role }[]>`
    select t.id::float8 as id, u.role
    from api_tokens t join users u on u.id = t.user_id
    where t.id = any(${sql.array(tokenIds as number[], 20)}) and ${sql.unsafe(LIVE)}`;
  return new Map(rows.map((r) => [r.id, r.role]));
}
