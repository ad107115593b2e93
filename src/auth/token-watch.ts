// What a token authorised once, at its start, and goes on for long — a download, a zip, results.csv, a
// link's body being streamed — ends when the token stops being valid: revoked, its user's role changed,
// or expired. A revoke and a role change arrive through the token cache's notifications
// (TokenCache.onRevoke); an expiry needs none: a timer fires at the token's deadline.
import type { Sql } from "../db/client.ts";
import { MAX_TIMER_MS, timerDelay } from "../timers.ts";
import type { TokenCache } from "./token-cache.ts";
import { type Role, tokenRoles } from "./tokens.ts";

/** Why a token no longer authorises what it started. */
export type TokenEnd = "revoked" | "expired" | "role changed";

/**
 * A check of the token after a notification for every token that failed (the database unsure: the
 * notification was its LISTEN connection coming back) is made again this long after, until one answers.
 */
export const RECHECK_MS = 2_000;

/**
 * Calls `fn` at `deadline` (monotonic ms, performance.now()), however far off: a Node timer waits at
 * most MAX_TIMER_MS, so a longer wait is made of several. Returns the cancel.
 */
export function atDeadline(deadline: number, fn: () => void): () => void {
  let timer: NodeJS.Timeout;
  const arm = () => {
    const left = deadline - performance.now();
    timer = setTimeout(() => (left > MAX_TIMER_MS ? arm() : fn()), timerDelay(left));
  };
  arm();
  return () => clearTimeout(timer);
}

export interface WatchedGrant {
  tokenId: number;
  /** The role it was checked with. */
  role: Role;
  /** The token's expiry (monotonic ms), absent when it has none. */
  deadline?: number | undefined;
  /**
   * The token cache's generation (TokenCache.begin()) taken before the token was checked. When it has
   * moved by the time the watch starts, a revoke or role change may have been announced in between,
   * unheard: the token is checked again at once.
   */
  ticket?: number | undefined;
}

/** The token ids asked for on one pool since the last query went, and that query's answer. */
interface RoleBatch {
  ids: Set<number>;
  answer: Promise<Map<number, Role>>;
}
const batches = new WeakMap<Sql, RoleBatch>();

/**
 * `tokenId`'s role if its token is live: one query for every watch that asks in the same turn of the
 * event loop (a `*` reaches every download under way at once, and each asked on its own — a thousand
 * downloads, a thousand queries, the moment the database came back). Sent from `setImmediate`, so the
 * retries of failed checks whose timers fire together are one query too.
 */
function roleOf(sql: Sql, tokenId: number): Promise<Role | undefined> {
  let batch = batches.get(sql);
  if (batch === undefined) {
    const ids = new Set<number>();
    const answer = new Promise<Map<number, Role>>((resolve, reject) =>
      setImmediate(() => {
        batches.delete(sql);
        tokenRoles(sql, [...ids]).then(resolve, reject);
      }),
    );
    batch = { ids, answer };
    batches.set(sql, batch);
  }
  batch.ids.add(tokenId);
  return batch.answer.then((roles) => roles.get(tokenId));
}

/** The failures of a batch's check already reported: every watcher in the batch gets the same error. */
const reported = new WeakSet<object>();

/**
 * Whether this watcher is the first to hear of `err`: a check that fails for a thousand downloads is one
 * query (roleOf), and is reported once, not a thousand times every RECHECK_MS.
 */
function firstToHear(err: unknown): boolean {
  if (typeof err !== "object" || err === null) return true;
  if (reported.has(err)) return false;
  reported.add(err);
  return true;
}

/**
 * Calls `end` once, when the grant's token is revoked (its own notification), when it is found revoked,
 * expired or of another role after a notification for every token ("*": a role change, or the LISTEN
 * connection back — notifications may have been lost), or when it expires. A check that fails is made
 * again (RECHECK_MS) rather than ending what it watches: a download of gigabytes, or a zip that cannot
 * resume, is not cut off for a database that was unsure a moment after it came back — a revoke is a
 * write, and one that committed is found by the next check. Never after the returned stop(), which the
 * caller calls however what it watches ends.
 */
export function watchToken(
  sql: Sql,
  tokens: TokenCache | undefined,
  grant: WatchedGrant,
  end: (why: TokenEnd) => void,
  /** onCheckFailed: once per failed check, however many watchers it was made for. */
  o: { recheckMs?: number; onCheckFailed?: (err: unknown) => void } = {},
): () => void {
  let stopped = false;
  let recheck: NodeJS.Timeout | undefined;
  const cut = (why: TokenEnd) => {
    if (stopped) return;
    stop();
    end(why);
  };
  const checkAgain = () => {
    clearTimeout(recheck);
    recheck = undefined;
    roleOf(sql, grant.tokenId).then(
      (role) => {
        if (role === undefined) cut("revoked");
        else if (role !== grant.role) cut("role changed");
      },
      (err: unknown) => {
        if (stopped || recheck !== undefined) return;
        recheck = setTimeout(checkAgain, o.recheckMs ?? RECHECK_MS);
        if (firstToHear(err)) o.onCheckFailed?.(err);
      },
    );
  };
  const unsubscribe = tokens?.onRevoke((tokenId) => {
    if (tokenId === String(grant.tokenId)) cut("revoked");
    else if (tokenId === "*") checkAgain();
  });
  const cancel = grant.deadline === undefined ? undefined : atDeadline(grant.deadline, () => cut("expired"));
  function stop() {
    stopped = true;
    clearTimeout(recheck);
    unsubscribe?.();
    cancel?.();
  }
  if (tokens && grant.ticket !== undefined && tokens.begin() !== grant.ticket) checkAgain();
  return stop;
}
