// Task events: JSON pages (/logs) and a live Server-Sent Events stream (/events).
import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import type { FastifyReply, FastifyRequest } from "fastify";
import { Type } from "typebox";
import { atDeadline } from "../../auth/token-watch.ts";
import { type Role, tokenAuthenticate, tokenRoles } from "../../auth/tokens.ts";
import type { Sql } from "../../db/client.ts";
import type { EventHub } from "../../events/hub.ts";
import { eventsAfter, isFinalEvent, isTaskEvent, type TaskEvent } from "../../events/read.ts";
import { tasksOpen, taskVisible } from "../../tasks/read.ts";
import { LogsPageBody, LogsQuery } from "../api-types.ts";
import { bearerOf, principalOf } from "../auth.ts";
import { ApiError, notFound, validationFailed } from "../errors.ts";
import { noHead } from "../no-head.ts";
import { Envelope, ErrorBody, errorResponses, IdParam, isId, ok } from "../schemas.ts";

const BACKLOG_PAGE = 500;

/** A stream whose client reads slower than this much buffered output is broken off; it resumes by Last-Event-ID. */
const MAX_BUFFERED_BYTES = 1024 * 1024;

/**
 * While the backlog is sent, the stream waits for the client once this much is buffered in the
 * process: a slow reader of a long log holds this (and a frame), not MAX_BUFFERED_BYTES and a page.
 */
const BACKLOG_WRITE_BYTES = 64 * 1024;

/**
 * One SSE frame per event object. The hub hands the same object to every subscriber of a task, so with
 * a thousand streams on a task the event is formatted once, not a thousand times.
 */
const frames = new WeakMap<TaskEvent, string>();
function frame(event: TaskEvent): string {
  let text = frames.get(event);
  if (text === undefined) {
    text = `id: ${event.id}\nevent: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`;
    frames.set(event, text);
  }
  return text;
}

/**
 * The frame that tells a client its Last-Event-ID names none of the task's events (the database was
 * restored from an older backup, whose event ids are handed out again, or the id is not this task's):
 * the task's whole log follows, from its first event. It has no event id of its own: its `id:` line is
 * empty, which makes an EventSource forget the id it held, and a client that reads only numeric ids
 * passes over it. A client that knows it starts its view of the task over (and its id with it).
 */
export function resetFrame(lastEventId: string): string {
  const data = {
    reason: "LAST_EVENT_ID_UNKNOWN",
    lastEventId,
    message: `Event ${lastEventId} is not in this task's log (was the database restored from a backup?): the whole log follows, from its first event.`,
  };
  return `event: reset\nid:\ndata: ${JSON.stringify(data)}\n\n`;
}

export interface StreamTarget {
  write(chunk: string): boolean;
  readonly writableLength: number;
  /** Ends the stream (idempotent). */
  close(): void;
  /** Breaks the stream off, so the client sees an error rather than an end (idempotent). */
  destroy(): void;
  /** Resolves when the buffered output has been taken by the client, or the stream is gone. */
  drained?(): Promise<void>;
}

/**
 * Serves one task's events to `target`: the backlog after `after` from the table, then live events from
 * the hub, without gaps or repeats (the subscription starts before the backlog is read; what it delivers
 * meanwhile the backlog reads from the table; every write skips ids already sent). Live events are written synchronously from the hub's
 * delivery, one shared frame each. Ends after the event that closes the task; right after the backlog
 * when the task had already ended when the stream subscribed (a client resuming from the closing event's id is owed
 * nothing more; one resuming from an id that is none of the task's events is sent a reset and the whole log); when the hub's sweep finds the task ended or deleted; when `signal` aborts; or when
 * the client falls too far behind.
 */
export async function serveTaskEvents(
  hub: EventHub,
  sql: Sql,
  taskId: string,
  after: string | null,
  target: StreamTarget,
  signal: AbortSignal,
): Promise<void> {
  let last = BigInt(after ?? 0);
  let live = false;
  let done = false;
  // The highest id the hub delivered while the backlog was read. Those events are in the table (a
  // delivery follows the commit), so the backlog reads them itself: nothing delivered meanwhile is
  // kept, however long the backlog or however much a catch-up of the hub reads meanwhile.
  let seen = 0n;
  let stopped!: () => void;
  const whenStopped = new Promise<void>((resolve) => {
    stopped = resolve;
  });
  const stop = (how: "close" | "destroy") => {
    if (done) return;
    done = true;
    stopped();
    unsubscribe();
    signal.removeEventListener("abort", onAbort);
    target[how]();
  };
  const finish = () => stop("close");
  // Ended from outside (a shutdown, a revoke, the client gone): a graceful end waits for the client
  // to take what is queued, so one that has fallen this far behind (a slow reader in the backlog)
  // is broken off. (The task's own end is always graceful: the closing event is in what is queued.)
  const onAbort = () => stop(target.writableLength > MAX_BUFFERED_BYTES ? "destroy" : "close");
  // Not a clean end: the client must not take it for the end of the task, and resumes by
  // Last-Event-ID (a frame is dispatched only whole, so a cut one is sent again).
  const breakOff = () => stop("destroy");
  const write = (event: TaskEvent) => {
    if (done || BigInt(event.id) <= last) return;
    last = BigInt(event.id);
    target.write(frame(event));
    if (isFinalEvent(event)) finish();
    // A client that stopped reading would otherwise keep its socket and the buffer for as long as
    // it likes: a graceful end waits for it to read. (The backlog waits for the client instead.)
    else if (live && target.writableLength > MAX_BUFFERED_BYTES) breakOff();
  };
  // The backlog is read as fast as the table gives it: a client that reads more slowly, but reads,
  // is waited for (once BACKLOG_WRITE_BYTES is buffered), not broken off (and made to start over) for
  // falling behind.
  const keepUp = async (bytes: number) => {
    // Raced with the stream's end: a stream ended meanwhile must not wait for a reader that may never read.
    if (!done && target.writableLength > bytes && target.drained)
      await Promise.race([target.drained(), whenStopped]);
  };
  // Subscribed synchronously here, so the stream is subscribed before its headers reach the client;
  // from the Last-Event-ID, and rewound to the start if the task's log does not know it (below).
  // (Subscribed from the start until then, a catch-up of the hub meanwhile read the task's whole
  // history: 3,002 rows of 3,002 in a review's test.)
  const unsubscribe = hub.subscribe(
    taskId,
    after,
    (events) => {
      if (live) for (const e of events) write(e);
      else
        for (const e of events) {
          const id = BigInt(e.id);
          if (id > seen) seen = id;
        }
    },
    // The sweep found the task ended: before the backlog is sent, the check after it ends the stream.
    () => {
      if (live) finish();
    },
    // The hub could not deliver (a read failed): events may be missing, so no clean end.
    breakOff,
  );
  signal.addEventListener("abort", onAbort);
  if (signal.aborted) return onAbort();
  try {
    // A Last-Event-ID that names none of the task's events: after a restore from an older backup the
    // ids the client saw are handed out again, so "the events after it by number" would skip every
    // event until the ids pass it, the task's closing event too. The client is told, and gets the
    // whole log. (A resume names an event it was sent; 0 is the start.)
    if (last > 0n && !(await isTaskEvent(sql, taskId, last.toString()))) {
      if (done) return;
      target.write(resetFrame(last.toString()));
      last = 0n;
      // Before the backlog's first read: what the hub held back meanwhile (ids at or below the one
      // given) committed before that read, which has it; what comes after is delivered.
      unsubscribe.rewind();
    }
    // Asked after subscribing and before the backlog: a task that has ended by now has every event
    // in the table, so the backlog holds all that is due. (Asked after the backlog, a task that ended
    // in between would end the stream before the hub delivered its closing event.)
    const ended = !(await tasksOpen(sql, [taskId])).has(taskId);
    for (;;) {
      // Delivered before this read began, so committed before it: the read has it (see below).
      const known = seen;
      const page = await eventsAfter(sql, taskId, last.toString(), BACKLOG_PAGE);
      for (const event of page) {
        write(event);
        if (target.writableLength > BACKLOG_WRITE_BYTES) {
          // A catch-up of the hub while this waits (a doorbell) reads on from here, not from where
          // the page began; its deliveries only raise `seen` (so `more` below): the next read has them.
          unsubscribe.advance(last.toString());
          await keepUp(BACKLOG_WRITE_BYTES);
          if (done) return;
        }
      }
      // The hub's deliveries and catch-ups start from here.
      unsubscribe.advance(last.toString());
      if (done) return;
      // Delivered before the read began, and not in the table: retention deleted the task (its sweep
      // would end the stream as well). One delivered while the read ran may have committed after its
      // snapshot: the next read has it (taken for a deletion, it ended a running task's stream).
      if (page.length === 0 && known > last) return finish();
      // Caught up with the table and with every delivery: the last read saw them all.
      const more = page.length === BACKLOG_PAGE || seen > last;
      if (!more && ended) return finish();
      // Live from here, with nothing awaited since that read but the waits above (a delivery in one
      // raised `seen`, and so `more`: none fell in between unseen), once
      // the client has taken what the backlog wrote: a live stream 1 MiB behind is broken off.
      if (!more && target.writableLength <= MAX_BUFFERED_BYTES) break;
      await keepUp(MAX_BUFFERED_BYTES);
      if (done) return;
    }
  } catch (err) {
    // Not a clean end: the client must not take a failed read for the end of the task.
    breakOff();
    throw err;
  }
  live = true;
}

/** A live stream, as its token's revokes and role changes find it. */
interface LiveStream {
  readonly tokenId: number;
  readonly userId: number;
  /** The role the stream's right to its task was checked with. */
  role: Role;
  /** Its token's expiry (monotonic ms), as that check found it; absent when it has none. */
  deadline?: number | undefined;
  readonly revoked: AbortController;
}

export const eventRoutes: FastifyPluginAsyncTypebox<{ streams: AbortSignal }> = async (app, opts) => {
  // A stream checks its token and its right to the task once, at its start. So a revoke ends the
  // token's streams; a role change ("*"), or a reconnect of the LISTEN connection (a revoke may have
  // been missed meanwhile), checks every stream's token again, and ends those revoked or whose role
  // changed. Their clients reconnect and are checked again (a revoked token gets 401).
  const live = new Set<LiveStream>();
  // Streams per user, for ASSAY_SSE_MAX_STREAMS_PER_USER (kept with `live`).
  const perUser = new Map<number, number>();
  const enter = (stream: LiveStream) => {
    live.add(stream);
    perUser.set(stream.userId, (perUser.get(stream.userId) ?? 0) + 1);
  };
  const leave = (stream: LiveStream) => {
    if (!live.delete(stream)) return;
    const n = (perUser.get(stream.userId) ?? 1) - 1;
    if (n > 0) perUser.set(stream.userId, n);
    else perUser.delete(stream.userId);
  };
  // Until 2026-12-07 nothing bounded them: one user's 20,000 streams took every file descriptor of
  // the process, and every other request (health checks too) failed. Refused before anything is
  // asked of the database; logged at warn once a minute at most, with how many were refused.
  let refused = 0;
  let warnedAt = Number.NEGATIVE_INFINITY;
  const refuse = (request: FastifyRequest, reply: FastifyReply, userId: number, whose: "user" | "server") => {
    refused++;
    if (performance.now() - warnedAt >= 60_000) {
      request.log.warn(
        { userId, streams: live.size, userStreams: perUser.get(userId) ?? 0, refused },
        whose === "user"
          ? "event streams refused: a user holds ASSAY_SSE_MAX_STREAMS_PER_USER of them"
          : "event streams refused: this process serves ASSAY_SSE_MAX_STREAMS of them",
      );
      warnedAt = performance.now();
      refused = 0;
    }
    reply.header("retry-after", "10");
    return new ApiError(
      429,
      "TOO_MANY_STREAMS",
      whose === "user"
        ? "You have too many event streams open on this server; close some (each task page or `assay follow` holds one) and try again."
        : "This server serves as many event streams as it can; try again shortly.",
    );
  };
  let checking = false;
  let checkAgain = false;
  const checkAll = async () => {
    if (checking) {
      checkAgain = true;
      return;
    }
    checking = true;
    try {
      do {
        checkAgain = false;
        const streams = [...live];
        if (streams.length === 0) continue;
        let roles: Map<number, Role> | undefined;
        try {
          roles = await tokenRoles(app.services.database.sql, [...new Set(streams.map((s) => s.tokenId))]);
        } catch (err) {
          // Unchecked is not kept: every stream ends, and its client is checked as it reconnects.
          app.log.warn({ err }, "could not check the live streams' tokens again: ending them");
        }
        for (const s of streams) if (roles?.get(s.tokenId) !== s.role) s.revoked.abort();
      } while (checkAgain);
    } finally {
      checking = false;
    }
  };
  /**
   * Registers a stream, then checks its token and its right to the task again (401, 404): a revoke or
   * role change announced from its registration on reaches it, and one announced since the request's
   * own check (which was before) is caught by this one. The stream leaves the register as `closed` aborts.
   */
  const admit = async (
    request: FastifyRequest,
    reply: FastifyReply,
    taskId: string,
    closed: AbortSignal,
  ): Promise<LiveStream> => {
    const { sseMaxStreams, sseMaxStreamsPerUser } = app.services.config;
    for (let tries = 1; ; tries++) {
      const { tokenId, userId, role } = principalOf(request);
      if (sseMaxStreamsPerUser > 0 && (perUser.get(userId) ?? 0) >= sseMaxStreamsPerUser)
        throw refuse(request, reply, userId, "user");
      if (sseMaxStreams > 0 && live.size >= sseMaxStreams) throw refuse(request, reply, userId, "server");
      const stream: LiveStream = { tokenId, userId, role, revoked: new AbortController() };
      const forget = () => {
        leave(stream);
        closed.removeEventListener("abort", forget);
      };
      if (!closed.aborted) {
        enter(stream);
        closed.addEventListener("abort", forget);
      }
      try {
        const sql = app.services.database.sql;
        const now = await tokenAuthenticate(sql, bearerOf(request), app.services.tokens);
        if (!now) throw new ApiError(401, "UNAUTHORIZED");
        stream.role = now.role;
        stream.deadline = now.deadline;
        if (!(await taskVisible(sql, now, taskId))) throw notFound("ANALYSIS_TASK_NOT_FOUND");
        await app.services.events.ready();
      } catch (err) {
        forget();
        throw err;
      }
      if (!stream.revoked.signal.aborted) return stream;
      // Ended by a revoke of its token, or by a check of every stream (a role change, maybe another
      // user's, or a reconnect) that may have seen what it held before its own check: check again.
      forget();
      if (tries === 3) throw new ApiError(401, "UNAUTHORIZED");
    }
  };

  const stopRevokes = app.services.tokens?.onRevoke((tokenId) => {
    if (tokenId === "*") return void checkAll();
    for (const s of live) if (s.tokenId === Number(tokenId)) s.revoked.abort();
  });
  app.addHook("onClose", async () => {
    stopRevokes?.();
  });

  app.get(
    "/analysis-tasks/:taskId/logs",
    {
      schema: {
        summary: "The task's events (lifecycle and progress), oldest first, in pages",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam }),
        querystring: LogsQuery,
        response: { 200: Envelope(LogsPageBody), ...errorResponses },
      },
    },
    async (request) => {
      const { taskId } = request.params;
      const sql = app.services.database.sql;
      if (!isId(taskId) || !(await taskVisible(sql, principalOf(request), taskId)))
        throw notFound("ANALYSIS_TASK_NOT_FOUND");
      const limit = request.query.limit ?? 100;
      const after = request.query.after ?? null;
      // A cursor that names none of the task's events (see serveTaskEvents): after a restore from an
      // older backup, the events after it by number are not the events after what the client read.
      if (after !== null && BigInt(after) > 0n && !(await isTaskEvent(sql, taskId, after)))
        throw validationFailed(
          `after must be the id of one of this task's events, and ${after} is none (was the database restored from a backup?): read the log again from its start.`,
        );
      const items = await eventsAfter(sql, taskId, after, limit);
      return ok({ items, nextCursor: items.length === limit ? (items.at(-1)?.id ?? null) : null });
    },
  );

  noHead(app, "/analysis-tasks/:taskId/events");
  app.get(
    "/analysis-tasks/:taskId/events",
    {
      exposeHeadRoute: false,
      sse: "only",
      schema: {
        summary: "Server-Sent Events: the backlog after Last-Event-ID, then live events until the task ends",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam }),
        headers: Type.Object({ "last-event-id": Type.Optional(Type.String()) }),
        response: { 429: ErrorBody, ...errorResponses },
      },
    },
    async (request, reply) => {
      // Listen for the client going away before the first await: a client that leaves while the task
      // is looked up or the hub starts would otherwise leave a subscription until the task ends.
      const closed = new AbortController();
      reply.raw.once("close", () => closed.abort());
      if (reply.raw.destroyed) closed.abort();
      const { taskId } = request.params;
      const sql = app.services.database.sql;
      if (!isId(taskId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      const { revoked, deadline } = await admit(request, reply, taskId, closed.signal);
      // A token that expires ends its streams then, as a revoke does (its clients' reconnects get 401).
      if (deadline !== undefined) {
        const stopTimer = atDeadline(deadline, () => {
          request.log.info({ taskId }, "event stream ended: its token expired");
          revoked.abort();
        });
        closed.signal.addEventListener("abort", stopTimer, { once: true });
        if (closed.signal.aborted) stopTimer();
      }
      const lastEventId = request.headers["last-event-id"];
      if (lastEventId !== undefined && !/^[0-9]{1,18}$/.test(lastEventId)) {
        throw validationFailed("Last-Event-ID must be an event id.");
      }
      // Commit the 200 and the headers now: a client waiting on a quiet task must not wait for them
      // (writeHead alone holds them back until the first write: the first keep-alive, or never).
      reply.sse.sendHeaders();
      reply.raw.flushHeaders();
      reply.sse.keepAlive();
      const raw = reply.raw;
      // A client that stops reading: once the socket's buffers are full nothing more is handed to
      // it, and the socket's inactivity timer runs (a write handed over or completed, or a byte read,
      // restarts it). Without this such a client kept its socket, what the stream had buffered (up
      // to MAX_BUFFERED_BYTES and a page, also after the stream ended) and while the task lived its
      // subscription, for as long as it liked. A reading client of a quiet task takes a keep-alive
      // every interval, so the bound is at least two of them. The kernel wakes a writer of a full
      // socket only once a good part of its send buffer has gone, so a client reading a long log
      // steadily but slower than that much per bound is cut off too (measured over loopback: gaps of
      // 400–600 KB, so below ~10 KB/s at 60 s); it resumes by Last-Event-ID, where it was.
      const { sseStallMs, sseHeartbeatMs } = app.services.config;
      raw.setTimeout(Math.max(sseStallMs, 2 * sseHeartbeatMs), () => {
        request.log.info({ taskId }, "event stream cut off: its client took nothing for too long");
        raw.destroy();
      });
      await serveTaskEvents(
        app.services.events,
        sql,
        taskId,
        lastEventId ?? null,
        {
          write: (chunk) => raw.write(chunk),
          get writableLength() {
            return raw.writableLength;
          },
          close: () => reply.sse.close(),
          destroy: () => raw.destroy(),
          drained: () =>
            new Promise<void>((resolve) => {
              const done = () => {
                raw.off("drain", done);
                raw.off("close", done);
                resolve();
              };
              raw.on("drain", done);
              raw.on("close", done);
              if (raw.destroyed || raw.writableLength === 0) done();
            }),
        },
        AbortSignal.any([closed.signal, opts.streams, revoked.signal]),
      );
    },
  );
};
