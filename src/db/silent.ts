// Pool connections that stopped answering without closing — a failover that left the old primary's
// connections open without a word, a path cut with nothing to say so — hold their queries until TCP
// gives up on them (~15 minutes with data unacknowledged). pacedSocket follows each plain pool
// connection's conversation (src/db/wire.ts) and tells which are owed an answer and have read nothing
// for a while (`silent`); a connection of its own asks pg_stat_activity about their backends, and
// those the database is not working on are closed: postgres.js fails their queries at once and makes
// new connections, and a backend still there is ended (it would hold a transaction's locks until the
// server's keepalive gave up on it). Inside a transaction too, since bin/patch-deps.js (unpatched,
// postgres.js 3.4.9 ended the process when such a connection closed: porsager/postgres#1208). The API's
// database gate does this in its probes, and `assay api` and workers run SilentSweep.
import type { Logger } from "../log.ts";
import { IntervalService } from "../queue/service.ts";
import type { BackendState, BackendStates, Database, PacedSocket, SilentConnection } from "./client.ts";

export const SILENT_DROPPED =
  "pool connections that stopped answering were closed: their queries fail, new connections serve";

/** How often a worker looks for silent pool connections (a look without any costs no statement). */
export const SILENT_SWEEP_EVERY_MS = 5_000;
/** How long a connection owed an answer may read nothing before its backend is looked up. */
export const SILENT_AFTER_MS = 5_000;
/** How long the look-up waits for the database's answer. */
export const SILENT_LOOKUP_MS = 2_000;

/** A pool's pacedSocket, when it has one (createDatabase's pools do). */
export function pacerOf(database: Pick<Database, "sql">): Partial<PacedSocket> | undefined {
  return (database.sql.options as { socket?: Partial<PacedSocket> }).socket;
}

/**
 * How long a connection whose backend is there but not working on its statement — `idle` (the
 * statement never arrived, or is still arriving), `active` waiting for the client's next message
 * (`ClientRead`: a cursor's next page asked for and never arrived), or blocked writing its answer to
 * a client that reads nothing (`ClientWrite`) — may read nothing before it is closed. Longer than a
 * backend gone (the probe's bound): a statement that takes this long to arrive, or an answer this long
 * to leave, is no working connection either, but a slow one is not closed for being slow.
 */
export const SILENT_STUCK_MS = 10_000;

/** How long a connection found at work is not looked up again while it stays silent. */
export const SILENT_RECHECK_MS = 30_000;
/**
 * How far from its connection's BackendKeyData a backend's start may seem, either way, before it is
 * another session's: `backend_start` is on the server's wall clock, which a step (NTP, a VM resumed)
 * moves. A pid taken again after a failover names a session started well before or after it.
 */
const AGE_SLACK_MS = 10_000;

type Verdict = "gone" | "stuck" | "working" | "undecided";

/**
 * What a silent connection is, by its backend's row (`undefined`: none): gone when the backend is
 * (ended, or another server's: a failover) or is another session's (not a client backend of this
 * role; or started well before or after the connection's BackendKeyData: its pid taken again, on the
 * server the probe reaches now); stuck past `stuckMs` as SILENT_STUCK_MS says (its backend is this
 * session's); working when it runs a
 * statement (`active`, on a lock or a sleep or the CPU; any state pg_stat_activity reports without
 * `track_activities`, `disabled`, counts as that); undecided otherwise (stuck, not yet for long). A
 * connection Node is still writing to is closed only when its backend is gone. Gone and stuck ones
 * are closed; a stuck one's backend is ended too.
 */
function verdict(
  c: SilentConnection,
  backend: BackendState | undefined,
  now: number,
  stuckMs: number,
): Verdict {
  if (backend === undefined || backend.state === null || !backend.own) return "gone";
  // Its backend started just before its BackendKeyData came (the authentication between): one
  // started well before or after is another session's, its pid taken again.
  if (backend.ageMs !== null && Math.abs(backend.ageMs - c.age) > AGE_SLACK_MS) return "gone";
  const stuck =
    backend.state.startsWith("idle") ||
    backend.waitEvent === "ClientWrite" ||
    (backend.state === "active" && backend.waitEvent === "ClientRead");
  if (!stuck) return "working";
  return !c.sending && now - c.since >= stuckMs ? "stuck" : "undecided";
}

/**
 * Judges a pool's silent connections by what pg_stat_activity says of their backends, closes the dead
 * ones (postgres.js fails their queries at once, and makes new connections), and remembers the ones
 * found working — or all of them, when no pid could be judged (a pooler) — so that a look is not
 * asked for again while they stay as they are, for SILENT_RECHECK_MS (`due`): a connection at work
 * may die later without a byte, and a long statement costs a look-up every so often, not every ping.
 */
export class SilentJudge {
  /** Connections not to look up again for a while: pid → their `since` then, and when. */
  private working = new Map<number, { since: number; at: number }>();
  private readonly stuckMs: number;
  private readonly recheckMs: number;
  private readonly log: Pick<Logger, "warn">;
  private readonly end: EndBackends | undefined;
  /** The last judgement's ending of backends (never rejects). */
  private ending: Promise<void> = Promise.resolve();

  constructor(
    log: Pick<Logger, "warn">,
    stuckMs = SILENT_STUCK_MS,
    recheckMs = SILENT_RECHECK_MS,
    end?: EndBackends,
  ) {
    this.log = log;
    this.stuckMs = stuckMs;
    this.recheckMs = recheckMs;
    this.end = end;
  }

  /** Resolves when the backends the last judge() closed connections of have been ended (or not). */
  ended(): Promise<void> {
    return this.ending;
  }

  /** Whether any of `silent` wants a look: not found at work at its current silence, or not lately. */
  due(silent: readonly SilentConnection[], now = performance.now()): boolean {
    return silent.some((c) => {
      const w = this.working.get(c.pid);
      return w === undefined || w.since !== c.since || now - w.at >= this.recheckMs;
    });
  }

  /**
   * Closes those of `silent` that are dead by `states` (null: the pids cannot be judged; nothing is
   * closed), logs them once, and returns their backends' pids.
   */
  judge(
    paced: Partial<PacedSocket> | undefined,
    silent: readonly SilentConnection[],
    states: BackendStates | null,
  ): number[] {
    const now = performance.now();
    if (states === null) {
      this.working = new Map(silent.map((c) => [c.pid, { since: c.since, at: now }]));
      return [];
    }
    const dropped: number[] = [];
    const backends: { pid: number; start: string }[] = [];
    const working = new Map<number, { since: number; at: number }>();
    for (const c of silent) {
      const backend = states.get(c.pid);
      const v = verdict(c, backend, now, this.stuckMs);
      if (v === "working") working.set(c.pid, { since: c.since, at: now });
      else if ((v === "gone" || v === "stuck") && paced?.drop?.(c)) {
        dropped.push(c.pid);
        if (v === "stuck" && backend?.start && this.end) backends.push({ pid: c.pid, start: backend.start });
      }
    }
    this.working = working;
    if (dropped.length > 0)
      this.log.warn({ pids: dropped, ending: backends.map((b) => b.pid) }, SILENT_DROPPED);
    const end = this.end;
    if (end !== undefined && backends.length > 0) {
      this.ending = end(backends).then(
        () => {},
        (err: unknown) => this.log.warn({ err, pids: backends.map((b) => b.pid) }, SILENT_NOT_ENDED),
      );
    }
    return dropped;
  }
}

/** Database.endBackends with its bound (the look-up's). */
export type EndBackends = (backends: readonly { pid: number; start: string }[]) => Promise<unknown>;

/** The backends of closed silent connections, left running: they end when the server's keepalive does. */
export const SILENT_NOT_ENDED =
  "the backends of closed silent pool connections were not ended: their sessions (and any locks) last until the server notices";

/** `database`'s endBackends bounded by `ms`, for SilentJudge (undefined without one). */
export function backendEnder(database: Pick<Database, "endBackends">, ms: number): EndBackends | undefined {
  const endBackends = database.endBackends?.bind(database);
  return endBackends === undefined ? undefined : (backends) => endBackends(ms, backends);
}

export interface SilentSweepOptions {
  database: Database;
  logger: Logger;
  intervalMs?: number;
  silentAfterMs?: number;
  lookupMs?: number;
  stuckMs?: number;
  recheckMs?: number;
}

/**
 * A process's look for silent pool connections, every SILENT_SWEEP_EVERY_MS: a worker's claims,
 * heartbeats and completions would otherwise wait on them until TCP gives up, and its leases run
 * out meanwhile; a quiet API's requests would wait for the next request's ping.
 * runOnce() returns how many it closed. A look-up the database does not answer closes nothing (an
 * outage is no silent connection: those come back, or fail, with it).
 */
export class SilentSweep extends IntervalService<number> {
  private readonly o: SilentSweepOptions;
  private readonly judge: SilentJudge;

  constructor(o: SilentSweepOptions) {
    super("silent connection sweep", o.intervalMs ?? SILENT_SWEEP_EVERY_MS, o.logger);
    this.o = o;
    this.judge = new SilentJudge(
      o.logger,
      o.stuckMs,
      o.recheckMs,
      backendEnder(o.database, o.lookupMs ?? SILENT_LOOKUP_MS),
    );
  }

  async runOnce(): Promise<number> {
    const paced = pacerOf(this.o.database);
    const silent = paced?.silent?.(this.o.silentAfterMs ?? SILENT_AFTER_MS) ?? [];
    if (!this.judge.due(silent) || this.o.database.answers === undefined) return 0;
    let states: BackendStates | null;
    try {
      states = await this.o.database.answers(
        this.o.lookupMs ?? SILENT_LOOKUP_MS,
        silent.map((c) => c.pid),
      );
    } catch (err) {
      this.logger.debug({ err }, "silent pool connections not looked up: the database did not answer");
      return 0;
    }
    const closed = this.judge.judge(paced, silent, states).length;
    await this.judge.ended();
    return closed;
  }
}
