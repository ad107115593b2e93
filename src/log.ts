// pino, configured once. Secrets never reach a log line: the Authorization header, tokens,
// passwords and connection URLs are redacted wherever they appear in a logged object.
import pino, { type Logger } from "pino";

export type { Logger };

/**
 * Fields of an error that hold secrets, under any top-level key (`err`, `reason`). Node's HTTP parser
 * errors carry the bytes it refused (`rawPacket`): the request's head, with its Authorization header
 * and its path (a /view/ link); server.ts's clientErrorHandler logs them (trace). The AWS SDK copies
 * every field of S3's error body onto the error, and when S3 refuses credentials it echoes them: the
 * access key id (InvalidAccessKeyId, SignatureDoesNotMatch), the signature and what was signed
 * (SignatureDoesNotMatch: its canonical request holds the x-amz-security-token header, a session
 * token), and the session token itself (ExpiredToken, InvalidToken: `Token-0`).
 */
const ERROR_SECRET_FIELDS = [
  "rawPacket",
  "AWSAccessKeyId",
  "SignatureProvided",
  "StringToSign",
  "StringToSignBytes",
  "CanonicalRequest",
  "CanonicalRequestBytes",
  "Token-0",
];

/**
 * Fields that hold secrets wherever they sit inside a logged error (see REDACT_PATHS for why each):
 * the `err` serializer censors them at any depth — an AggregateError's list (`aggregateErrors`), an
 * error or a plain object kept on an error's property — where the redact paths reach one level only.
 */
const SECRET_ERROR_FIELDS = new Set([
  "token",
  "password",
  "databaseUrl",
  "authorization",
  "input",
  ...ERROR_SECRET_FIELDS,
]);

const CENSOR = "[redacted]";
/** SECRET_ERROR_FIELDS in lower case: `Authorization`, `Password` are the same secrets. */
const SECRET_FIELD_NAMES = new Set([...SECRET_ERROR_FIELDS].map((f) => f.toLowerCase()));
/** How deep scrubbed() looks into a logged error: deeper is `[truncated]`. */
const MAX_DEPTH = 8;

/**
 * `value` with every SECRET_ERROR_FIELDS field censored (by name, any case), copied where it changes (a
 * logged error's nested values are the caller's own objects: they must not be altered). An object
 * reached twice (a shared reference, not only a cycle) is given its censored copy both times; one
 * inside itself is `[circular]`; past MAX_DEPTH levels, `[truncated]` — never the value unscrubbed.
 */
function scrubbed(value: unknown, done = new Map<object, unknown>(), depth = 0): unknown {
  if (value === null || typeof value !== "object") return value;
  if (done.has(value)) return done.get(value);
  if (depth > MAX_DEPTH) return "[truncated]";
  if (Buffer.isBuffer(value) || ArrayBuffer.isView(value)) return value;
  done.set(value, "[circular]");
  let result: unknown;
  if (Array.isArray(value)) {
    const items = value.map((item) => scrubbed(item, done, depth + 1));
    result = items.some((item, i) => item !== value[i]) ? items : value;
  } else {
    let copy: Record<string, unknown> | undefined;
    for (const [key, inner] of Object.entries(value)) {
      const next =
        SECRET_FIELD_NAMES.has(key.toLowerCase()) && inner != null
          ? CENSOR
          : scrubbed(inner, done, depth + 1);
      if (next !== inner) {
        copy ??= { ...value };
        copy[key] = next;
      }
    }
    result = copy ?? value;
  }
  done.set(value, result);
  return result;
}

/** pino's error serializer, then every secret field inside it censored (scrubbed). */
function errorValue(err: unknown): unknown {
  return scrubbed(pino.stdSerializers.err(err as Error));
}

export const REDACT_PATHS = [
  "req.headers.authorization",
  "req.headers.cookie",
  "headers.authorization",
  "authorization",
  "token",
  "*.token",
  "password",
  "*.password",
  "databaseUrl",
  "*.databaseUrl",
  // Node's URL errors carry the URL they could not parse: a DATABASE_URL with its password.
  "err.input",
  "err.cause.input",
  // ERROR_SECRET_FIELDS under any top-level key; a name that is no identifier in brackets.
  ...ERROR_SECRET_FIELDS.map((field) => (/^[A-Za-z_$][\w$]*$/.test(field) ? `*.${field}` : `*["${field}"]`)),
];

/**
 * A request's path with a view link's capability taken out: `/view/<link>/<name>` lets anyone who has
 * it read an output. The view route itself logs at `warn`, but a request that matches no route (a
 * trailing slash, another method, a bad escape) is logged at `info` like any other.
 */
export function loggedUrl(url: string): string {
  // The first segment as the router reads it: `/%76iew/<link>/…` reaches the view route too. Escapes
  // decoded one byte at a time (enough to spell `view`), so a bad one elsewhere cannot stop it. And
  // the first segment however it is hidden from that reading — after `/./` or `//`, before `%2F` or a
  // `;` parameter, in an absolute-form target (`http://host/view/…`): such a request reaches no route
  // and is logged at `info`, but the link it carries is as good as ever.
  // Dot segments resolved as a client or proxy would (`/a/../view/…`), and escapes decoded until
  // nothing changes (at most a few rounds: `%252F` is `%2F`, then `/`).
  const target = url.replace(/^[a-z][a-z0-9+.-]*:\/\/[^/?#]*/i, "").split(/[?#]/, 1)[0] ?? "";
  let path = target;
  for (let round = 0; round < 4; round++) {
    const decoded = path.replace(/%([0-9a-f]{2})/gi, (_, hex: string) =>
      String.fromCharCode(Number.parseInt(hex, 16)),
    );
    if (decoded === path) break;
    path = decoded;
  }
  const segments: string[] = [];
  for (const segment of path.split("/")) {
    const bare = segment.split(";", 1)[0] ?? "";
    if (bare === "" || bare === ".") continue;
    if (bare === "..") segments.pop();
    else segments.push(bare);
  }
  if (segments[0]?.toLowerCase() === "view") return "/view/[redacted]";
  // No route takes a secret in the query, but a misconfigured client may send its token so
  // (`?access_token=…`, found by a trial on 2026-12-07): such a value is not written to the log.
  return withoutSecretValues(url);
}

/** A query parameter's name that says it holds a secret, once decoded (`access_%74oken` too). */
const SECRET_NAME = /token|key|secret|pass|pwd|auth|sig|credential|session|jwt|bearer|cookie/i;

/** `url` with the value of each query parameter whose name says it holds a secret redacted. */
function withoutSecretValues(url: string): string {
  const q = url.indexOf("?");
  if (q < 0) return url;
  const hash = url.indexOf("#", q);
  const query = url.slice(q + 1, hash < 0 ? undefined : hash);
  const params = query.split("&").map((param) => {
    const eq = param.indexOf("=");
    if (eq < 0) return param;
    const raw = param.slice(0, eq).replaceAll("+", " ");
    let name = raw;
    try {
      name = decodeURIComponent(raw);
    } catch {}
    return SECRET_NAME.test(name) ? `${param.slice(0, eq)}=[redacted]` : param;
  });
  return `${url.slice(0, q)}?${params.join("&")}${hash < 0 ? "" : url.slice(hash)}`;
}

/**
 * Fastify's request serializer (method, url, host, address), with the url through loggedUrl. A
 * logger's own serializers take precedence over Fastify's (lib/logger-pino.js).
 */
function requestValue(req: {
  method?: string;
  url?: string;
  headers?: Record<string, unknown>;
  host?: string;
  ip?: string;
  socket?: { remotePort?: number };
}) {
  return {
    method: req.method,
    url: typeof req.url === "string" ? loggedUrl(req.url) : req.url,
    version: req.headers?.["accept-version"],
    host: req.host,
    remoteAddress: req.ip,
    remotePort: req.socket?.remotePort,
  };
}

export interface LoggerOptions {
  level: string;
  pretty?: boolean;
  /** Where to write (tests capture lines with a stream). Defaults to stdout. */
  destination?: pino.DestinationStream;
}

export function createLogger(options: LoggerOptions): Logger {
  const base: pino.LoggerOptions = {
    level: options.level,
    redact: { paths: REDACT_PATHS, censor: "[redacted]" },
    serializers: { req: requestValue, err: errorValue },
  };
  if (options.destination) return pino(base, options.destination);
  if (options.pretty) {
    return pino({
      ...base,
      transport: { target: "pino-pretty", options: { translateTime: "HH:MM:ss.l", ignore: "pid,hostname" } },
    });
  }
  return pino(base);
}
