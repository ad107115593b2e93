// Claiming runs and keeping their leases (DESIGN §4.2–4.4).
import type { Sql } from "../../db/client.ts";
import { ownerQueued } from "./fair.ts";
import {
  byId,
  commitMode,
  INT8_OID,
  inLive,
  type Json,
  type Lease,
  matchesLease,
  notifyEvents,
  pgSafe,
} from "./shared.ts";

/** Advisory-lock namespace of the per-type claim lock (the second key is hashtext(type)). */
const CLAIM_LOCK_NAMESPACE = 0x636c6169; // "clai"

export interface ClaimedRun {
  id: number;
  taskId: number;
  analysisType: string;
  attempt: number;
  maxAttempts: number;
  leaseToken: string;
  inputFileId: number;
  inputStorageKey: string;
  inputName: string;
  inputSizeBytes: number;
  inputSha256: string;
  parameters: Record<string, unknown>;
  /** Its task's priority, 0–9, lower first: the worker starts a better one first whatever came before. */
  priority: number;
  /** Seconds the run waited between becoming due (created, or its retry's run_after) and this claim. */
  waitedSeconds: number;
  /**
   * The run's previous attempt lost its lease (the reaper put it back): that attempt's worker may
   * have died and left its outputs behind.
   */
  afterLostLease: boolean;
}

export interface ClaimOptions {
  workerId: string;
  analysisType: string;
  /** Most runs to claim. */
  limit: number;
  /** Global limit on live runs of the type across all workers; 0 = none. */
  globalLimit: number;
  /** Limit on one owner's live runs (of every type) across all workers (ASSAY_USER_CONCURRENCY); 0 = none. */
  userLimit?: number;
  leaseTtlMs: number;
  /**
   * The most runs one owner is given in its turn when more owners wait at its priority than the
   * claim takes (deficit round robin's quantum; see claimQuantum): default CLAIM_QUANTUM, at most
   * `limit`. With fewer owners than that, each gets an even share of the claim, at least
   * CLAIM_QUANTUM, whatever this says.
   */
  quantum?: number;
  /**
   * Told when the fair-share upkeep after a claim without limits (queueOwnersTidy) fails. The claim
   * has committed and its runs are returned all the same; the upkeep is left to later claims and
   * the reaper's prune, but a failure that repeats would bring back owners taking bursts of turns.
   */
  onTidyError?: (error: unknown) => void;
  /**
   * When given, the fair-share upkeep after a claim without limits (queueOwnersTidy) is handed to
   * this instead of being awaited, so the claimed runs reach the caller one round trip sooner. The
   * caller runs it; the worker runs it beside the start of those runs and before its next claim of
   * the type. The upkeep never rejects (a failure goes to onTidyError) and never waits for a lock.
   */
  tidyAside?: (upkeep: () => Promise<void>) => void;
}

/** An owner the claim may serve, and how many runs it may give them (the per-user limit's room). */
interface OwnerCap {
  owner_id: string;
  /** The owner's best priority with a run due: the level the claim serves it at. */
  priority: number;
  cap: number;
}

/**
 * Claims up to `limit` due runs of one type (DESIGN §4.2) and returns them with their task's
 * parameters, in fair share: priority first; within a priority the owners in turn, least served
 * first (queue_owners' pass; at the same pass, the one there first: `since`); within an owner,
 * its runs by turn, so its tasks interleave; within a task, file order. The claim writes run rows
 * and the served owners' passes only: a task turns
 * `running` when the first of its runs is recorded running (runProgress) or ends after starting
 * (countIntoTasks), so the claim — the path from a NOTIFY to a started handler — does not lock and
 * rewrite the task row as well.
 *
 * The runs come back in that order (priority, owners in turn, turn, id), not by id: the worker starts
 * them in the order it gets them, and with a prefetch a claim takes more runs than slots are free.
 *
 * With a global limit for the type, or a per-user limit, claims are serialised by advisory
 * transaction locks (the type's; then each candidate owner's, in the order of their keys,
 * hashint8(owner)), and live runs are counted after taking them: the count cannot be stale, so no
 * limit can be exceeded.
 *
 * A claim without limits commits asynchronously (synchronous_commit off for that one transaction):
 * it does not wait for its WAL flush, which under load queues behind the completions' flushes and was
 * the longest part of the claim round trip. Losing a claim can only happen when the database server
 * itself crashes, and leaves the run queued as before: the worker's next heartbeat or completion
 * finds its lease unknown and abandons the attempt — the same path as a reaped lease, so the run
 * executes again and is counted once. A later synchronous commit (any completion) makes every earlier
 * claim durable, since WAL is flushed in order. A limited claim stays durable: a lost claim would free
 * a slot whose process still runs.
 */
export async function runClaim(sql: Sql, o: ClaimOptions): Promise<ClaimedRun[]> {
  if (o.limit <= 0) return [];
  const userLimit = o.userLimit ?? 0;
  if (o.globalLimit <= 0 && userLimit <= 0) {
    const { runs, tidy, slack } = await claimStatement(sql, o, o.limit, null, false);
    if (!tidy) return runs;
    // Best effort, after the claim has committed: the runs it claimed must reach the caller whatever
    // happens here (a failure goes to onTidyError), and what is left untidied the next claim that
    // walks there, or the reaper's prune, tidies. Done by the caller (tidyAside), beside other
    // workers' claims, it is what a tidy always was: every lock it takes is SKIP LOCKED, and a row
    // leaves only at the version the walk read.
    const upkeep = () =>
      queueOwnersTidy(sql, o.analysisType, tidy, slack, false, false).catch((err: unknown) => {
        try {
          o.onTidyError?.(err);
        } catch {
          // Must not throw: the claim has committed, and its runs must reach the caller.
        }
      });
    if (o.tidyAside) {
      try {
        o.tidyAside(upkeep);
        return runs;
      } catch {
        // The caller could not take it: done here, so the runs the claim took still reach it.
      }
    }
    await upkeep();
    return runs;
  }
  return sql.begin(async (tx): Promise<ClaimedRun[]> => {
    const t = tx as unknown as Sql;
    let free = o.limit;
    if (o.globalLimit > 0) {
      await tx`select pg_advisory_xact_lock(${CLAIM_LOCK_NAMESPACE}, hashtext(${o.analysisType}))`;
      // A separate statement: its snapshot is taken after the lock, so it sees every earlier claim.
      const [row] = await tx<{ live: number }[]>`
        select count(*)::int as live from runs
        where analysis_type = ${o.analysisType} and status ${inLive(tx)}`;
      free = Math.min(free, o.globalLimit - (row?.live ?? 0));
      if (free <= 0) return [];
    }
    let caps: OwnerCap[] | null = null;
    if (userLimit > 0) {
      caps = await ownerCaps(t, o.analysisType, userLimit, free);
      if (caps.length === 0) return [];
    }
    const { runs, tidy, slack } = await claimStatement(t, o, free, caps, true);
    if (tidy) await queueOwnersTidy(t, o.analysisType, tidy, slack, caps !== null, true);
    return runs;
  });
}

/**
 * The most runs one owner is given in its turn within one claim (deficit round robin's quantum): with
 * slots freeing one at a time, every claim serves the next owner in turn anyway; a claim of many slots
 * gives each owner up to this many in a row (unless the worker asks for more: claimQuantum), so a
 * completion batch spans a few tasks, not one per run. Over time every owner gets the same share either way: the pass counts runs. 4, not 10: 10
 * drained 100 users' no-op runs faster (median 0.89× the single-task drain against 0.80×), but when
 * many slots freed at once the owner whose turn it was took them all, and a newcomer waited a whole
 * run for the next (bench/queue.ts pickup:fair:20ms p50 ~24 ms against ~6; docs/architecture.md).
 */
export const CLAIM_QUANTUM = 4;

/**
 * Attempts of a type that last less than this on average (a worker's running mean) are short enough
 * for a claim to serve one owner per turn with every slot it takes (claimQuantum).
 */
export const SHORT_ATTEMPT_SECONDS = 0.05;

/**
 * The quantum a worker claims with (ClaimOptions.quantum): while its attempts of the type are short
 * (mean under SHORT_ATTEMPT_SECONDS), the whole claim — when more owners wait than it takes, it serves
 * the next owner in turn with up to all of its slots, so a claim walks, locks and advances one owner
 * and its completion batch counts into that owner's tasks (one, for an owner with one task), not
 * three owners' (100 users' no-op runs drained ~0.77× as fast as one user's with the quantum, ~0.91×
 * with this; bench/queue.ts drain:fair). The price: among n owners a newcomer waits about n − 1
 * turns of up to k runs instead of CLAIM_QUANTUM — 100 owners, 10 slots, 20 ms runs: ~2 s instead
 * of ~0.8 s. It does nothing under the per-user limit (that claim never has more than k owners in
 * its walk). Otherwise, and
 * before any attempt has ended (a worker starting with every slot free), and while one of the type's
 * live attempts is already older than a short one (`oldestLiveAttemptSeconds`), CLAIM_QUANTUM: with
 * runs of minutes, a claim of many slots must not give them all to one user while the others wait
 * that long. The mean is the worker's, of successful attempts only: a program failing at once would
 * make a type of long runs look short, and free its slots at that moment for one owner to take.
 */
export function claimQuantum(
  meanAttemptSeconds: number | undefined,
  limit: number,
  oldestLiveAttemptSeconds = 0,
): number {
  // A live attempt already older than a short one: the mean is out of date (the type's runs got
  // longer, or some of them are long).
  if (oldestLiveAttemptSeconds >= SHORT_ATTEMPT_SECONDS) return CLAIM_QUANTUM;
  return meanAttemptSeconds !== undefined && meanAttemptSeconds < SHORT_ATTEMPT_SECONDS
    ? Math.max(limit, CLAIM_QUANTUM)
    : CLAIM_QUANTUM;
}

/**
 * How many owners a claim of k sorts in full before it looks at the rest (see claimStatement): four
 * times the owners a claim can serve, so owners with nothing due (only runs in backoff, which sit at
 * the head of the walk since their pass stops growing) rarely push a claim into the rest.
 */
export function walkHead(k: number): number {
  return Math.max(32, 4 * k);
}

/**
 * The rotation's order over queue_owners rows (alias `a`): least served first, at the same pass the
 * one there first. Every walk and the per-user limit's choice of candidates use it, so they agree.
 */
const turnOrder = (sql: Sql, a: "q" | "w") =>
  sql.unsafe(`${a}.priority, ${a}.pass, ${a}.since, ${a}.owner_id`);

/** Advisory-lock namespace of the per-owner claim lock (the second key is hashint8(owner)). */
const OWNER_LOCK_NAMESPACE = 0x6f776e72; // "ownr"

/**
 * The per-user limit: up to `k` owners next in turn with room below the limit, locked in owner
 * order, with their room counted after the lock (the first count only chooses whom to lock).
 */
async function ownerCaps(tx: Sql, analysisType: string, userLimit: number, k: number): Promise<OwnerCap[]> {
  const candidates = await tx<{ owner_id: string; priority: number }[]>`
    select q.owner_id::text, q.priority from queue_owners q
    where q.analysis_type = ${analysisType}
      and exists (select 1 from runs e where e.status = 'queued' and e.analysis_type = q.analysis_type
                    and e.owner_id = q.owner_id and e.priority = q.priority and e.run_after <= now())
      and (select count(*) from runs l where l.owner_id = q.owner_id and l.status ${inLive(tx)}) < ${userLimit}
    order by ${turnOrder(tx, "q")}
    limit ${k}`;
  if (candidates.length === 0) return [];
  // In turn order, priority first: an owner's first row here is its best priority with a run due.
  const best = new Map<string, number>();
  for (const c of candidates) if (!best.has(c.owner_id)) best.set(c.owner_id, c.priority);
  const owners = [...best.keys()];
  await tx`
    select pg_advisory_xact_lock(${OWNER_LOCK_NAMESPACE}, k)
    from (select distinct hashint8(o) as k from unnest(${tx.array(owners, INT8_OID)}::bigint[]) as o order by 1) x`;
  const rooms = await tx<{ owner_id: string; cap: number }[]>`
    select o::text as owner_id, (${userLimit} - count(l.id))::int as cap
    from unnest(${tx.array(owners, INT8_OID)}::bigint[]) as o
    left join runs l on l.owner_id = o and l.status ${inLive(tx)}
    group by o
    having count(l.id) < ${userLimit}`;
  return rooms.map((r) => ({ owner_id: r.owner_id, priority: best.get(r.owner_id) ?? 0, cap: r.cap }));
}

// Written so that PostgreSQL can plan it once (see inLive): the limit is a literal — a parameter
// there makes the generic plan assume a tenth of the table and lose to a plan made per call, so the
// statement was re-planned on every claim (one prepared statement per distinct k, and k is at most
// concurrency + prefetch) — and the update finds its rows by primary key from an array. (While
// `runs` is young and its statistics say it is tiny, PostgreSQL still scans it sequentially here;
// after ANALYZE it is an index scan.)
//
// The rotation: `picked` walks the owners waiting at this type in (priority, pass, since) order — sorted
// from queue_owners, one row per owner (an index on pass would be churned by every claim). The walk
// is a head, the walkHead(k) owners next in turn (a top-N sort), then the rest in the same order
// (offset): an Append runs its second branch only when the head did not yield k runs (its owners had
// nothing due), so a claim among a thousand owners sorts a few dozen, not all. Each branch counts its
// owners per priority over its own rows; the head's counts are exact except for its last priority
// when the head cut it (then ≥ 4k rows of better priorities came first, and that priority is reached
// only when they gave fewer than k). The walk takes from each owner, in turn order, up to its quota of
// due runs, locked with SKIP LOCKED, until k are found. The quota, from the owners at its priority
// (counted by a window over the same walk; under the per-user limit, the candidate owners the walk
// is given, at most k): with more than k, the caller's quantum (ClaimOptions.quantum, at most k);
// with k or fewer, ceil(k / owners), at least CLAIM_QUANTUM; under the per-user limit at most its
// room. The lateral runs per owner with its keys as parameters — an index lookup whatever a young
// table's statistics say (as an EXISTS probe it became a semi-join that read every queued run of the
// type per owner) — and the fence (offset 0) keeps the walk above the sort, so it stops at k.
// `advanced` adds what each owner was given to its pass, the rows locked in owner order first (two
// claims serving the same owners wait for each other instead of deadlocking) and found by primary
// key (`served`: as a semi-join on picked it read every owner's row). At most k runs are
// locked whatever the backlog: the claim never scans it.
async function claimStatement(
  sql: Sql,
  o: ClaimOptions,
  k: number,
  caps: OwnerCap[] | null,
  durable: boolean,
): Promise<{ runs: ClaimedRun[]; tidy: Tidy | null; slack: number }> {
  if (!Number.isInteger(k) || k <= 0) throw new Error(`claim size must be a positive integer, got ${k}`);
  if (o.quantum !== undefined && (!Number.isInteger(o.quantum) || o.quantum <= 0))
    throw new Error(`claim quantum must be a positive integer, got ${o.quantum}`);
  const K = sql.unsafe(String(k));
  const Q = sql.unsafe(String(Math.min(k, CLAIM_QUANTUM)));
  // With more owners at a priority than the claim takes: the caller's quantum (a literal, like k:
  // at most two values per k, each planned once).
  // Under the per-user limit the walk never holds more than k owners, so this never applies there,
  // and the raise's slack stays CLAIM_QUANTUM's.
  const qm = caps === null ? Math.min(k, o.quantum ?? CLAIM_QUANTUM) : Math.min(k, CLAIM_QUANTUM);
  const QM = sql.unsafe(String(qm));
  // The raise's slack (queueOwnersTidy): a turn may take the larger of the two, so an owner a concurrent
  // claim is serving may stand that far behind without having been skipped.
  const slack = Math.max(qm, Math.min(k, CLAIM_QUANTUM));
  const SLACK = sql.unsafe(String(slack));
  const M = sql.unsafe(String(walkHead(k)));
  // One part of the walk without a per-user limit: the owners in turn order, cut by `cut` (the head:
  // limit M; the rest: offset M), each with its quota counted over the part's own rows.
  const walkPart = (cut: ReturnType<Sql>, before: typeof M) => sql`
        select w.priority, w.owner_id, w.version, w.pass,
               case when count(*) over (partition by w.priority) > ${K} then ${QM}
                    else greatest(ceil(${K}::float8 / count(*) over (partition by w.priority))::int, ${Q}) end as quota,
               ${before} + row_number() over (order by ${turnOrder(sql, "w")}) as pos
        from (select q.priority, q.pass, q.since, q.owner_id, q.version from queue_owners q
              where q.analysis_type = ${o.analysisType}
              order by ${turnOrder(sql, "q")}
              ${cut}) w
        order by ${turnOrder(sql, "w")}
        offset 0`;
  // Each owner's quota (above). Under the per-user limit the walk holds at most k owners (ownerCaps),
  // so it is always the even share, and at most the owner's room.
  const walk =
    caps === null
      ? sql`(${walkPart(sql`limit ${M}`, sql.unsafe("0"))}) union all (${walkPart(sql`offset ${M}`, M)})`
      : sql`
        select q.priority, q.owner_id, q.version, q.pass,
               least(greatest(ceil(${K}::float8 / count(*) over (partition by q.priority))::int, ${Q}),
                     c.cap) as quota,
               row_number() over (order by ${turnOrder(sql, "q")}) as pos
        from queue_owners q
        join jsonb_to_recordset(${sql.json(caps as unknown as Json)}) as c(owner_id bigint, priority int, cap int)
          -- An owner's room is given at one priority only, its best with a run due (ownerCaps): its
          -- rows at other priorities would each get the whole room again. (Its best priority of all
          -- served nothing when that row had only runs in backoff: with one candidate, every claim
          -- came back empty for the whole backoff while other owners waited.)
          on c.owner_id = q.owner_id and c.priority = q.priority
        where q.analysis_type = ${o.analysisType}
        order by ${turnOrder(sql, "q")}
        offset 0`;
  const rows = await sql<(ClaimedRun & { tidy: Tidy | null })[]>`
    with walk as materialized (${walk}),
    picked as materialized (
      select p.id, p.turn, w.priority, w.owner_id, w.pos, w.pass from walk w
      cross join lateral (
        select r.id, r.turn from runs r
        where r.status = 'queued' and r.analysis_type = ${o.analysisType} and r.owner_id = w.owner_id
          and r.priority = w.priority and r.run_after <= now()
        order by r.turn, r.id
        limit w.quota
        for update of r skip locked
      ) p
      limit ${K}
    ),
    claimed as (${claimUpdate(sql, o)}),
    served as materialized (
      select s.priority, s.owner_id
      from (select distinct priority, owner_id from picked order by owner_id, priority) g
      cross join lateral (
        select q.priority, q.owner_id from queue_owners q
        where q.analysis_type = ${o.analysisType} and q.priority = g.priority and q.owner_id = g.owner_id
        for update of q
      ) s
    ),
    advanced as (
      update queue_owners q set pass = q.pass + g.n, since = statement_timestamp()
      from (select priority, owner_id, count(*) as n from picked group by priority, owner_id) g
      where q.analysis_type = ${o.analysisType} and q.priority = g.priority and q.owner_id = g.owner_id
        and (q.priority, q.owner_id) in (select priority, owner_id from served)
    ),
    -- The owners the walk went past without a run (up to the last owner it took one from; the head
    -- when it took none), at the pass and version it read. Nearly always none; when there are,
    -- the caller tidies them in a statement of its own (queueOwnersTidy): the rows with nothing
    -- queued leave the rotation, the ones skipped with runs queued are raised. Done here, in every
    -- claim, the steps that seldom had anything to do cost ~0.4 ms of PostgreSQL CPU per run in
    -- bench/e2e.ts's shape (a claim per run), for a plan of four more data-modifying steps.
    passed as (
      select w.priority, w.owner_id, w.version, w.pass
      -- The walk as far as it went (a CTE is read back in the order it was made; the limit keeps
      -- this from running the rest of the walk), each row at its turn's position.
      from (select * from walk limit (select coalesce(max(pos), ${M}) from picked)) w
      where w.pos <= (select coalesce(max(pos), ${M}) from picked)
        and not exists (select 1 from picked k where k.priority = w.priority and k.owner_id = w.owner_id)
    ),
    -- The lowest pass this claim served at each priority: where the rotation stands.
    served_floor as (
      select priority, min(pass) as pass from picked group by priority
    ),
    -- What queueOwnersTidy needs, only when it has something to do: rows walked past; under the
    -- per-user limit also rows of the level more than SLACK below the floor (that walk holds only
    -- owners with room, so the rows it skipped are not all in it).
    tidy as (
      select jsonb_build_object(
        'passed', coalesce((select jsonb_agg(jsonb_build_object('priority', priority, 'ownerId', owner_id::text,
                                                                'version', version::text, 'pass', pass::text))
                            from passed), '[]'::jsonb),
        'floor', coalesce((select jsonb_agg(jsonb_build_object('priority', priority, 'pass', pass::text))
                           from served_floor), '[]'::jsonb)) as t
      -- Only when it has something to do: a row walked past with nothing queued (to drop), or one
      -- more than SLACK below the floor (to raise, if it has runs queued; the tidy checks). An
      -- owner whose runs are all in backoff is walked past by every claim, and calling the tidy for
      -- it each time made it a second statement in nearly every claim (38 of 40, a review).
      -- The probe is a lateral with the row's keys in the index's order, an index lookup whatever
      -- a young table's statistics say: as NOT EXISTS under an OR it ran as a scan of the table
      -- for an owner with nothing queued, on every claim that walked past one (B's pickup behind
      -- A's 20,000 runs went from ~7 to ~19 ms at the median; plans.test.ts).
      where exists (
        select 1 from passed p
        left join served_floor f on f.priority = p.priority
        left join lateral (
          select 1 as queued from runs r
          where r.status = 'queued' and r.analysis_type = ${o.analysisType}
            and r.owner_id = p.owner_id and r.priority = p.priority
          -- runs_claim_idx's order: without it, LIMIT 1 made a sequential scan look cheap (it
          -- expects a queued run soon), and for an owner with none it read every run.
          order by r.turn, r.id
          limit 1
        ) x on true
        where p.pass < f.pass - ${SLACK} or x.queued is null)${
          caps === null
            ? sql``
            : sql`
         or exists (select 1 from queue_owners q
                    join served_floor f on f.priority = q.priority
                    -- The same index probe as above (as EXISTS it became one scan of every queued run).
                    cross join lateral (${ownerQueued(sql)}) x
                    where q.analysis_type = ${o.analysisType} and q.pass < f.pass - ${SLACK})`
        }
    )
    select ${claimedColumns(sql)},
           (select t from tidy) as tidy
    -- One row of nulls when nothing was claimed: it still carries tidy.
    from (select 1) one left join (claimed c join picked k on k.id = c.id) on true
    -- Always true; evaluated once. Sets how this statement's own transaction commits (see above);
    -- "durable" keeps the server's setting, whatever it is.
    where ${commitMode(sql, durable)}
    -- In the order the claim served them: priority, the owners in turn, each owner's runs by turn
    -- (within a task, file order). The worker starts them in this order, and a claim may take more
    -- runs than it has slots free (a prefetch): in id order, as before, the priority-0 run a claim
    -- took beside four priority-5 runs of an older task started last, after them, and with runs of
    -- minutes waited minutes in the buffer; so did the owner in turn behind an older owner's runs.
    order by k.pos, k.turn, k.id`;
  const tidy = rows[0]?.tidy ?? null;
  const runs: ClaimedRun[] = [];
  for (const { tidy: _, ...run } of rows) if (run.id !== null) runs.push(run as ClaimedRun);
  return { runs, tidy, slack };
}

/**
 * The fair claim's first turn, alone, for when that turn takes the whole claim: more than k owners
 * wait at the best priority and the quantum is k, so the fair claim gives all k runs to the owner
 * next in turn (priority, pass, since, owner) and stops there — when that owner has k due runs.
 * This is that turn with a plan a fraction of the fair claim's size: the next owner's row (a top-1
 * sort of the type's rows), a count of its level's owners up to k + 1, up to k of its due runs by
 * `runs_claim_idx` with SKIP LOCKED, and its pass advanced by what it got, `since` set — as the fair
 * claim would. With k or fewer owners at that level it claims nothing (the fair claim shares the
 * claim among them); an owner with fewer than k due runs gets them and the caller claims the rest the
 * fair way (its walk starts from the advanced pass, as the fair claim's own walk would have moved
 * on), and one with none is left to the fair claim, which walks past it and tidies. Its answer says
 * how many owners wait at that level, up to k + 1: with k or fewer the caller claims with runClaim.
 * Only without limits (it throws), and only when the turn takes the whole claim (quantum ≥ limit).
 * Not quite the fair claim when the next owner is short and k > CLAIM_QUANTUM: the fair claim for the
 * rest computes its quotas from the rest, not from k, so the rest may go to fewer owners of a worse
 * priority than one fair claim of k would give it (a review: 1 + 7 runs where the fair claim gave
 * 1 + 4 + 3); the passes count what each got, so the rotation evens it out. A walk that then takes
 * nothing tidies the rows it walked past one claim earlier than the fair claim alone would. Locks: its runs
 * (SKIP LOCKED), then its one queue_owners row, the order of every statement. Commits asynchronously,
 * like the fair claim without limits.
 */
export async function runClaimTurn(
  sql: Sql,
  o: ClaimOptions,
): Promise<{ runs: ClaimedRun[]; owners: number }> {
  if (o.globalLimit > 0 || (o.userLimit ?? 0) > 0)
    throw new Error("a claim under a global or per-user limit is runClaim's");
  const k = o.limit;
  if (!Number.isInteger(k) || k <= 0) throw new Error(`claim size must be a positive integer, got ${k}`);
  if (Math.min(k, o.quantum ?? CLAIM_QUANTUM) !== k)
    throw new Error("the next owner's claim is for a turn that takes the whole claim (quantum ≥ limit)");
  // Literals, as in claimStatement (one plan per k).
  const K = sql.unsafe(String(k));
  const K1 = sql.unsafe(String(k + 1));
  const rows = await sql<(ClaimedRun & { owners: number })[]>`
    with nxt as materialized (
      select q.priority, q.owner_id from queue_owners q
      where q.analysis_type = ${o.analysisType}
      order by ${turnOrder(sql, "q")}
      limit 1
    ),
    level as materialized (
      select count(*) as owners from (
        select 1 from queue_owners q join nxt n on q.priority = n.priority
        where q.analysis_type = ${o.analysisType}
        limit ${K1}) x
    ),
    picked as materialized (
      select p.id, p.turn from nxt n
      cross join lateral (
        select r.id, r.turn from runs r
        where r.status = 'queued' and r.analysis_type = ${o.analysisType} and r.owner_id = n.owner_id
          and r.priority = n.priority and r.run_after <= now()
        order by r.turn, r.id
        limit ${K}
        for update of r skip locked
      ) p
      where (select owners from level) > ${K}
    ),
    claimed as (${claimUpdate(sql, o)}),
    advanced as (
      update queue_owners q set pass = q.pass + (select count(*) from picked), since = statement_timestamp()
      -- By primary key: a join with nxt read every row of the type (~a third of this claim's cost
      -- above the sole owner's claim).
      where q.analysis_type = ${o.analysisType} and q.priority = (select priority from nxt)
        and q.owner_id = (select owner_id from nxt)
        and (select count(*) from picked) > 0
    )
    select ${claimedColumns(sql)}, (select owners from level)::int as owners
    -- One row of nulls when nothing was claimed: it still carries owners.
    from (select 1) one left join (claimed c join picked k on k.id = c.id) on true
    where ${commitMode(sql, false)}
    -- In the order the owner's turn takes them, as runClaim returns its runs (see there).
    order by k.turn, k.id`;
  const owners = rows[0]?.owners ?? 0;
  const runs: ClaimedRun[] = [];
  for (const { owners: _, ...run } of rows) if (run.id !== null) runs.push(run);
  return { runs, owners };
}

/**
 * Runs leased to `workerId` that it does not know it holds (`known`: every lease it holds in any
 * form), their lease extended (its token kept) and returned as a claim returns them, with their
 * status (`cancelling` when a cancel came meanwhile). They are what a claim committed when its answer
 * was lost (the connection dropped after the commit): leased here, never started nor heartbeated,
 * until the reaper took them back after the lease with an attempt used up — failed
 * ANALYSIS_WORKER_UNAVAILABLE without ever running at one attempt. The worker asks after a claim of its own
 * failed, with none in flight. Only `starting` and `cancelling` runs: a `running` one was marked so
 * by this worker's progress flush for an attempt it knew. Rare, so by runs_live_idx, not by plan.
 */
export async function runClaimOrphans(
  sql: Sql,
  workerId: string,
  known: Lease[],
  leaseTtlMs: number,
): Promise<(ClaimedRun & { status: string })[]> {
  const rows = await sql<(ClaimedRun & { status: string })[]>`
    with claimed as (
      update runs r set
        lease_expires_at = statement_timestamp() + ${leaseTtlMs} * interval '1 millisecond',
        heartbeat_at = statement_timestamp()
      where r.status in ('starting', 'cancelling') and r.lease_owner = ${workerId}
        and r.lease_token <> all(${sql.array(known.map((l) => l.token))}::uuid[])
      returning r.id, r.task_id, r.analysis_type, r.attempt, r.max_attempts, r.lease_token,
                r.input_file_id, r.input_storage_key, r.input_name, r.input_size_bytes, r.input_sha256,
                r.run_after, r.error_code, r.priority, r.status
    )
    select ${claimedColumns(sql)}, c.status
    from claimed c
    order by c.priority, c.id`;
  return [...rows];
}

/** A task just created, as its creation's notification names it (TASK_CREATED_CHANNEL). */
export interface CreatedTask {
  taskId: number;
  /** The task's first run (its lowest id: the first in file order). */
  runId: number;
  ownerId: number;
  priority: number;
}

/**
 * The first run of a task just created, claimed straight away when its owner is due a turn anyway:
 * no owner waits at the type with a better priority (a queue_owners row of a lower number, idle or
 * not), and the owner's pass at the task's level is at most CLAIM_QUANTUM above the level's lowest
 * (within a turn of the owners least served). Both read every row of the type, including rows of
 * owners with nothing due that the tidy or the prune has not removed yet: such a row can turn the
 * shortcut down (the run then goes the rotation's way), never let it through wrongly. The worker makes it beside the claim it may have in
 * flight, so a new user's first run does not wait for a claim of runs of the users already being
 * served; the rest of the task is the rotation's. The owner's pass is advanced by the run it got, as
 * the fair claim would, so an owner creating task after task is served this way only until its pass
 * stands a turn ahead of the others'. It takes the task's first run or nothing (the guard says no,
 * the run is not queued and due, or another claim holds it): so a task's runs start in file order
 * (but for one race, see Worker.place()), and of several workers told of the same task one gets the
 * run and the others nothing. Only without limits (it throws; a limited claim is serialised).
 * Locks: the run (SKIP LOCKED), then the owner's queue_owners row, the order of every statement.
 * Commits asynchronously, like the fair claim without limits.
 */
export async function runClaimNewcomer(sql: Sql, o: ClaimOptions, task: CreatedTask): Promise<ClaimedRun[]> {
  if (o.globalLimit > 0 || (o.userLimit ?? 0) > 0)
    throw new Error("a claim under a global or per-user limit is runClaim's");
  const rows = await sql<ClaimedRun[]>`
    with due as materialized (
      select 1 as ok from queue_owners q
      where q.analysis_type = ${o.analysisType} and q.priority = ${task.priority} and q.owner_id = ${task.ownerId}
        and q.pass <= (select min(m.pass) from queue_owners m
                       where m.analysis_type = ${o.analysisType} and m.priority = ${task.priority})
                      + ${sql.unsafe(String(CLAIM_QUANTUM))}
        and not exists (select 1 from queue_owners b
                        where b.analysis_type = ${o.analysisType} and b.priority < ${task.priority})
    ),
    -- The task's first run, by primary key, or nothing: when another claim holds it (a fair claim
    -- serving the newcomer already, or another worker's newcomer's claim), taking the second instead
    -- could start it before the first.
    picked as materialized (
      select r.id from runs r
      where r.id = ${task.runId} and r.task_id = ${task.taskId} and r.status = 'queued'
        and r.analysis_type = ${o.analysisType} and r.owner_id = ${task.ownerId}
        and r.priority = ${task.priority} and r.run_after <= now()
        and exists (select 1 from due)
      for update of r skip locked
    ),
    claimed as (${claimUpdate(sql, o)}),
    advanced as (
      update queue_owners q set pass = q.pass + 1, since = statement_timestamp()
      where q.analysis_type = ${o.analysisType} and q.priority = ${task.priority}
        and q.owner_id = ${task.ownerId} and exists (select 1 from picked)
    )
    select ${claimedColumns(sql)}
    from claimed c
    where ${commitMode(sql, false)}`;
  return [...rows];
}

/**
 * The claim's update of the runs in `picked` (a CTE of ids): each becomes an attempt of this worker.
 * Its stamps are statement_timestamp(), the start of the claim statement, not now(): now() is the
 * start of the transaction, and a limited claim's transaction first waits for the claim locks in
 * statements of its own (runClaim), so a claim that waited W for them handed out a lease with only
 * the TTL less W left, and the reaper could take the attempt back before its first heartbeat. One
 * stamp for the whole statement, as before: the runs one claim took share their started_at. The
 * statement's text stays the same.
 */
function claimUpdate(sql: Sql, o: ClaimOptions) {
  return sql`
      update runs r set
        status = 'starting',
        attempt = r.attempt + 1,
        lease_token = gen_random_uuid(),
        lease_owner = ${o.workerId},
        lease_expires_at = statement_timestamp() + ${o.leaseTtlMs} * interval '1 millisecond',
        heartbeat_at = statement_timestamp(),
        started_at = coalesce(r.started_at, statement_timestamp())
      where r.id = any(array(select id from picked))
      returning r.id, r.task_id, r.analysis_type, r.attempt, r.max_attempts, r.lease_token,
                r.input_file_id, r.input_storage_key, r.input_name, r.input_size_bytes, r.input_sha256,
                r.run_after, r.error_code, r.priority`;
}

/** A ClaimedRun's columns, from the CTE `claimed` (claimUpdate's) as `c`. */
function claimedColumns(sql: Sql) {
  return sql`c.id::float8 as id, c.task_id::float8 as "taskId", c.analysis_type as "analysisType",
           c.attempt, c.max_attempts as "maxAttempts", c.lease_token::text as "leaseToken",
           c.input_file_id::float8 as "inputFileId", c.input_storage_key as "inputStorageKey",
           c.input_name as "inputName", c.input_size_bytes::float8 as "inputSizeBytes",
           c.input_sha256 as "inputSha256", c.priority,
           -- By primary key per run, whatever a young table's statistics say.
           (select t.parameters from tasks t where t.id = c.task_id) as parameters,
           extract(epoch from now() - c.run_after)::float8 as "waitedSeconds",
           c.error_code is not distinct from 'ANALYSIS_WORKER_UNAVAILABLE' as "afterLostLease"`;
}

/**
 * The claim while one owner alone waits at a type (a single queue_owners row: one user, one
 * priority), which is the shape of most of a queue's work — one user's large task draining. It takes
 * up to `o.limit` of that owner's due runs in turn order, which is what the fair claim (runClaim)
 * would give it, with a plan a fraction of the size: no walk over owners, no rotation to advance, no
 * rows walked past to tidy. It claims only when the type has exactly one row and that row's owner has
 * runs queued. Its answer says what it found, for the caller to choose the next step: `owners`, the
 * rows whose owner has runs queued (due or not: an owner whose runs back off still waits), and `rows`,
 * the type's rows (each 0, 1, or 2 for "two or more"). Two or more owners waiting: the fair claim
 * decides. Rows beyond the owners waiting are rows whose owner's queue has emptied, which the rotation
 * keeps until a fair claim's tidy or a prune removes them (a fair-share period leaves many): the caller
 * prunes them (queueOwnersPruneIdle) rather than treating them as owners waiting, which sent a single
 * task drained after a fair period to the fair claim for a second at a time (~12% slower).
 *
 * The owner's pass is not advanced, and nothing is lost by that: a pass orders owners against each
 * other, and an owner alone is served whatever its pass. A newcomer joins at the highest pass of the
 * level — then the sole owner's, not advanced — with a later `since`, so the owner that was alone
 * goes first, one turn, exactly as when its pass had been advanced: both start even, and the
 * rotation goes on from there. That holds only when no other row is there: a row whose owner's queue
 * emptied keeps its pass and `since`, and its owner, queueing again, would go ahead of a newcomer where
 * fair claims (advancing the sole owner's pass) would have put it behind — so with such a row this
 * claims nothing. It never tidies: the worker prunes such rows when this reports them (see
 * Worker.claim).
 *
 * Only without limits (the caller's to check: a limited claim is runClaim's transaction). Commits
 * asynchronously, like runClaim's claim without limits (see there).
 */
export async function runClaimSole(
  sql: Sql,
  o: ClaimOptions,
): Promise<{ runs: ClaimedRun[]; owners: number; rows: number }> {
  if (o.globalLimit > 0 || (o.userLimit ?? 0) > 0)
    throw new Error("a claim under a global or per-user limit is runClaim's");
  const k = o.limit;
  if (!Number.isInteger(k) || k <= 0) throw new Error(`claim size must be a positive integer, got ${k}`);
  // The limit a literal, as in claimStatement (one plan per k).
  const K = sql.unsafe(String(k));
  const rows = await sql<(ClaimedRun & { owners: number; rows: number })[]>`
    with sole as materialized (
      select q.priority, q.owner_id from queue_owners q
      cross join lateral (${ownerQueued(sql)}) x
      where q.analysis_type = ${o.analysisType}
      limit 2
    ),
    listed as materialized (
      select count(*) as n from (select 1 from queue_owners q where q.analysis_type = ${o.analysisType} limit 2) l
    ),
    picked as materialized (
      select p.id, p.turn from sole s
      cross join lateral (
        select r.id, r.turn from runs r
        where r.status = 'queued' and r.analysis_type = ${o.analysisType} and r.owner_id = s.owner_id
          and r.priority = s.priority and r.run_after <= now()
        order by r.turn, r.id
        limit ${K}
        for update of r skip locked
      ) p
      -- Alone: one row, its owner's (with more rows, the caller decides).
      where (select count(*) from sole) = 1 and (select n from listed) = 1
    ),
    claimed as (${claimUpdate(sql, o)})
    select ${claimedColumns(sql)},
           (select count(*) from sole)::int as owners,
           (select n from listed)::int as rows
    -- One row of nulls when nothing was claimed: it still carries owners and rows.
    from (select 1) one left join (claimed c join picked k on k.id = c.id) on true
    where ${commitMode(sql, false)}
    -- In the order the owner's turn takes them, as runClaim returns its runs (see there).
    order by k.turn, k.id`;
  const owners = rows[0]?.owners ?? 0;
  const listed = rows[0]?.rows ?? 0;
  const runs: ClaimedRun[] = [];
  for (const { owners: _, rows: __, ...run } of rows) if (run.id !== null) runs.push(run);
  return { runs, owners, rows: listed };
}

/** What a claim tells queueOwnersTidy: the rows it walked past and where the rotation stands. */
export interface Tidy {
  passed: { priority: number; ownerId: string; version: string; pass: string }[];
  floor: { priority: number; pass: string }[];
}

/**
 * After a claim that walked past owners (claimStatement's `tidy`): of the rows it walked past, those
 * whose owner has nothing queued at all — not merely nothing due: runs in backoff keep their row —
 * leave the rotation, instead of being walked by every claim (and counted in every quota) until the
 * reaper's prune; those with runs queued that stand more than `slack` below the lowest pass the claim
 * served (skipped in lowest-pass-first order: nothing due, held at the per-user limit, locked by
 * another claim) are raised to it, or they would take every slot when served again, until they
 * caught up (a fourth review: an owner held by runs of another type took the next 30 claims, one
 * whose retried run had come due the next 40). Only rows more than the slack behind: raised at every
 * claim, each such row was rewritten by every claim. Their since stays, so at the new pass they go
 * first. With `level` (the per-user limit), every row of the level is considered for the raise, not
 * only those walked past.
 *
 * Every lock is SKIP LOCKED, so this never waits (nor deadlocks). A row leaves only at the version
 * the claim's walk read: every statement that makes a run queued bumps its owner's version
 * (queueOwnersJoin), so a row whose owner got queued runs after the claim's snapshot is left alone;
 * an upsert that comes after this lock waits for the delete and inserts the row again.
 */
export async function queueOwnersTidy(
  sql: Sql,
  analysisType: string,
  t: Tidy,
  slack: number,
  level: boolean,
  durable: boolean,
) {
  const SLACK = sql.unsafe(String(slack));
  await sql`
    with p as (
      select * from jsonb_to_recordset(${sql.json(t.passed as unknown as Json)})
        as p(priority int, "ownerId" bigint, version bigint, pass bigint)
    ),
    f as (
      select * from jsonb_to_recordset(${sql.json(t.floor as unknown as Json)}) as f(priority int, pass bigint)
    ),
    -- A lateral driven by p, an index lookup per row whatever a young table's statistics say.
    idle as (
      select x.ctid from p
      cross join lateral (
        select q.ctid from queue_owners q
        where q.analysis_type = ${analysisType} and q.priority = p.priority and q.owner_id = p."ownerId"
          and q.version = p.version
          and not exists (select 1 from runs r where r.status = 'queued' and r.analysis_type = q.analysis_type
                            and r.owner_id = q.owner_id and r.priority = q.priority)
        for update of q skip locked
      ) x
    ),
    -- By ctid. Seen in fair-share.test.ts's race: without the version condition the row still
    -- survived, the delete's TID re-check refusing the version the create had made; deleting by key
    -- without the version condition lost the row. The version condition is the guarantee.
    left_rotation as (
      delete from queue_owners q
      where (select count(*) from idle) > 0 and q.ctid = any(array(select ctid from idle))
    ),
    below as (
      select b.priority, b.owner_id
      from (${
        level
          ? sql`select q.priority, q.owner_id, q.pass from queue_owners q where q.analysis_type = ${analysisType}`
          : sql`select p.priority, p."ownerId" as owner_id, p.pass from p`
      }) b
      join f on f.priority = b.priority
      where b.pass < f.pass - ${SLACK}
    ),
    -- Only rows with runs queued (disjoint from idle's).
    raised as (
      select x.ctid, x.floor from below b
      cross join lateral (
        select q.ctid, f.pass as floor from queue_owners q
        join f on f.priority = q.priority
        where q.analysis_type = ${analysisType} and q.priority = b.priority and q.owner_id = b.owner_id
          and q.pass < f.pass - ${SLACK}
          and exists (select 1 from runs r where r.status = 'queued' and r.analysis_type = q.analysis_type
                        and r.owner_id = q.owner_id and r.priority = q.priority)
        for update of q skip locked
      ) x
    ),
    lifted as (
      update queue_owners q set pass = r.floor
      from raised r
      where (select count(*) from raised) > 0 and q.ctid = r.ctid
    )
    select (select count(*) from idle) as left, (select count(*) from raised) as raised
    -- Always true; evaluated once. Outside a limited claim's transaction, commits like the claim it
    -- follows (asynchronously: a lost tidy is redone by the next), so the claim's runs do not wait
    -- for a WAL flush of its own.
    where ${commitMode(sql, durable)}`;
}

/**
 * Extends the leases of a worker's live attempts (DESIGN §4.3). A run missing from the result has
 * been lost (reaped, or finished elsewhere); one returned as `cancelling` is to be cancelled.
 */
export function runHeartbeat(
  sql: Sql,
  leases: Lease[],
  leaseTtlMs: number,
): Promise<{ id: number; status: string }[]> {
  if (leases.length === 0) return Promise.resolve([]);
  return sql<{ id: number; status: string }[]>`
    with i as (
      select * from jsonb_to_recordset(${sql.json(byId(leases) as unknown as Json)}) as i(id bigint, token uuid)
    )
    update runs r set lease_expires_at = now() + ${leaseTtlMs} * interval '1 millisecond', heartbeat_at = now()
    from i
    where ${matchesLease(sql)}
    returning r.id::float8 as id, r.status`;
}

export interface ProgressUpdate extends Lease {
  /** 0–100, or null to only record that the attempt is running. */
  progress: number | null;
  message?: string | null;
}

/**
 * Records that attempts are running (starting → running) and their latest progress and message,
 * fenced by the lease token, and appends `run.running` / `run.progress` events. Returns the runs that matched, with
 * their status. Messages reach PostgreSQL through pgSafe() (no NUL, no lone surrogate).
 */
export function runProgress(sql: Sql, updates: ProgressUpdate[]): Promise<{ id: number; status: string }[]> {
  if (updates.length === 0) return Promise.resolve([]);
  const input = byId(updates).map((u) => ({
    id: u.id,
    token: u.token,
    progress: u.progress,
    message: u.message ?? null,
  }));
  return sql<{ id: number; status: string }[]>`
    with i as (
      select * from jsonb_to_recordset(${sql.json(pgSafe(input) as unknown as Json)})
        as i(id bigint, token uuid, progress int, message text)
    ),
    prev as (select r.id, r.status from runs r join i on i.id = r.id),
    moved as (
      update runs r set
        status = case when r.status = 'starting' then 'running' else r.status end,
        progress = coalesce(i.progress, r.progress),
        -- A report without a message keeps the last one (the dashboard shows the latest).
        message = coalesce(i.message, r.message)
      from i
      where ${matchesLease(sql)}
      returning r.id, r.task_id, r.status, r.attempt
    ),
    -- Events are inserted under their task's lock, so a task's event ids follow commit order.
    -- The task ids come from an array() of all of moved: data-modifying CTEs run as their rows are
    -- read, and a semi-join on moved (id in (select task_id from moved)) stops at a task's first
    -- run, so the task was locked while the rest of the batch's runs were still to be updated; a
    -- completion holding one of those runs and waiting for the task deadlocked with it. array()
    -- reads the whole CTE before the first task row is looked at: every run first, then the tasks.
    locked as materialized (
      select id from tasks where id = any(array(select task_id from moved)) order by id for update
    ),
    -- A task is running once one of its runs is (the claim leaves the task row alone).
    started as (
      update tasks t set status = 'running', started_at = coalesce(t.started_at, now()), updated_at = now()
      from locked l where t.id = l.id and t.status = 'queued'
    ),
    events as (
      insert into task_events (task_id, run_id, type, data)
      select task_id, run_id, type, data from (
        select m.task_id, m.id as run_id, 'run.running' as type,
               jsonb_build_object('status', 'running', 'attempt', m.attempt) as data, 0 as ord
        -- Both: prev is the statement's snapshot, moved the row as updated. A cancel that committed
        -- while this waited for the row made it cancelling: it did not start running, and its log
        -- already says cancelling.
        from moved m join prev p on p.id = m.id where p.status = 'starting' and m.status = 'running'
        union all
        select m.task_id, m.id, 'run.progress',
               jsonb_strip_nulls(jsonb_build_object('percent', i.progress, 'message', i.message)), 1
        from moved m join i on i.id = m.id where i.progress is not null
      ) e
      where task_id in (select id from locked)
      order by run_id, ord
      returning id, task_id, run_id, type, data, created_at
    ),
    ${notifyEvents(sql)}
    select id::float8 as id, status, (select count(*) from notified) as notified from moved`;
}
