// Tells the API when its database has stopped answering, so requests are answered 503 at once
// instead of waiting in the pool for as long as the outage lasts.
//
// postgres.js keeps a query waiting while its connection cannot be made, and makes a connection the
// other end closes before the database answers (a proxy or port forward with nothing behind it) again
// at once, for ever, with the query still waiting (3.4.9, connection.js `closed`); Fastify sets no
// bound on a handler. Each API request then stayed in the heap until the database came back (~10 KB
// each; 2,000 requests held 19.4 MiB), bounded only by the outage's length.
//
// The gate costs a request a clock reading while all is well: it looks at when the pool asked for its
// oldest connection that has not reached the database (pacedSocket: a ReadyForQuery on any of the
// pool's plain connections, or an answered probe, confirms every ask). Only when one is SUSPECT_MS old
// does it probe (runOnce): `select 1` on a connection of its own and on the pool at once, either
// answering within PROBE_ANSWER_MS (or any statement the pool finishes meanwhile) being an answer. No
// answer — nothing in time, connections refused, reset or cut, or refused at their start by PostgreSQL
// itself (too many connections, starting up) — closes the gate: requests are refused until a probe is
// answered, or the pool's `select 1` is, whenever it is. Connections that stop answering without
// closing make the pool ask for nothing, so every PING_EVERY_MS a request also has the pool answer
// `select 1` (a ping), and a ping unanswered in time starts a probe. When only the pool's connections
// went silent (a failover that left them open without a word) the probe's own connection answers: it
// looks up the backends of the pool's connections that owe an answer and have read nothing for
// PROBE_ANSWER_MS, and those the database is not working on are closed (src/db/silent.ts), so their
// queries fail instead of waiting.
import type { Logger } from "../log.ts";
import { type Database, NoAnswerError, type PacedSocket, type ReadMark, type Sql } from "./client.ts";
import { backendEnder, pacerOf, SilentJudge } from "./silent.ts";

/** How old a connection the pool asked for may get unconfirmed before the gate probes. */
export const SUSPECT_MS = 1_000;
/** How long a probe waits for the database's answer. */
export const PROBE_ANSWER_MS = 2_000;
/** How long a closed gate waits after a probe before the next. */
export const PROBE_EVERY_MS = 1_000;
/**
 * How often requests make an open gate ask the pool for `select 1` (its `PING`), so connections that
 * stop answering without closing — a network partition, a database host gone without a word — are
 * seen although the pool asks for no connection: a ping unanswered within PROBE_ANSWER_MS starts a
 * probe.
 */
export const PING_EVERY_MS = 5_000;

export interface GateOptions {
  suspectMs?: number;
  probeAnswerMs?: number;
  probeEveryMs?: number;
  pingEveryMs?: number;
  /** SILENT_STUCK_MS (src/db/silent.ts), for tests. */
  silentStuckMs?: number;
}

/**
 * Whether a query's failure is the database answering it: an ERROR of PostgreSQL's (a statement
 * refused). Not: a FATAL at a connection's start (too many connections, starting up, a wrong
 * password — postgres.js fails that connection's one query and keeps every other waiting while it
 * makes the next, two a second: requests pile up as when nothing answers), a connection refused,
 * reset or cut, no answer in time, a certificate that does not verify.
 */
function answeredWithError(err: unknown): boolean {
  return (
    err instanceof Error &&
    err.name === "PostgresError" &&
    (err as { severity?: unknown }).severity === "ERROR"
  );
}

/**
 * `then` after `ms`, once the I/O that came in meanwhile has been read: after a stalled event loop the
 * timer would otherwise fire before an answer already waiting on a socket, and close the gate of a
 * database that answered in time.
 */
function afterIo(ms: number, then: () => void): NodeJS.Timeout {
  const timer = setTimeout(() => setImmediate(then), ms);
  timer.unref();
  return timer;
}

/** A probe or ping told the pool's `select 1` outcome (DatabaseGate.poolAnswer). */
type PoolWaiter = (answered: boolean, err?: unknown) => void;

export class DatabaseGate {
  private readonly paced: Partial<PacedSocket> | undefined;
  private readonly answers: Database["answers"];
  private readonly suspectMs: number;
  private readonly probeAnswerMs: number;
  private readonly probeEveryMs: number;
  private closed = false;
  private probing: Promise<void> | undefined;
  /** A `select 1` of the gate's is in the pool. */
  private pooled = false;
  /** Probes and pings waiting for the pool's `select 1` (each removes itself when it is done). */
  private readonly poolWaiters = new Set<PoolWaiter>();
  private readonly sql: Sql;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private readonly pingEveryMs: number;
  /** When the pool last answered, or was last pinged. */
  private pingedAt = performance.now();
  /** Judges the pool's silent connections by what a probe's look-up says of their backends. */
  private readonly silentJudge: SilentJudge;
  /** Probes made, answered or not (tests read it). */
  probes = 0;

  private readonly log: Pick<Logger, "warn" | "info">;

  constructor(database: Database, log: Pick<Logger, "warn" | "info">, options: GateOptions = {}) {
    this.log = log;
    this.paced = pacerOf(database);
    this.answers = database.answers?.bind(database);
    this.sql = database.sql;
    this.suspectMs = options.suspectMs ?? SUSPECT_MS;
    this.probeAnswerMs = options.probeAnswerMs ?? PROBE_ANSWER_MS;
    this.probeEveryMs = options.probeEveryMs ?? PROBE_EVERY_MS;
    this.pingEveryMs = options.pingEveryMs ?? PING_EVERY_MS;
    this.silentJudge = new SilentJudge(
      log,
      options.silentStuckMs,
      undefined,
      backendEnder(database, this.probeAnswerMs),
    );
  }

  /** Whether a request that needs the database is refused now. Never throws, never waits. */
  refuses(): boolean {
    if (this.closed) return true;
    const since = this.paced?.unconfirmedSince?.();
    const now = performance.now();
    if (since !== undefined && since !== null && now - since >= this.suspectMs) {
      // Suspect: the request goes on (the database may well answer it), and a probe tells.
      if (this.probing === undefined && !this.stopped) void this.runOnce();
    } else if (now - this.pingedAt >= this.pingEveryMs && !this.stopped) {
      this.ping(now);
    }
    return false;
  }

  /**
   * A request's query failed because its connection did (connectionFailed): a probe now, unless one
   * is under way, so the requests after it are refused at once if the database is gone, rather than
   * each failing on its own connection until the pool's asks are old enough to be suspect.
   */
  suspect(): void {
    // A closed gate probes on its own timer; a probe started here beside it would start a second
    // chain of probes for the rest of the outage (found by the review).
    if (this.closed || this.probing !== undefined || this.stopped) return;
    void this.runOnce();
  }

  /**
   * Asks the pool for `select 1`; no answer within PROBE_ANSWER_MS (and no byte read on any of
   * the pool's connections meanwhile), or no connection, starts a probe — as do pool connections
   * silent now (pacedSocket.silent), at once.
   */
  private ping(now: number): void {
    this.pingedAt = now;
    if (this.probing !== undefined) return;
    // Pool connections owed an answer and silent past a probe's bound: a probe looks them up at once
    // (the pool's `select 1` could be answered by another connection, and find nothing).
    if (this.silentJudge.due(this.paced?.silent?.(this.probeAnswerMs) ?? [])) return void this.runOnce();
    let timer: NodeJS.Timeout | undefined;
    let finished = false;
    const done = (answered: boolean) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      this.poolWaiters.delete(told);
      if (!answered && !this.stopped && !this.closed) void this.runOnce();
    };
    const mark = this.paced?.mark?.();
    timer = afterIo(this.probeAnswerMs, () => done(this.answeredSince(mark)));
    // A failed `select 1` (a new connection refused) waits for the deadline while pool connections
    // are watched: a busy one may yet answer.
    const told = (answered: boolean) => {
      if (answered || mark === undefined || mark.size === 0) done(answered);
    };
    this.poolWaiters.add(told);
    this.poolAnswer();
  }

  /**
   * One probe (or the one in flight): opens or closes the gate on its outcome. Never rejects. Two
   * opinions are asked at once, and either answer within PROBE_ANSWER_MS is an answer: a connection of
   * the probe's own (a pool whose connections are all busy is no outage) and the pool itself (new
   * connections that are slow to open — a pooler queueing them, a multi-host URL whose first host does
   * not answer — are no outage either while the pool's connections serve), where a byte read on
   * any of its connections meanwhile counts too: a pool whose connections are all busy sends the
   * `select 1` to a new one (postgres.js), which may be the slow kind.
   */
  runOnce(): Promise<void> {
    if (this.probing !== undefined) return this.probing;
    const answers = this.answers;
    if (answers === undefined) return Promise.resolve();
    this.probes++;
    const started = performance.now();
    const mark = this.paced?.mark?.();
    // Pool connections owed an answer and silent for as long as a probe may take: the probe's own
    // connection asks the database what their backends are doing (SilentJudge).
    const silent = this.paced?.silent?.(this.probeAnswerMs) ?? [];
    let failure: unknown;
    let fromPool: PoolWaiter | undefined;
    this.probing = new Promise<boolean>((resolve) => {
      let pending = 2;
      const timer = afterIo(this.probeAnswerMs, () => resolve(this.answeredSince(mark)));
      const settle = (answered: boolean, err?: unknown) => {
        if (answered) {
          clearTimeout(timer);
          return resolve(true);
        }
        failure ??= err;
        // Both failed: with pool connections to watch, the deadline decides (a busy one may yet
        // answer — both fail at once when new connections are refused); without, no answer now.
        if (--pending === 0 && (mark === undefined || mark.size === 0)) {
          clearTimeout(timer);
          resolve(false);
        }
      };
      answers(
        this.probeAnswerMs,
        silent.map((c) => c.pid),
      ).then(
        (states) => {
          if (silent.length > 0) this.silentJudge.judge(this.paced, silent, states);
          settle(true);
        },
        (err: unknown) => settle(answeredWithError(err), err),
      );
      fromPool = settle;
      this.poolWaiters.add(settle);
      this.poolAnswer();
    }).then((answered) => {
      // The pool's answer, should it come later, is the gate's (poolAnswer), not this probe's: a
      // probe kept waiting on it would stay in the heap, its failure and all, for the whole outage.
      if (fromPool) this.poolWaiters.delete(fromPool);
      this.probing = undefined;
      if (answered) return this.opened(started);
      if (!this.closed)
        this.log.warn(
          { err: failure ?? new NoAnswerError(`no answer within ${this.probeAnswerMs} ms`) },
          "the database does not answer: API requests are answered 503 until it does",
        );
      this.closed = true;
      if (!this.stopped) {
        // One probe timer at a time, whoever started this probe.
        clearTimeout(this.timer);
        this.timer = setTimeout(() => void this.runOnce(), this.probeEveryMs);
        this.timer.unref();
      }
    });
    return this.probing;
  }

  /**
   * `select 1` on the pool, one at a time: one that outlives its probe stays queued in the pool (a
   * query there cannot be taken back) and is the next probe's too; its answer, whenever it comes,
   * opens the gate, and is told to the probes and pings waiting on it then (poolWaiters).
   */
  private poolAnswer(): void {
    if (this.pooled) return;
    this.pooled = true;
    const started = performance.now();
    const tell = (answered: boolean, err?: unknown) => {
      this.pooled = false;
      if (answered) this.opened(started);
      for (const waiter of [...this.poolWaiters]) waiter(answered, err);
    };
    this.sql`select 1`.then(
      () => tell(true),
      (err: unknown) => tell(answeredWithError(err), err),
    );
  }

  /**
   * The database answered: every connection the pool asked for so far is confirmed — one still
   * opening included (the pool serves meanwhile, or it would not have answered; if it fails, the
   * pool asks again, and that ask is suspect in its turn; if it hangs, the ping finds it).
   */
  private opened(askedAt: number): void {
    this.paced?.confirm?.(askedAt);
    this.pingedAt = performance.now();
    if (this.closed) this.log.info("the database answers again: API requests are served");
    this.closed = false;
    clearTimeout(this.timer);
  }

  /** Whether a connection the pool had open at `mark` has read something since (pacedSocket). */
  private answeredSince(mark: ReadMark | undefined): boolean {
    return mark !== undefined && (this.paced?.answeredSince?.(mark) ?? false);
  }

  /** Resolves when no probe is in flight (tests wait on it). */
  async settled(): Promise<void> {
    while (this.probing !== undefined) await this.probing;
  }

  /** Stops probing (the app is closing); a probe in flight ends by its own bound. */
  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}
