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
];

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
