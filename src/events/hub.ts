// The event hub of an API process (DESIGN §6): one LISTEN connection (postgres.js keeps a dedicated
// one outside the pool and re-listens after a drop), fanning notifications out in memory to the
// subscribers of each task. After every (re)connect it re-reads the table for every subscribed task,
// so nothing published while the connection was down is missed. A sweep (a service: start with the
// listener, stop, sweepOnce) ends the subscriptions of tasks that finished or disappeared without
// their subscriber seeing the closing event, so no stream outlives its task by more than an interval.
import type { Sql } from "../db/client.ts";
import { listenUntilStopped } from "../db/listen.ts";
import type { Logger } from "../log.ts";
import { EVENTS_CHANNEL } from "../queue/sql.ts";
import { tasksOpen } from "../tasks/read.ts";
import { eventsAfter, type TaskEvent } from "./read.ts";

const CATCH_UP_PAGE = 500;

interface Subscriber {
  after: bigint;
  /** When it subscribed, in the hub's count of subscriptions (see enqueue). */
  since: number;
  deliver(events: TaskEvent[]): void;
  end(): void;
  fail(): void;
}

/**
 * What subscribe() returns: calling it unsubscribes (idempotent); `advance(id)` says the subscriber has
 * every event up to `id` from elsewhere (a stream's backlog, read from the table), so deliveries and
 * catch-ups start after it — a catch-up during a long backlog would otherwise read the task's whole
 * history again, and buffer it. `rewind()` starts it over from the task's first event (a stream whose
 * Last-Event-ID the task's log does not know: it is sent the whole log).
 */
export type Subscription = (() => void) & { advance(id: string): void; rewind(): void };

export interface EventHubOptions {
  sql: Sql;
  logger: Logger;
  /** How often the sweep looks for subscriptions whose task has ended (the SSE keep-alive interval). */
  sweepIntervalMs?: number;
}

const DEFAULT_SWEEP_INTERVAL_MS = 15_000;

type Payload = { taskId: string; events: TaskEvent[] } | { taskId: string; eventId: string };

export class EventHub {
  private readonly tasks = new Map<string, Set<Subscriber>>();
  /**
   * Per task, deliveries run one after another, so a catch-up never overtakes a notification. A
   * task's chain stays until its last delivery has settled, whether or not anyone is subscribed: a
   * new subscriber's deliveries queue behind a catch-up still in flight for one that left (they once
   * started a second chain beside it, which overtook it).
   */
  private readonly chains = new Map<string, Promise<void>>();
  /** Subscriptions made so far: a subscriber's `since`. */
  private subscriptions = 0;
  private unlisten: (() => Promise<void>) | undefined;
  private starting: Promise<void> | undefined;
  private reconnects = 0;
  /**
   * The LISTEN connection's identity as postgres.js keeps it (the backend's pid and cancel key, the
   * same object across reconnects), and the identity the hub last caught up for. A reconnected
   * connection can hand over a notification before postgres.js calls onlisten (PostgreSQL sends
   * what arrived while the LISTEN ran before its ReadyForQuery, and onlisten runs a few promise turns
   * later): delivered first, it would move the subscribers past the events committed during the
   * outage, which the catch-up then skips. A notification from a connection the hub has not caught
   * up for starts the catch-up itself, ahead of its own delivery.
   */
  private listenState: { pid: unknown; secret: unknown } | undefined;
  private caughtUpFor: string | undefined;
  private sweepTimer: NodeJS.Timeout | undefined;
  private stopped = false;
  /** Notifications received, and how many were doorbells (the events were too large to carry). */
  readonly received = { notifications: 0, doorbells: 0 };

  private readonly o: EventHubOptions;

  constructor(o: EventHubOptions) {
    this.o = o;
  }

  /** Starts listening on first use (a failed start is retried by the next caller). */
  ready(): Promise<void> {
    this.starting ??= this.start().catch((err) => {
      this.starting = undefined;
      throw err;
    });
    return this.starting;
  }

  private async start(): Promise<void> {
    // postgres.js registers the callbacks before its LISTEN runs and keeps them when it fails (and
    // re-listens with them later): every start retried during an outage left one more registration,
    // and each notification was then handled that many times. A failed start's callbacks are muted
    // (listenUntilStopped), as are a stopped hub's, which after a reconnect unlisten no longer removes.
    const { state, unlisten } = await listenUntilStopped(
      this.o.sql,
      EVENTS_CHANNEL,
      (payload) => this.onNotification(payload),
      // Called on the first LISTEN and after every reconnect.
      () => this.connected(),
    );
    this.unlisten = unlisten;
    this.listenState = state as unknown as { pid: unknown; secret: unknown };
    this.caughtUpFor = this.connection();
    if (!this.stopped) this.scheduleSweep();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.sweepTimer);
    await this.starting?.catch(() => {});
    clearTimeout(this.sweepTimer);
    await this.unlisten?.().catch(() => {});
    this.tasks.clear();
  }

  private scheduleSweep(): void {
    this.sweepTimer = setTimeout(() => {
      this.sweepOnce()
        .catch((err) => this.o.logger.warn({ err }, "event subscription sweep failed"))
        .finally(() => {
          if (!this.stopped) this.scheduleSweep();
        });
    }, this.o.sweepIntervalMs ?? DEFAULT_SWEEP_INTERVAL_MS);
    this.sweepTimer.unref();
  }

  /**
   * Ends every subscription whose task is finished or gone: first delivers what the table holds after
   * its last event (a subscriber that gets the closing event ends by itself), then calls `end` on the
   * rest — those that asked for events after the task's last one, or whose task was deleted. One
   * query for all subscribed tasks. Returns how many tasks it closed.
   */
  async sweepOnce(): Promise<number> {
    const taskIds = [...this.tasks.keys()];
    if (taskIds.length === 0) return 0;
    const stillOpen = await tasksOpen(this.o.sql, taskIds);
    const ended = taskIds.filter((id) => !stillOpen.has(id));
    for (const taskId of ended) {
      this.enqueue(taskId, async (owedTo) => {
        try {
          await this.catchUp(taskId, owedTo);
        } finally {
          // Even when the catch-up failed: a client that resumes by Last-Event-ID loses nothing,
          // while a stream left open would outlive its task.
          for (const sub of [...(this.tasks.get(taskId) ?? [])]) {
            try {
              sub.end();
            } catch (err) {
              this.threw(taskId, sub, err);
            }
          }
        }
      });
    }
    await Promise.all(ended.map((taskId) => this.chains.get(taskId)));
    return ended.length;
  }

  /** Subscribers currently attached (for metrics and tests). */
  get size(): number {
    let n = 0;
    for (const subs of this.tasks.values()) n += subs.size;
    return n;
  }

  /**
   * Delivers every event of `taskId` with an id above `afterId`, as it is announced; `end` is called
   * when the sweep finds the task finished or deleted and the subscription still there; `fail` when
   * the hub could not deliver (a read of the table failed while it was subscribed; or its own
   * `deliver` or `end` threw), after which the subscription is gone and nothing more is delivered —
   * the subscriber must not take that for the end of the task. Returns the unsubscribe function
   * (idempotent).
   */
  subscribe(
    taskId: string,
    afterId: string | null,
    deliver: (events: TaskEvent[]) => void,
    end: () => void = () => {},
    fail: () => void = end,
  ): Subscription {
    const sub: Subscriber = { after: BigInt(afterId ?? 0), since: ++this.subscriptions, deliver, end, fail };
    let subs = this.tasks.get(taskId);
    if (!subs) {
      subs = new Set();
      this.tasks.set(taskId, subs);
    }
    subs.add(sub);
    // The task's chain is not dropped here: a delivery may be in flight (see chains).
    const unsubscribe = () => this.detach(taskId, sub);
    return Object.assign(unsubscribe, {
      advance: (id: string) => {
        const at = BigInt(id);
        if (at > sub.after) sub.after = at;
      },
      rewind: () => {
        sub.after = 0n;
      },
    });
  }

  /** The LISTEN connection's identity (see listenState); undefined before the first LISTEN returned. */
  private connection(): string | undefined {
    const s = this.listenState;
    // Without BackendKeyData (a pooler may not send it) there is no identity to go by: undefined,
    // so every onlisten catches up, as before the identity was used.
    return s && s.pid != null ? `${String(s.pid)}:${String(s.secret)}` : undefined;
  }

  /**
   * A (re)connected LISTEN connection: every subscribed task catches up from the table, once per
   * connection (from onlisten, or from the first notification that arrives before it).
   */
  private connected(): void {
    const connection = this.connection();
    if (connection !== undefined && connection === this.caughtUpFor) return;
    this.caughtUpFor = connection;
    if (this.reconnects++ > 0) this.o.logger.warn("event listener reconnected; catching up from the table");
    for (const taskId of this.tasks.keys()) this.enqueue(taskId, (owedTo) => this.catchUp(taskId, owedTo));
  }

  private onNotification(raw: string): void {
    if (this.connection() !== this.caughtUpFor) this.connected();
    let payload: Payload;
    try {
      payload = JSON.parse(raw) as Payload;
    } catch {
      this.o.logger.warn("ignored a malformed event notification");
      return;
    }
    this.received.notifications++;
    if (!("events" in payload)) this.received.doorbells++;
    if (!this.tasks.has(payload.taskId)) return;
    if ("events" in payload)
      this.enqueue(payload.taskId, async () => this.fanOut(payload.taskId, payload.events));
    else this.enqueue(payload.taskId, (owedTo) => this.catchUp(payload.taskId, owedTo));
  }

  private enqueue(taskId: string, work: (owedTo: number) => Promise<void>): void {
    // Who this delivery is owed to: the subscribers so far. What a failed one would have delivered
    // was committed before it was enqueued (a doorbell's event, an outage's events; later events
    // have deliveries of their own, queued behind it), and a later subscriber reads the table for
    // that after subscribing (a stream's backlog) — breaking it off too only made its client
    // reconnect for nothing.
    const owedTo = this.subscriptions;
    const next = (this.chains.get(taskId) ?? Promise.resolve())
      .then(() => work(owedTo))
      .catch((err) => {
        // The subscribers may now miss events (a catch-up that failed read none of them), and the next
        // notification would move them past the gap: their streams are broken off instead, and their
        // clients resume from the table by Last-Event-ID.
        const subs = [...(this.tasks.get(taskId) ?? [])].filter((sub) => sub.since <= owedTo);
        this.o.logger.warn(
          { err, taskId, streams: subs.length },
          "event delivery failed; streams broken off",
        );
        for (const sub of subs) this.failSubscriber(taskId, sub);
      });
    this.chains.set(taskId, next);
    // A settled chain is as good as none: dropped once its last delivery is done.
    void next.then(() => {
      if (this.chains.get(taskId) === next) this.chains.delete(taskId);
    });
  }

  /** Whether `sub` was still subscribed. */
  private detach(taskId: string, sub: Subscriber): boolean {
    const set = this.tasks.get(taskId);
    if (!set?.delete(sub)) return false;
    if (set.size === 0) this.tasks.delete(taskId);
    return true;
  }

  /** Detaches a subscriber and calls its `fail` (which must not break the caller's loop by throwing). */
  private failSubscriber(taskId: string, sub: Subscriber): void {
    // One that has unsubscribed (and then thrown) is not called again.
    if (!this.detach(taskId, sub)) return;
    try {
      sub.fail();
    } catch (err) {
      this.o.logger.warn({ err, taskId }, "an event subscriber's fail callback threw");
    }
  }

  /**
   * A subscriber's callback threw: it is detached and failed. It must not keep the event from the
   * subscribers after it, or break them all off as a failed delivery (nor, thrown from the chain's
   * error handler, end the process as an unhandled rejection).
   */
  private threw(taskId: string, sub: Subscriber, err: unknown): void {
    this.o.logger.warn({ err, taskId }, "an event subscriber's callback threw; its stream is broken off");
    this.failSubscriber(taskId, sub);
  }

  private fanOut(taskId: string, events: TaskEvent[]): void {
    for (const sub of this.tasks.get(taskId) ?? []) {
      const fresh = events.filter((e) => BigInt(e.id) > sub.after);
      if (fresh.length === 0) continue;
      sub.after = BigInt(fresh.at(-1)?.id ?? sub.after);
      try {
        sub.deliver(fresh);
      } catch (err) {
        this.threw(taskId, sub, err);
      }
    }
  }

  /**
   * Reads what the subscribers of a task have not seen yet (a doorbell, or after a reconnect): those
   * it is owed to, the subscriptions up to `owedTo` (see enqueue). One that came since reads the
   * table itself (a stream's backlog), and a catch-up that started from its position — a stream's 0,
   * or where its backlog stands — read that history a second time, page by page, beside it.
   */
  private async catchUp(taskId: string, owedTo: number): Promise<void> {
    let after: bigint | undefined;
    for (;;) {
      // The least of the subscribers' positions, taken again before every page: a stream's backlog
      // advances its subscription meanwhile (Subscription.advance), and a catch-up that kept to where
      // it started — a stream's 0, when it began before the backlog's first page — read the task's
      // whole history again, page by page, for nobody. Never back: a subscriber that came since is
      // owed only what is announced after it came (its backlog reads the rest). (The position once
      // started from 2^53 − 1, so with every subscriber past that — ids are bigint — a catch-up read
      // from there, far behind them.)
      let least: bigint | undefined;
      for (const s of this.tasks.get(taskId) ?? [])
        if (s.since <= owedTo && (least === undefined || s.after < least)) least = s.after;
      if (least === undefined) return;
      if (after === undefined || least > after) after = least;
      const events = await eventsAfter(this.o.sql, taskId, after.toString(), CATCH_UP_PAGE);
      this.fanOut(taskId, events);
      if (events.length < CATCH_UP_PAGE) return;
      after = BigInt(events.at(-1)?.id ?? after);
    }
  }
}
