// pino, configured once. Secrets never reach a log line: the Authorization header, tokens,
// passwords and connection URLs are redacted wherever they appear in a logged object.
import pino, { type Logger } from "pino";

export type { Logger };

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
  // Node's HTTP parser errors carry the bytes it refused (`rawPacket`): the request's head, with its
  // Authorization header and its path (a /view/ link). server.ts's clientErrorHandler logs them (trace).
  // The AWS SDK copies every field of S3's error body onto the error, and when S3 refuses credentials
  // it echoes them: the access key id (InvalidAccessKeyId, SignatureDoesNotMatch), the signature and
  // what was signed (SignatureDoesNotMatch: its canonical request holds the x-amz-security-token
  // header, a session token), and the session token itself (ExpiredToken, InvalidToken: `Token-0`).
  // Under any top-level key (`err`, `reason`).
  ...[
    ".rawPacket",
    ".AWSAccessKeyId",
    ".SignatureProvided",
    ".StringToSign",
    ".StringToSignBytes",
    ".CanonicalRequest",
    ".CanonicalRequestBytes",
    '["Token-0"]',
  ].map((field) => `*${field}`),
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
  return segments[0]?.toLowerCase() === "view" ? "/view/[redacted]" : url;
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
    serializers: { req: requestValue },
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
