// A task's Server-Sent Events for the CLI: the stream read with fetch (the token travels in the
// Authorization header), resumed with Last-Event-ID after any drop — an API restart, a reset
// connection, a silent one — so every event is delivered once, in id order. Ids are compared as
// BigInts: they are decimal strings that outgrow both string order and a Number's precision.
import type { LogsPage, TaskEvent, TerminalTaskStatus } from "../http/api-types.ts";
import { logsPage, taskGet } from "./api.ts";
import { type ApiClient, ApiRequestError, ConnectionError, errorOf, idleSignal, NotTheApi } from "./http.ts";
import { sleep } from "./pool.ts";

export interface SseFrame {
  id: string | null;
  event: string | null;
  data: string;
}

/** An incremental text/event-stream parser: feed it text as it arrives, get the complete frames. */
export class SseParser {
  #buffer = "";
  #data: string[] = [];
  #id: string | null = null;
  #event: string | null = null;

  feed(text: string): SseFrame[] {
    this.#buffer += text;
    const frames: SseFrame[] = [];
    for (;;) {
      const nl = this.#buffer.search(/\r\n|\r|\n/);
      // A CR at the very end may be the first half of a CRLF: wait for the next chunk.
      if (nl < 0 || (nl === this.#buffer.length - 1 && this.#buffer.endsWith("\r"))) break;
      const line = this.#buffer.slice(0, nl);
      this.#buffer = this.#buffer.slice(nl + (this.#buffer.startsWith("\r\n", nl) ? 2 : 1));
      const frame = this.#line(line);
      if (frame) frames.push(frame);
    }
    return frames;
  }

  #line(line: string): SseFrame | undefined {
    if (line === "") {
      const frame =
        this.#data.length > 0 ? { id: this.#id, event: this.#event, data: this.#data.join("\n") } : undefined;
      this.#data = [];
      this.#event = null;
      return frame;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + (line[colon + 1] === " " ? 2 : 1));
    if (field === "data") this.#data.push(value);
    else if (field === "id") this.#id = value;
    else if (field === "event") this.#event = value;
    return undefined;
  }
}

const TERMINAL: readonly TerminalTaskStatus[] = [
  "succeeded",
  "partially_succeeded",
  "failed",
  "timed_out",
  "cancelled",
];
// Fails the build when the server gains a terminal status this list lacks.
const _allTerminal: Record<TerminalTaskStatus, true> = {
  succeeded: true,
  partially_succeeded: true,
  failed: true,
  timed_out: true,
  cancelled: true,
};
void _allTerminal;

export const isTerminal = (status: string): status is TerminalTaskStatus =>
  (TERMINAL as readonly string[]).includes(status);

/** The event that closes a task: the server ends the stream after it. */
export const isClosingEvent = (e: TaskEvent) =>
  e.runId === null && e.type.startsWith("task.") && isTerminal(e.type.slice(5));

/**
 * "reset": the server does not know the event the stream resumed from (the database was restored from
 * an older backup): the task's whole log follows, from its first event; what was made of the events
 * before must be dropped.
 */
export type StreamState = "live" | "reconnecting" | "reset";

export interface FollowOptions {
  signal: AbortSignal;
  /** Resume after this event id (exclusive); from the start when null. */
  after?: string | null;
  /** Told when the stream drops ("reconnecting", why), when it is back ("live"), and of a "reset". */
  onState?: (state: StreamState, detail: string) => void;
  /** Give up with a ConnectionError after this long without a working stream (default 10 min). */
  giveUpMs?: number;
  /** A stream silent this long (not even a keep-alive) is taken for dead and reopened (default 60 s). */
  idleMs?: number;
}

const backoff = (failures: number) => Math.min(250 * 2 ** (failures - 1), 5000) * (0.75 + Math.random() / 2);

/**
 * The task's events after `after`, in id order, each once, until the closing event. Drops are
 * retried with backoff and resumed from the last id delivered; a 4xx (401, 404) ends it with an
 * ApiRequestError. Returns quietly when `signal` aborts.
 */
export async function* taskEvents(c: ApiClient, taskId: string, o: FollowOptions): AsyncGenerator<TaskEvent> {
  const cursor = { last: o.after == null ? null : BigInt(o.after) };
  let failures = 0;
  let failingSince: number | null = null;
  let dropped = false;
  while (!o.signal.aborted) {
    try {
      const outcome = yield* oneStream(c, taskId, cursor, o, () => {
        if (dropped) o.onState?.("live", "reconnected");
        dropped = false;
        failures = 0;
        failingSince = null;
      });
      if (outcome === "closed") return;
      // A clean end without the closing event: the server is going away, or the task ended in a
      // way the stream did not carry. A finished task has all its events in the log. Asked once:
      // this loop is what tries again (a GET's own retries said "trying again (attempt 2 of 6)" under
      // the bars, and their "gave up" became the reason of a reconnect that went on).
      const task = await taskGet(c, taskId, o.signal, true);
      if (isTerminal(task.status)) return yield* rest(c, taskId, cursor, o);
      await sleep(100, o.signal);
    } catch (err) {
      if (o.signal.aborted) return;
      // A 4xx (401, 404), or an answer not the API's (a redirect, a proxy's page): minutes of retries
      // would not mend either.
      if ((err instanceof ApiRequestError && err.status < 500) || err instanceof NotTheApi) throw err;
      failures++;
      failingSince ??= performance.now();
      const why = err instanceof Error ? err.message : String(err);
      if (performance.now() - failingSince > (o.giveUpMs ?? 600_000)) {
        throw new ConnectionError(`gave up following task ${taskId}: ${why}`);
      }
      // Said once an outage (not on every attempt), with its first reason.
      if (!dropped) o.onState?.("reconnecting", why);
      dropped = true;
      await sleep(
        Math.max(backoff(failures), err instanceof TooManyStreams ? err.retryAfterMs : 0),
        o.signal,
      );
    }
  }
}

/** A 429 of the stream's: retried like a drop, not before `retryAfterMs`. */
class TooManyStreams extends ConnectionError {
  readonly retryAfterMs: number;
  constructor(message: string, retryAfterMs: number) {
    super(message);
    this.retryAfterMs = retryAfterMs;
  }
}

/** A Retry-After in seconds as milliseconds, at most a minute (0 when absent or not a number). */
const retryAfterMs = (header: string | null) => {
  const seconds = Number(header ?? "");
  return Number.isFinite(seconds) && seconds > 0 ? Math.min(seconds, 60) * 1000 : 0;
};

type Cursor = { last: bigint | null };

/** One connection: yields new events; "closed" after the closing event, "ended" when the server ends it. */
async function* oneStream(
  c: ApiClient,
  taskId: string,
  cursor: Cursor,
  o: FollowOptions,
  onOpen: () => void,
): AsyncGenerator<TaskEvent, "closed" | "ended"> {
  const idle = idleSignal(o.signal, o.idleMs ?? 60_000, () => new ConnectionError("the stream went silent"));
  const signal = idle.signal;
  try {
    idle.touch();
    const res = await c.send("GET", `/api/analysis-tasks/${encodeURIComponent(taskId)}/events`, {
      signal,
      timeoutMs: 0,
      headers: {
        accept: "text/event-stream",
        ...(cursor.last === null ? {} : { "last-event-id": String(cursor.last) }),
      },
    });
    if (!res.ok || !res.body) {
      const err = await errorOf(res, c.shownUrl);
      // 429: the server holds as many of this user's streams as it takes (ASSAY_SSE_MAX_STREAMS_PER_USER)
      // or as many as it serves; one ends sooner or later, so it is asked again, as after a drop, but
      // not before its Retry-After.
      if (err instanceof ApiRequestError && err.status === 429)
        throw new TooManyStreams(
          `${err.message} (${err.code})`,
          retryAfterMs(res.headers.get("retry-after")),
        );
      throw err instanceof ApiRequestError && err.status >= 500
        ? new ConnectionError(`${err.message} (${err.code})`)
        : err;
    }
    // A 200 that is not an event stream (a proxy's page for a path it does not route, an app's
    // index.html) would end at once without an event, and be asked again every 100 ms for ever.
    const type = res.headers.get("content-type") ?? "";
    if (!/^text\/event-stream\b/i.test(type)) {
      await res.body.cancel().catch(() => {});
      throw new NotTheApi(
        `${c.shownUrl} answered the event stream with ${type ? JSON.stringify(type.slice(0, 80)) : "no content type"}, not text/event-stream: not the API's answer (a proxy's, or no Assay server there)`,
      );
    }
    onOpen();
    const parser = new SseParser();
    const decoder = new TextDecoder();
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      idle.touch();
      for (const frame of parser.feed(decoder.decode(chunk, { stream: true }))) {
        if (frame.event === "reset") {
          cursor.last = null;
          o.onState?.("reset", resetMessage(frame.data));
          continue;
        }
        const event = fresh(frame, cursor);
        if (!event) continue;
        yield event;
        if (isClosingEvent(event)) return "closed";
      }
    }
    return "ended";
  } catch (err) {
    const stalled = idle.stalled();
    if (stalled) throw stalled;
    if (err instanceof ApiRequestError || err instanceof ConnectionError || o.signal.aborted) throw err;
    // A body that broke off mid-stream ("terminated", a reset socket).
    throw new ConnectionError(`the stream broke off (${(err as Error).message})`);
  } finally {
    idle.done();
  }
}

/** What a reset frame says (its `message`), or a plain line when it says nothing readable. */
function resetMessage(data: string): string {
  try {
    const message = (JSON.parse(data) as { message?: unknown }).message;
    if (typeof message === "string") return message;
  } catch {
    // Not JSON: the plain line below.
  }
  return "the server does not know the last event seen: the whole log follows";
}

/** The frame's event if its id is past the cursor (which then moves to it). */
function fresh(frame: SseFrame, cursor: Cursor): TaskEvent | undefined {
  if (frame.id === null || !/^[0-9]+$/.test(frame.id)) return undefined;
  const id = BigInt(frame.id);
  if (cursor.last !== null && id <= cursor.last) return undefined;
  cursor.last = id;
  return JSON.parse(frame.data) as TaskEvent;
}

/**
 * What the log holds after the cursor, page by page (a finished task's stream had less). Ctrl-C stops
 * it between pages and cuts off the page in flight: a 100,000-run task's log is hundreds of pages.
 */
async function* rest(
  c: ApiClient,
  taskId: string,
  cursor: Cursor,
  o: FollowOptions,
): AsyncGenerator<TaskEvent> {
  const { signal } = o;
  while (!signal.aborted) {
    let page: LogsPage;
    try {
      // Asked once, as the task above: the stream's loop tries again.
      page = await logsPage(c, taskId, cursor.last === null ? null : String(cursor.last), 1000, signal, true);
    } catch (err) {
      // A cursor the log does not know (the database was restored from an older backup): a 400, the
      // only one a page of 1,000 after a cursor can get. Read from the start, as after a stream's reset.
      if (!(err instanceof ApiRequestError && err.status === 400 && cursor.last !== null)) throw err;
      cursor.last = null;
      o.onState?.(
        "reset",
        "the last event seen is not in the task's log (was the database restored from a backup?): the whole log follows",
      );
      continue;
    }
    for (const e of page.items) {
      const id = BigInt(e.id);
      if (cursor.last !== null && id <= cursor.last) continue;
      cursor.last = id;
      yield e;
    }
    if (page.nextCursor === null) return;
  }
}
