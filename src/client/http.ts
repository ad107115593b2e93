// The CLI client's HTTP layer: one base URL and one bearer token, the API's envelope unwrapped, and
// every failure sorted into what the user can do about it (exit codes in ./exit.ts). It talks to the
// server over HTTP only and loads nothing of the server: the API's types come from
// src/http/api-types.ts as types alone, which Node erases.
import type { EnvelopeOf, ErrorResponse } from "../http/api-types.ts";
import { sleep } from "./pool.ts";

/** The server answered, with an error body. */
export class ApiRequestError extends Error {
  override name = "ApiRequestError";
  readonly status: number;
  readonly code: string;
  constructor(status: number, code: string, message: string) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** The server could not be reached (refused, reset, timed out, not HTTP). */
export class ConnectionError extends Error {
  override name = "ConnectionError";
}

/**
 * A ConnectionError that asking again would not mend: a redirect, an answer that is not the API's, a
 * server that took the request but did not answer in time.
 */
export class NotRetried extends ConnectionError {}

/**
 * A NotRetried for an answer that did not come from the API: a redirect, a body without the API's
 * envelope (a proxy's page, another service's JSON, whatever its status), a stream that is not one.
 * Nothing that follows the task's stream for minutes would mend it either.
 */
export class NotTheApi extends NotRetried {}

/**
 * How many times a request that can safely be sent again (a GET; an upload, once the server has said
 * it has no file of it) is retried when the connection fails or a gateway answers for the API
 * (retriable): 6 attempts in all, after pauses of 0.5, 1, 2, 4 and 5 s — about 15 s, enough for an API
 * to restart.
 */
export const RETRIES = 5;

/** The pause before the nth retry: 0.5 s, 1 s, 2 s, 4 s, then 5 s each. */
export const retryPause = (retry: number) => Math.min(500 * 2 ** (retry - 1), 5000);

/**
 * Whether asking again may mend `err`: the connection failed or broke off, or a proxy or the closing
 * API answered 502, 503 or 504 (the API restarting). Not a 500 — a bug of the server's, which asking
 * again would only hammer — nor any 4xx.
 */
export const retriable = (err: unknown) =>
  err instanceof ApiRequestError
    ? err.status === 502 || err.status === 503 || err.status === 504
    : err instanceof ConnectionError && !(err instanceof NotRetried);

/**
 * `attempt()` until it succeeds, retried while it fails retriably, RETRIES times with growing pauses,
 * each retry told to `note` ("<what>: <why>; <again> (attempt n of 6)"); a pause ends at once when
 * `signal` aborts, with its reason. `beforeRetry` runs after each pause: what it returns (not
 * undefined) is the result, without another attempt. The last failure names how many attempts were
 * made.
 */
export async function withRetries<T>(
  what: string,
  o: {
    signal?: AbortSignal | undefined;
    note?: ((text: string) => void) | undefined;
    again?: string;
    beforeRetry?: () => Promise<T | undefined>;
  },
  attempt: () => Promise<T>,
): Promise<T> {
  for (let n = 1; ; n++) {
    try {
      return await attempt();
    } catch (err) {
      if (o.signal?.aborted || !retriable(err)) throw err;
      const message = (err as Error).message;
      // Which request, also when the connection failed before any answer ("cannot reach …").
      const why = message.startsWith(`${what}: `) ? message : `${what}: ${message}`;
      const attempts = RETRIES + 1;
      if (n >= attempts) {
        const more = `; gave up after ${attempts} attempts`;
        if (err instanceof ApiRequestError) throw new ApiRequestError(err.status, err.code, `${why}${more}`);
        throw new ConnectionError(`${why}${more}`);
      }
      o.note?.(
        `${err instanceof ApiRequestError ? `${why} (${err.code})` : why}; ${o.again ?? "trying again"} (attempt ${n + 1} of ${attempts})`,
      );
      await sleep(retryPause(n), o.signal);
      if (o.signal?.aborted) throw o.signal.reason;
      const settled = await o.beforeRetry?.();
      if (settled !== undefined) return settled;
    }
  }
}

/**
 * A signal for one long request that also aborts when `touch()` has not been called for `ms` (touch
 * on every chunk received): a server that stalls mid-body would otherwise hold the command for ever.
 * `stalled()` is the error to report when that is why the request failed (the caller's own signal did
 * not abort); `done()` stops the timer and aborts whatever is left of the request.
 */
export function idleSignal(outer: AbortSignal, ms: number, reason: () => Error) {
  const own = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  let fired = false;
  return {
    signal: AbortSignal.any([outer, own.signal]),
    touch(): void {
      if (timer) timer.refresh();
      else
        timer = setTimeout(() => {
          fired = true;
          own.abort(reason());
        }, ms);
    },
    stalled(): unknown {
      return fired && !outer.aborted ? own.signal.reason : undefined;
    },
    done(): void {
      clearTimeout(timer);
      own.abort();
    },
  };
}

export interface RequestOptions {
  query?: Record<string, string | number | undefined>;
  /** A JSON body; or pass `rawBody` with your own content type. */
  json?: unknown;
  rawBody?: NonNullable<RequestInit["body"]>;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Milliseconds until the whole exchange is given up; default 30 s; 0: never (streams, uploads). */
  timeoutMs?: number;
}

const DEFAULT_TIMEOUT_MS = 30_000;

/** The cause's code (`ECONNREFUSED`, `UND_ERR_SOCKET`…) or name, for a one-line message. */
function networkReason(err: unknown): string {
  const cause = (err as { cause?: { code?: unknown; message?: unknown } }).cause;
  if (typeof cause?.code === "string") return cause.code;
  if (typeof cause?.message === "string") return cause.message;
  return err instanceof Error ? err.message : String(err);
}

/** fetch's "fetch failed" (refused, reset, DNS, TLS): a TypeError whose cause is the real error. */
const isNetworkFailure = (err: unknown) => err instanceof TypeError && err.cause !== undefined;

/**
 * Reasons a connection was not made that mean nothing listens there, or no such host. (fetch's "bad
 * port", a port it never connects to, such as 9 or 6000, is never retried.)
 */
const NOT_THERE = new Set(["ECONNREFUSED", "ENOTFOUND"]);

export class ApiClient {
  readonly base: URL;
  readonly #token: string;
  /** Some request of this client has been answered (by anything at its address). */
  #answered = false;
  /** Told, in a sentence, when a request is tried again (the commands: a note on stderr). */
  readonly onRetry: ((note: string) => void) | undefined;

  /** Streamed uploads with this client's server and token. */
  uploader(connections: number, idleMs = UPLOAD_IDLE_MS): Promise<Uploader> {
    return Uploader.open(this, this.#token, connections, idleMs);
  }

  constructor(baseUrl: string, token: string, o: { onRetry?: (note: string) => void } = {}) {
    this.base = new URL(baseUrl.endsWith("/") ? baseUrl : `${baseUrl}/`);
    this.#token = token;
    this.onRetry = o.onRetry;
  }

  /** The base URL as it may be shown: without any user name or password in it. */
  get shownUrl(): string {
    const u = new URL(this.base);
    u.username = "";
    u.password = "";
    return u.origin + u.pathname.replace(/\/$/, "");
  }

  url(path: string, query: RequestOptions["query"] = {}): URL {
    const u = new URL(path.replace(/^\//, ""), this.base);
    for (const [k, v] of Object.entries(query)) if (v !== undefined) u.searchParams.set(k, String(v));
    return u;
  }

  /** The response, whatever its status; throws ConnectionError when there is none. */
  async send(method: string, path: string, o: RequestOptions = {}): Promise<Response> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.#token}`, ...o.headers };
    let body: NonNullable<RequestInit["body"]> | undefined = o.rawBody;
    if (o.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(o.json);
    }
    const ms = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const timeout = ms > 0 ? AbortSignal.timeout(ms) : undefined;
    const signals = [o.signal, timeout].filter((s): s is AbortSignal => s !== undefined);
    const signal = signals.length > 0 ? AbortSignal.any(signals) : undefined;
    const url = this.url(path, o.query);
    let res: Response;
    try {
      res = await fetch(url, {
        method,
        headers,
        redirect: "manual",
        ...(signal === undefined ? {} : { signal }),
        ...(body === undefined ? {} : { body, duplex: "half" }),
      } as RequestInit);
    } catch (err) {
      if (o.signal?.aborted) throw o.signal.reason;
      if (timeout?.aborted) throw new NotRetried(`${this.shownUrl} did not answer in time`);
      // fetch rejects with a TypeError for a request it could not even build too (a header value
      // outside Latin-1, say): only one with a cause — the socket's error — is the network failing.
      if (!isNetworkFailure(err)) throw err;
      const reason = networkReason(err);
      // Nothing answered yet in this command: a refused connection or an unknown host is an address
      // that is wrong (or a server not started), said at once, not after ~15 s of retries. An API that
      // answered before and now refuses is restarting: retried.
      if ((!this.#answered && NOT_THERE.has(reason)) || reason === "bad port")
        throw new NotRetried(`cannot reach ${this.shownUrl} (${reason})`);
      throw new ConnectionError(`cannot reach ${this.shownUrl} (${reason})`);
    }
    this.#answered = true;
    if (isRedirect(res.status)) {
      await res.body?.cancel().catch(() => {});
      throw redirected(this.shownUrl, url, res.headers.get("location"));
    }
    return res;
  }

  /** The `data` of a successful envelope; an error status becomes an ApiRequestError. */
  async json<T>(method: string, path: string, o: RequestOptions = {}): Promise<T> {
    const res = await this.send(method, path, o);
    if (!res.ok) throw await errorOf(res, this.shownUrl);
    return envelopeData<T>(await readText(res, this.shownUrl, o.signal), this.shownUrl);
  }

  /**
   * A GET's `data`, retried (withRetries) when the connection fails or a gateway answers 502, 503 or
   * 504: reading twice changes nothing, and an API restarting must not fail the command.
   */
  /** A GET, tried again as withRetries does; `once`: asked once (a caller whose own loop retries). */
  get<T>(path: string, query?: RequestOptions["query"], signal?: AbortSignal, once = false): Promise<T> {
    const ask = () =>
      this.json<T>("GET", path, {
        ...(query === undefined ? {} : { query }),
        ...(signal === undefined ? {} : { signal }),
      });
    return once ? ask() : withRetries(`reading ${path}`, { signal, note: this.onRetry }, ask);
  }
}

async function readText(res: Response, shownUrl: string, signal?: AbortSignal): Promise<string> {
  try {
    return await res.text();
  } catch (err) {
    if (signal?.aborted) throw signal.reason;
    throw new ConnectionError(`the connection to ${shownUrl} broke (${networkReason(err)})`);
  }
}

/**
 * What a failure while a body was read means: a fetch body cut off mid-way (undici's "terminated",
 * whose cause is the socket's error) is a ConnectionError; anything else (a full disk, an abort) is
 * itself.
 */
export function brokenBody(err: unknown, shownUrl: string, what?: string): unknown {
  if (!isNetworkFailure(err)) return err;
  return new ConnectionError(
    `${what ? `${what}: ` : ""}the connection to ${shownUrl} broke (${networkReason(err)})`,
  );
}

/**
 * The `data` of a success's envelope. Anything else — a page of HTML, JSON of another service
 * (a wrong ASSAY_URL) — is a ConnectionError, not a crash on a missing field further on.
 */
export function envelopeData<T>(text: string, shownUrl: string): T {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    throw new NotTheApi(`${shownUrl} did not answer with JSON: is it an Assay server?`);
  }
  if (typeof body !== "object" || body === null || !("data" in body) || body.data == null)
    throw new NotTheApi(`${shownUrl} did not answer with the API's envelope: is it an Assay server?`);
  return (body as EnvelopeOf<T>).data;
}

const isRedirect = (status: number) => status >= 300 && status < 400;

/**
 * A redirect is not followed, by fetch or the uploads: the API never answers with one, so it comes
 * from something else at ASSAY_URL (a proxy sending http to https, a moved host). Followed, a GET
 * would lose its token on the way (a 401, "check ASSAY_TOKEN"), a POST become a GET, and an upload
 * get "HTTP 301"; instead the command stops at once, saying where the server points.
 */
function redirected(shownUrl: string, from: URL, location: string | null): NotTheApi {
  let to = "elsewhere";
  try {
    const u = new URL(location ?? "", from);
    // Never its credentials or query (a presigned address carries its signature there).
    u.username = "";
    u.password = "";
    u.search = "";
    u.hash = "";
    if (location) to = u.href;
  } catch {
    // A Location that is not a URL: where does not matter, only that it is not the API.
  }
  return new NotTheApi(
    `${shownUrl} answers with a redirect to ${to}: set ASSAY_URL (or --url) to the API's own address`,
  );
}

/**
 * An error response as an ApiRequestError with the body's code and message. A 4xx without the API's
 * error body (`{code, message}`: a proxy's page of HTML, another service's JSON) did not come from the
 * API, whatever its status says: like any other answer that is not the API's, it is a NotTheApi
 * (exit 3, CONNECTION_FAILED), not the caller's mistake (a 404 there is no task of theirs missing). A
 * 5xx keeps its status either way: a gateway's 502, 503 or 504 is the API away, and is retried.
 */
export async function errorOf(res: Response, shownUrl: string): Promise<ApiRequestError | NotTheApi> {
  return errorFromBody(res.status, res.statusText, await res.text().catch(() => ""), shownUrl);
}

function errorFromBody(
  status: number,
  statusText: string,
  text: string,
  shownUrl: string,
): ApiRequestError | NotTheApi {
  let body: Partial<ErrorResponse> = {};
  try {
    body = (JSON.parse(text) ?? {}) as Partial<ErrorResponse>;
  } catch {
    // Not our error body (a proxy's page, say).
  }
  const ours = typeof body.code === "string" && typeof body.message === "string";
  const http = `HTTP ${status}${statusText ? ` ${statusText}` : ""}`;
  // The API's answer for a path it has no route for. The client asks only routes the API has, so
  // the address is likely wrong (`--url http://host:3000/api`: every path doubled); until 2026-12-07
  // it said only "No such route.", as if a task did not exist.
  if (ours && status === 404 && body.code === "NOT_FOUND")
    return new ApiRequestError(
      status,
      "NOT_FOUND",
      `${body.message} Is ${shownUrl} the server's address? ASSAY_URL (or --url) takes no path of the API's such as /api`,
    );
  if (!ours && status >= 400 && status < 500)
    return new NotTheApi(
      `${shownUrl} answered ${http} without the API's error body: not the API's answer (a proxy's, or no Assay server there)`,
    );
  return new ApiRequestError(
    status,
    ours ? (body.code as string) : `HTTP_${status}`,
    ours ? (body.message as string) : http,
  );
}

/** Writes a request body: chunks in order, each resolved once the connection has taken it. */
export type BodyWriter = (write: (chunk: Buffer) => Promise<void>) => Promise<void>;

/**
 * How long an upload's connection may go without sending or receiving a byte before it is given up:
 * a server that stops reading, or never answers once it has the body, would otherwise hold the
 * command forever (an upload has no overall time limit: a large file takes as long as it takes).
 */
export const UPLOAD_IDLE_MS = 60_000;

/**
 * Streamed POSTs over node:http(s) with keep-alive connections, for uploads. fetch with a streamed
 * body costs about a millisecond of CPU more per request (web streams), which is most of what a
 * thousand small uploads cost the client; and a write callback says when bytes were really handed
 * to the connection, so an upload bar counts bytes sent, not bytes read. `close()` when done.
 */
export class Uploader {
  readonly #client: ApiClient;
  readonly #token: string;
  readonly #agent: import("node:http").Agent;
  readonly #request: typeof import("node:http").request;
  readonly #idleMs: number;

  private constructor(
    client: ApiClient,
    token: string,
    mod: typeof import("node:http"),
    connections: number,
    idleMs: number,
  ) {
    this.#client = client;
    this.#token = token;
    this.#request = mod.request;
    this.#agent = new mod.Agent({ keepAlive: true, maxSockets: connections });
    this.#idleMs = idleMs;
  }

  /** The server's URL as it may be shown. */
  get shownUrl(): string {
    return this.#client.shownUrl;
  }

  /** The client this uploader sends with. */
  get client(): ApiClient {
    return this.#client;
  }

  static async open(
    client: ApiClient,
    token: string,
    connections: number,
    idleMs: number,
  ): Promise<Uploader> {
    const mod = client.base.protocol === "https:" ? await import("node:https") : await import("node:http");
    return new Uploader(client, token, mod as typeof import("node:http"), connections, idleMs);
  }

  /** The response's status and body text; throws ConnectionError when there is none. */
  post(
    path: string,
    headers: Record<string, string>,
    body: BodyWriter,
    signal: AbortSignal,
  ): Promise<{ status: number; text: string }> {
    const shown = this.#client.shownUrl;
    return new Promise((resolve, reject) => {
      const req = this.#request(this.#client.url(path), {
        method: "POST",
        agent: this.#agent,
        signal,
        headers: { authorization: `Bearer ${this.#token}`, ...headers },
      });
      let bodyError: unknown;
      const fail = (err: unknown) => {
        if (signal.aborted) reject(signal.reason);
        else if (bodyError !== undefined) reject(bodyError);
        else if (err instanceof ConnectionError) reject(err);
        else reject(new ConnectionError(`cannot upload to ${shown} (${networkReason({ cause: err })})`));
      };
      req.on("error", fail);
      req.setTimeout(this.#idleMs, () =>
        req.destroy(
          new NotRetried(`${shown} neither took nor answered the upload for ${this.#idleMs / 1000} s`),
        ),
      );
      req.on("response", (res) => {
        const status = res.statusCode ?? 0;
        if (isRedirect(status)) {
          res.resume();
          fail(redirected(shown, this.#client.url(path), res.headers.location ?? null));
          return req.destroy();
        }
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => {
          text += c;
        });
        res.on("end", () => {
          if (status >= 200 && status < 300) resolve({ status, text });
          else reject(errorFromBody(status, res.statusMessage ?? "", text, shown));
        });
        res.on("error", fail);
      });
      const write = (chunk: Buffer) =>
        new Promise<void>((done, broke) => req.write(chunk, (err) => (err ? broke(err) : done())));
      body(write).then(
        () => req.end(),
        (err: unknown) => {
          bodyError = err;
          req.destroy(err instanceof Error ? err : new Error(String(err)));
        },
      );
    });
  }

  close(): void {
    this.#agent.destroy();
  }
}
