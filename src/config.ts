// Configuration: built from the environment once, at start-up, each field validated by its schema
// (JSON Schema, built and checked by ./config-schema.ts: TypeBox's shapes without its load time).
// Every field is documented here (`description`) and in docs/configuration.md's table; `assay config`
// prints the table from this file so the two cannot drift apart.
import { isIPv6 } from "node:net";
import path from "node:path";
import { ANALYSIS_TYPES, type AnalysisType, typeEnvInfix } from "./analyses/names.ts";
import { type IntegerSchema, type Schema, type Static, schemaError, Type } from "./config-schema.ts";
import { MAX_TIMER_MS } from "./timers.ts";

const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;

/** Default upload limit: 100 MiB. */
export const DEFAULT_MAX_UPLOAD_BYTES = 100 * 1024 * 1024;

/**
 * The largest upload the S3 store can take: lib-storage sends a body of unknown length in parts of its
 * smallest size, 5 MiB (storage/s3.ts sets none), and S3 takes at most 10,000 parts.
 */
const S3_MAX_UPLOAD_BYTES = 10_000 * 5 * 1024 * 1024;

/** Per-type settings: ASSAY_<TYPE>_CONCURRENCY, _MAX_ATTEMPTS, _TIMEOUT_MS for every analysis type. */
function perTypeFields() {
  const fields: Record<string, IntegerField> = {};
  for (const type of ANALYSIS_TYPES) {
    const infix = typeEnvInfix(type);
    const key = type.replace(/-(.)/g, (_, c: string) => c.toUpperCase());
    fields[`${key}Concurrency`] = {
      env: `ASSAY_${infix}_CONCURRENCY`,
      schema: Type.Integer({ minimum: 0, default: 0 }),
      description: `Global limit on live ${type} runs across all workers (0: no global limit; each worker's --concurrency still applies).`,
    };
    fields[`${key}MaxAttempts`] = {
      env: `ASSAY_${infix}_MAX_ATTEMPTS`,
      schema: Type.Integer({ minimum: 1, maximum: 100, default: 3 }),
      description: `Attempts a ${type} run gets (transient failures and lost leases use one each).`,
    };
    fields[`${key}TimeoutMs`] = {
      env: `ASSAY_${infix}_TIMEOUT_MS`,
      ...durationMs(100, 600_000),
      description: `Wall-clock limit of one ${type} attempt; then it is killed and the run ends timed_out.`,
    };
  }
  return fields as Record<
    `${"summary" | "pythonStats" | "rReport"}${"Concurrency" | "MaxAttempts" | "TimeoutMs"}`,
    IntegerField
  >;
}

interface IntegerField extends Field {
  schema: IntegerSchema;
}

/** A duration in milliseconds that some timer waits for: bounded by what a timer can wait. */
function durationMs(minimum: number, defaultMs: number): Pick<IntegerField, "schema" | "hint"> {
  return {
    schema: Type.Integer({ minimum, maximum: MAX_TIMER_MS, default: defaultMs }),
    hint: `must be a whole number of milliseconds from ${minimum} to ${MAX_TIMER_MS} (about 24.8 days, the longest a timer can wait)`,
  };
}

interface Field {
  env: string;
  schema: Schema;
  description: string;
  /** An optional field has no default: absent means "not configured". */
  optional?: true;
  /** What to say when the value does not match, instead of the schema's own message. */
  hint?: string;
  /** A further check of a value the schema accepted: why it is refused, or undefined. */
  check?: (value: string) => string | undefined;
  /**
   * The value may hold a secret (a password): an error never shows it (see shownValue). Variables
   * whose names say so (SECRET, PASSWORD, TOKEN, KEY, CREDENTIAL) are treated the same without it.
   */
  secret?: true;
}

/**
 * The table of settings: environment variable → schema (with its default) and meaning.
 * Keys are the config object's property names.
 */
const FIELDS = {
  databaseUrl: {
    env: "DATABASE_URL",
    schema: Type.String({ pattern: "^postgres(ql)?://" }),
    optional: true,
    secret: true,
    hint: "must be a postgres:// or postgresql:// URL",
    check: databaseUrlError,
    description:
      "PostgreSQL connection URL. When unset, an embedded PostgreSQL is started with its data under $ASSAY_DATA_DIR/pg.",
  },
  host: {
    env: "HOST",
    schema: Type.String({ minLength: 1, default: "127.0.0.1" }),
    check: hostError,
    description: "Address the HTTP server listens on.",
  },
  port: {
    env: "PORT",
    schema: Type.Integer({ minimum: 0, maximum: 65535, default: 3000 }),
    description: "Port the HTTP server listens on (0 picks a free port).",
  },
  metricsPort: {
    env: "ASSAY_METRICS_PORT",
    schema: Type.Integer({ minimum: 0, maximum: 65535, default: 0 }),
    description:
      "Port on HOST where `assay worker` serves GET /metrics (0 = none). `assay api` and `assay all` serve /metrics on PORT.",
  },
  dataDir: {
    env: "ASSAY_DATA_DIR",
    schema: Type.String({ minLength: 1, default: "./.assay" }),
    description:
      "This process's own directory: the embedded database, a worker's scratch space, and — with ASSAY_STORAGE=local — uploaded files and outputs.",
  },
  storage: {
    env: "ASSAY_STORAGE",
    schema: Type.Union([Type.Literal("local"), Type.Literal("s3")], { default: "local" }),
    description:
      "Where uploaded files and outputs live: local (under ASSAY_DATA_DIR; every process must share it) or s3 (an S3-compatible bucket; API and workers may run on any machines).",
  },
  s3Bucket: {
    env: "ASSAY_S3_BUCKET",
    // S3's rules for bucket names, with upper case and `_` allowed as legacy buckets and some
    // S3-compatible services have them: a `/` or a space made every request a warning and a retry.
    schema: Type.String({ pattern: "^[A-Za-z0-9][A-Za-z0-9._-]{1,61}[A-Za-z0-9]$" }),
    hint: "must be a bucket name: 3–63 letters, digits, '.', '-' or '_', starting and ending with a letter or digit",
    optional: true,
    description:
      "With ASSAY_STORAGE=s3: the bucket (required; 3–63 letters, digits, '.', '-' or '_'). Credentials come from the AWS SDK's default chain.",
  },
  s3Prefix: {
    env: "ASSAY_S3_PREFIX",
    schema: Type.String({ pattern: "^([A-Za-z0-9._-]+/)*[A-Za-z0-9._-]*$", default: "" }),
    hint: "must be a key prefix such as assay/ (letters, digits, . _ - and /)",
    // A request's path has its dot segments resolved: with `..` the key ../files/1 was stored as
    // files/1 (another installation's), and with ../other-bucket in that bucket.
    check: (prefix) =>
      prefix.split("/").some((segment) => segment === "." || segment === "..")
        ? "must not have a . or .. segment: the bucket's path resolves them, and keys would land outside the prefix or in another bucket"
        : undefined,
    description:
      "With ASSAY_STORAGE=s3: a prefix for every key, so one bucket can hold several installations.",
  },
  s3Endpoint: {
    env: "ASSAY_S3_ENDPOINT",
    schema: Type.String({ pattern: "^https?://" }),
    optional: true,
    secret: true,
    hint: "must be an http:// or https:// URL",
    check: endpointError,
    description: "With ASSAY_STORAGE=s3: the service's URL, for anything but AWS S3 (MinIO, R2, Ceph RGW).",
  },
  s3Region: {
    env: "ASSAY_S3_REGION",
    schema: Type.String({ minLength: 1 }),
    optional: true,
    description: "With ASSAY_STORAGE=s3: the region (default: the AWS SDK's own, e.g. AWS_REGION).",
  },
  s3ForcePathStyle: {
    env: "ASSAY_S3_FORCE_PATH_STYLE",
    schema: Type.Union([Type.Literal("true"), Type.Literal("false")], { default: "false" }),
    description:
      "With ASSAY_STORAGE=s3: address the bucket in the path, not the host name (MinIO and most self-hosted services need true).",
  },
  logLevel: {
    env: "LOG_LEVEL",
    schema: Type.Union(
      LOG_LEVELS.map((l) => Type.Literal(l)),
      { default: "info" },
    ),
    description: `Log level: ${LOG_LEVELS.join(", ")}.`,
  },
  logFormat: {
    env: "LOG_FORMAT",
    schema: Type.Union([Type.Literal("json"), Type.Literal("pretty")], { default: "json" }),
    description: "json (one object per line, for machines) or pretty (for a terminal; `make dev` uses it).",
  },
  maxUploadBytes: {
    env: "ASSAY_MAX_UPLOAD_BYTES",
    schema: Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER, default: DEFAULT_MAX_UPLOAD_BYTES }),
    description: `Largest accepted upload in bytes (default 100 MiB); larger uploads get 413. With ASSAY_STORAGE=s3 at most ${S3_MAX_UPLOAD_BYTES} (10,000 parts of 5 MiB).`,
  },
  uploadIdleMs: {
    env: "ASSAY_UPLOAD_IDLE_MS",
    ...durationMs(1000, 60_000),
    description:
      "A request whose body (an upload, a JSON body) makes no progress for this long is cut off: the connection is closed and nothing is stored. Bounds what a client that stops sending mid-body holds: its connection and, for an upload, the part stored so far.",
  },
  maxTaskRuns: {
    env: "ASSAY_MAX_TASK_RUNS",
    schema: Type.Integer({ minimum: 1, maximum: 1_000_000, default: 100_000 }),
    description:
      "Most input files (runs) one task may have. The JSON body limit follows it (1 MiB plus 32 bytes per file id).",
  },
  leaseTtlMs: {
    env: "ASSAY_LEASE_TTL_MS",
    ...durationMs(1000, 30_000),
    description:
      "How long a worker's claim on a run lasts without a heartbeat (heartbeats every third of it). A dead worker's runs are recovered after at most this plus the reap interval.",
  },
  reapIntervalMs: {
    env: "ASSAY_REAP_INTERVAL_MS",
    ...durationMs(100, 5000),
    description: "How often each worker runs the lease reaper (jittered).",
  },
  pollIntervalMs: {
    env: "ASSAY_POLL_INTERVAL_MS",
    ...durationMs(50, 2000),
    description: "Backstop poll for new runs when no NOTIFY arrives (jittered).",
  },
  workerWaitMs: {
    env: "ASSAY_WORKER_WAIT_MS",
    ...durationMs(1000, 600_000),
    description:
      "How long queued runs of a type wait for any live worker that can execute it before failing with ANALYSIS_WORKER_UNAVAILABLE. At least ASSAY_LEASE_TTL_MS: workers say which types they serve only with their heartbeat, every third of it (left unset with a longer TTL, it is the TTL).",
  },
  retryBaseMs: {
    env: "ASSAY_RETRY_BASE_MS",
    ...durationMs(1, 1000),
    description:
      "First retry delay after a transient failure; doubles per attempt (with jitter), capped at 5 minutes.",
  },
  prefetch: {
    env: "ASSAY_PREFETCH",
    schema: Type.Integer({ minimum: 0, maximum: 1000, default: 0 }),
    description:
      "Runs a worker claims ahead of its free slots, however long the runs take (0: only free slots, plus one for each slot whose program has reported its result and is exiting, and what ASSAY_PREFETCH_WINDOW_MS adds while runs are short). Only for very short handlers: prefetched runs hold leases while they wait, out of other workers' reach. Analysis programs need none (ASSAY_PREFETCH_WINDOW_MS claims ahead while runs are short); the queue's ceiling, measured with in-process no-op handlers at 1000, is in docs/architecture.md (Capacity).",
  },
  prefetchWindowMs: {
    env: "ASSAY_PREFETCH_WINDOW_MS",
    ...durationMs(0, 200),
    description:
      "While a type's runs are shorter than this on average, a worker claims ahead as many runs as keep its slots busy for this long (at most 4 per slot; 8 for runs under 1 ms), so one claim serves several runs. None under a global or per-user limit, nor while another type's runs share the worker's slots, nor for runs under 1 ms (in-process handlers) within a second of a task of their type being created. A newly arrived task's runs go ahead of the runs of its type claimed ahead (those that have waited less than this long, and at least 200 ms). Once a run claimed ahead has waited 5 times this long (at least 1 s), the runs of its type claimed ahead go back to the queue for other workers (their runs were not short after all), and no more are claimed ahead (beyond ASSAY_PREFETCH) until its runs are short again. 0: only ASSAY_PREFETCH.",
  },
  completionDelayMs: {
    env: "ASSAY_COMPLETION_DELAY_MS",
    ...durationMs(0, 200),
    description:
      "How long a worker may hold a finished run's outcome to record it together with others that finish meanwhile, in one statement (0: record each at once). Recorded at once instead: a full batch (as many outcomes as the worker has slots, at least 8), an outcome when no other run is live or claimed on the worker at that moment (a lone run, say), one of a type with a global limit or under a per-user limit, and everything at shutdown. The run's finished_at is when it ended either way.",
  },
  userConcurrency: {
    env: "ASSAY_USER_CONCURRENCY",
    schema: Type.Integer({ minimum: 0, maximum: 1_000_000, default: 0 }),
    description:
      "Most live runs one user may have at once across all workers and types (0: no limit). Exact, like the per-type limits: a dead worker's runs count until the reaper recovers them.",
  },
  retentionDays: {
    env: "ASSAY_RETENTION_DAYS",
    schema: Type.Number({ exclusiveMinimum: 0, maximum: 36_500, default: 30 }),
    description:
      "Finished tasks (with their runs, events and output files) are deleted this many days after they finished.",
  },
  retentionIntervalMs: {
    env: "ASSAY_RETENTION_INTERVAL_MS",
    ...durationMs(1000, 3_600_000),
    description:
      "How often each worker runs the retention pass and the store sweep (jittered); the first pass of each comes within a minute of the worker's start.",
  },
  sseHeartbeatMs: {
    env: "ASSAY_SSE_HEARTBEAT_MS",
    ...durationMs(100, 15_000),
    description:
      "Keep-alive comment interval on Server-Sent Events streams; a stream whose task ended without it (or was deleted) ends within one interval.",
  },
  sseStallMs: {
    env: "ASSAY_SSE_STALL_MS",
    ...durationMs(1000, 60_000),
    description:
      "A Server-Sent Events stream whose socket has taken nothing for this long (at least twice ASSAY_SSE_HEARTBEAT_MS: raised to that when unset, refused below it) while output waited for it is cut off; the client resumes by Last-Event-ID. Bounds what a client that stops reading holds: its socket, buffered events and its subscription. The kernel's socket buffers make a client reading a long log steadily below ~10 KB/s at 60 s look the same.",
  },
  sseMaxStreams: {
    env: "ASSAY_SSE_MAX_STREAMS",
    schema: Type.Integer({ minimum: 0, maximum: 1_000_000, default: 10_000 }),
    description:
      "Most Server-Sent Events streams one API process serves at once (0: no limit); one more is refused with 429 TOO_MANY_STREAMS and Retry-After. Each holds a socket (a file descriptor: keep this well under the process's `ulimit -n`) and ~40 KB of memory.",
  },
  sseMaxStreamsPerUser: {
    env: "ASSAY_SSE_MAX_STREAMS_PER_USER",
    schema: Type.Integer({ minimum: 0, maximum: 1_000_000, default: 100 }),
    description:
      "Most Server-Sent Events streams one user (all their tokens) may hold open on one API process (0: no limit); one more is refused with 429 TOO_MANY_STREAMS and Retry-After, so that one user cannot take every socket of the process.",
  },
  killGraceMs: {
    env: "ASSAY_KILL_GRACE_MS",
    ...durationMs(0, 5000),
    description: "Between SIGTERM and SIGKILL to an analysis process group on timeout, cancel or shutdown.",
  },
  childNice: {
    env: "ASSAY_CHILD_NICE",
    schema: Type.Integer({ minimum: 0, maximum: 19, default: 10 }),
    description:
      "CPU priority (nice) of analysis processes and what they start; 0 = the worker's own. Above the worker's, they yield the CPU to the worker, its lease heartbeats and a PostgreSQL on the same machine.",
  },
  childMemoryMb: {
    env: "ASSAY_CHILD_MEMORY_MB",
    schema: Type.Integer({ minimum: 0, maximum: 1_048_576, default: 4096 }),
    description:
      'Memory (MiB) each analysis process may allocate: its data segment and private writable mappings (RLIMIT_DATA, set by util-linux `prlimit`; not enforced, with a warning, where that is missing); 0 = no limit. A program past it fails ANALYSIS_PROCESS_FAILED, "the program ran out of memory", instead of the machine\'s OOM killer choosing a process — perhaps the worker or PostgreSQL. summary (Node) needs about 600 MiB of it to start at all; r-report the most of the three: up to ~27 times its input (2.7 GB for 100 MiB of single-digit cells, the default ASSAY_MAX_UPLOAD_BYTES; 1.2 GB for 200 MB of 4 numeric columns) and ~500 bytes per column of a wide file. The worst case of a worker is this times its --concurrency.',
  },
  shutdownGraceMs: {
    env: "ASSAY_SHUTDOWN_GRACE_MS",
    ...durationMs(0, 25_000),
    description:
      "On SIGTERM, how long a worker lets running analyses finish before aborting them (their runs go back to the queue unspent).",
  },
  python: {
    env: "ASSAY_PYTHON",
    schema: Type.String({ minLength: 1 }),
    optional: true,
    description: "Python 3 for python-stats: a path or a name looked up in PATH (default python3).",
  },
  rscript: {
    env: "ASSAY_RSCRIPT",
    schema: Type.String({ minLength: 1 }),
    optional: true,
    description: "Rscript for r-report: a path or a name looked up in PATH (default Rscript).",
  },
  ...perTypeFields(),
} satisfies Record<string, Field>;

type Fields = typeof FIELDS;
type Settings = {
  [K in keyof Fields as Fields[K] extends { optional: true } ? never : K]: Static<Fields[K]["schema"]>;
} & {
  [K in keyof Fields as Fields[K] extends { optional: true } ? K : never]?: Static<Fields[K]["schema"]>;
};

/** The validated configuration. `dataDir` is absolute. */
export type Config = Readonly<Settings>;

export class ConfigError extends Error {
  readonly problems: string[];
  constructor(problems: string[]) {
    super(`invalid configuration:\n${problems.map((p) => `  ${p}`).join("\n")}`);
    this.name = "ConfigError";
    this.problems = problems;
  }
}

/**
 * Builds the config from an environment. Empty strings count as unset. Throws ConfigError with
 * one line per bad field.
 */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const raw: Record<string, unknown> = {};
  for (const [key, field] of Object.entries(FIELDS)) {
    const value = env[field.env];
    if (value !== undefined && value !== "") raw[key] = value;
  }
  const out: Record<string, unknown> = {};
  const problems: string[] = [];
  for (const [key, field] of Object.entries(FIELDS) as [string, Field][]) {
    if (raw[key] === undefined && field.optional) continue;
    const given = raw[key];
    const value =
      given === undefined
        ? (field.schema as { default?: unknown }).default
        : // Numbers only for numeric fields: HOST=10 or a bucket named 123456 stay strings.
          "type" in field.schema &&
            (field.schema.type === "integer" || field.schema.type === "number") &&
            typeof given === "string" &&
            /^-?\d+(\.\d+)?$/.test(given.trim())
          ? Number(given)
          : given;
    const schemaProblem = schemaError(field.schema, value);
    const error =
      schemaProblem === undefined
        ? typeof value === "string"
          ? (unpaddedError(field.schema, value) ?? field.check?.(value))
          : undefined
        : (field.hint ?? schemaProblem);
    if (error === undefined) out[key] = value;
    else problems.push(`${field.env}${shownValue(field, given)}: ${error}`);
  }
  // Only when none was given: a bucket name refused above is not also "required".
  if (out.storage === "s3" && out.s3Bucket === undefined && raw.s3Bucket === undefined) {
    problems.push("ASSAY_S3_BUCKET: is required with ASSAY_STORAGE=s3");
  }
  const { maxUploadBytes } = out as { maxUploadBytes?: number };
  if (out.storage === "s3" && maxUploadBytes !== undefined && maxUploadBytes > S3_MAX_UPLOAD_BYTES) {
    problems.push(
      `ASSAY_MAX_UPLOAD_BYTES (${maxUploadBytes}) must be at most ${S3_MAX_UPLOAD_BYTES} with ASSAY_STORAGE=s3: an upload goes to the bucket in parts of 5 MiB, and S3 takes at most 10,000 (a larger upload would fail once 48.8 GiB had been sent)`,
    );
  }
  const sslProblem = sslModeError(out.databaseUrl as string | undefined, env);
  if (sslProblem !== undefined) problems.push(sslProblem);
  // Live workers stamp the types they serve (analysis_type_seen) only with their heartbeat, every
  // third of the lease TTL: a shorter wait failed runs of a type a live worker serves between two
  // stamps. At least the TTL leaves three heartbeats' margin.
  // Left unset, the wait is its default or the TTL, whichever is longer: a TTL over the default wait
  // was valid before the rule, and must not fail every command (migrate, token...) with it.
  const { workerWaitMs, leaseTtlMs } = out as { workerWaitMs?: number; leaseTtlMs?: number };
  if (raw.workerWaitMs === undefined && workerWaitMs !== undefined && leaseTtlMs !== undefined)
    out.workerWaitMs = Math.max(workerWaitMs, leaseTtlMs);
  else if (workerWaitMs !== undefined && leaseTtlMs !== undefined && workerWaitMs < leaseTtlMs) {
    problems.push(
      `ASSAY_WORKER_WAIT_MS (${workerWaitMs}) must be at least ASSAY_LEASE_TTL_MS (${leaseTtlMs}): live workers refresh which types they serve only with their heartbeat, every ASSAY_LEASE_TTL_MS / 3 (${Math.round(leaseTtlMs / 3)} ms), so a shorter wait fails runs of a type a live worker serves with ANALYSIS_WORKER_UNAVAILABLE`,
    );
  }
  // A stream is cut off as stalled only after two keep-alives went unread: left unset, the stall bound
  // is raised to twice the heartbeat (it was raised where it is used, and `assay config --values`
  // showed a value not in effect); set below that, it is refused.
  const { sseStallMs, sseHeartbeatMs } = out as { sseStallMs?: number; sseHeartbeatMs?: number };
  if (sseStallMs !== undefined && sseHeartbeatMs !== undefined && sseStallMs < 2 * sseHeartbeatMs) {
    if (raw.sseStallMs === undefined) out.sseStallMs = 2 * sseHeartbeatMs;
    else
      problems.push(
        `ASSAY_SSE_STALL_MS (${sseStallMs}) must be at least twice ASSAY_SSE_HEARTBEAT_MS (${sseHeartbeatMs}): a stream sends a keep-alive every heartbeat, and one that took nothing for less than two of them is not stalled`,
      );
  }
  if (problems.length > 0) throw new ConfigError(problems);
  const config = out as Settings;
  return { ...config, dataDir: path.resolve(config.dataDir) };
}

/**
 * Why a free-form string's value (a path, a host, a bucket or program name: a string field without a
 * pattern) is refused: white space at either end, or a control character. Such a value is used as
 * given, so a line ending from an environment file written on Windows (`/srv/assay\r`) or a stray
 * space was another data directory — a new, empty embedded database, files in the wrong place — or a
 * Python that no worker found, without a word. Fields with a pattern say what they take (and the URLs'
 * parsers drop white space at their ends).
 */
function unpaddedError(schema: Schema, value: string): string | undefined {
  if (!("type" in schema) || schema.type !== "string" || schema.pattern !== undefined) return undefined;
  return value.trim() !== value || /\p{Cc}/u.test(value)
    ? "must not begin or end with white space, nor hold control characters (a line ending from a file written on Windows?)"
    : undefined;
}

/**
 * Why HOST is no address to listen on, or undefined. A host name holds no `:`, `/` or brackets, so a
 * port, a scheme or a bracketed IPv6 address typed by habit (`0.0.0.0:8080`, `[::]`) passed start-up,
 * and `assay api` failed after starting its database, with a bare "getaddrinfo ENOTFOUND" (exit 1).
 */
function hostError(host: string): string | undefined {
  return /[/[\]]/.test(host) || (host.includes(":") && !isIPv6(host))
    ? "must be an address or a host name, without a port (that is PORT), a scheme or a path; an IPv6 address without brackets (::, not [::])"
    : undefined;
}

/**
 * Why postgres.js cannot read `url`, or undefined when it can. It parses a URL as below (parseUrl in
 * postgres/src/index.js: the first of several comma-separated hosts, the user name and password
 * percent-decoded), only when it connects: an invalid port or a password with an unescaped `#` or `%`
 * failed every command with a bare "Invalid URL" or "URI malformed" that named no setting, and an IPv6
 * address in brackets with "getaddrinfo ENOTFOUND [" (postgres.js 3.4.9 splits a host at its first `:`).
 */
function databaseUrlError(url: string): string | undefined {
  try {
    const { host, parsed } = postgresUrl(url);
    decodeURIComponent(parsed.username);
    decodeURIComponent(parsed.password);
    // It takes each host up to its first `:`: `[::1]:5432` is the host `[` (getaddrinfo ENOTFOUND).
    if (host.includes("["))
      return "has an IPv6 address in brackets, which PostgreSQL's client cannot connect to: give the database a host name (one in /etc/hosts will do)";
    // With several hosts it takes the credentials up to the first `@`: the rest of a password with an
    // `@` in it became the first host's name, printed by every connection error.
    if (host.includes(",") && host.includes("@"))
      return "has an @ in its user name or password that is not percent-encoded: write it %40";
    return undefined;
  } catch {
    return "is not a URL PostgreSQL's client can read: check the host and port, and percent-encode any of : / @ # ? % in the user name and password";
  }
}

/** `url` read as postgres.js reads it (parseUrl): its host part, and the URL with the first host only. Throws as `new URL`. */
function postgresUrl(url: string): { host: string; parsed: URL } {
  let host = url.slice(url.indexOf("://") + 3).split(/[?/]/)[0] ?? "";
  host = decodeURIComponent(host.slice(host.indexOf("@") + 1));
  return { host, parsed: new URL(url.replace(host, host.split(",")[0] ?? "")) };
}

/**
 * Why the AWS SDK cannot use `url` as the endpoint, or undefined when it can. It parses it (`new URL`)
 * only on the first request: a port over 65535, a space in the host or a bare `https://` passed
 * start-up, and `assay api` and `assay worker` then waited for the store for ever, logging a bare
 * "Invalid URL" that named no setting.
 */
function endpointError(url: string): string | undefined {
  return URL.canParse(url)
    ? undefined
    : "is not a URL: check the host and the port (at most 65535), and percent-encode any space";
}

/** libpq's modes that insist on TLS. */
const TLS_MODES = new Set(["require", "verify-ca", "verify-full"]);

/**
 * Why PGSSLMODE is refused, or undefined. postgres.js takes what DATABASE_URL leaves out from PGHOST,
 * PGUSER, PGPASSWORD… but TLS only from the URL's `sslmode` (or `ssl`) and its own PGSSL, never from
 * libpq's PGSSLMODE: PGSSLMODE=require, as psql takes it, connected without TLS, without a word. Not
 * for the embedded database (no DATABASE_URL), nor a Unix socket (no TLS there, as libpq has it).
 */
function sslModeError(databaseUrl: string | undefined, env: NodeJS.ProcessEnv): string | undefined {
  const mode = env.PGSSLMODE;
  if (databaseUrl === undefined || mode === undefined || !TLS_MODES.has(mode) || env.PGSSL) return undefined;
  const { host, parsed } = postgresUrl(databaseUrl);
  // postgres.js takes TLS from any of these (`sslrootcert=system` is verify-full).
  if (["sslmode", "ssl", "sslrootcert"].some((p) => parsed.searchParams.has(p))) return undefined;
  if ((host || env.PGHOST || "localhost").startsWith("/")) return undefined;
  return `PGSSLMODE=${JSON.stringify(mode)}: is not read by PostgreSQL's client here (postgres.js), which would connect to DATABASE_URL without TLS: put sslmode=${mode} in DATABASE_URL (…?sslmode=${mode}), or unset PGSSLMODE for a server without TLS`;
}

/** ASSAY_* variables read outside the table above: by bin/assay.js and bin/bundle.js, and by the client commands. */
const OTHER_VARIABLES = new Set([
  "ASSAY_NODE_FLAGS",
  "ASSAY_REEXECUTED",
  "ASSAY_BUNDLE",
  "ASSAY_BUNDLE_DIR",
  "ASSAY_URL",
  "ASSAY_TOKEN",
]);

/**
 * The ASSAY_* variables of `env` that nothing reads — a misspelt setting, most likely, which would
 * otherwise be ignored without a word (ASSAY_SHUTDOWN_GRACE for ASSAY_SHUTDOWN_GRACE_MS) — each with
 * the setting whose name is nearest to it (at most 3 edits away), if any.
 */
export function unknownVariables(env: NodeJS.ProcessEnv = process.env): { name: string; nearest?: string }[] {
  const known = [...Object.values(FIELDS).map((f: Field) => f.env), ...OTHER_VARIABLES];
  const unknown: { name: string; nearest?: string }[] = [];
  for (const name of Object.keys(env).sort()) {
    if (!name.startsWith("ASSAY_") || known.includes(name)) continue;
    let nearest: { name: string; distance: number } | undefined;
    for (const k of known) {
      const distance = editDistance(name, k);
      if (distance <= 3 && (nearest === undefined || distance < nearest.distance))
        nearest = { name: k, distance };
    }
    unknown.push(nearest ? { name, nearest: nearest.name } : { name });
  }
  return unknown;
}

/** Levenshtein distance: the fewest one-character insertions, deletions and substitutions from a to b. */
function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      current[j] = Math.min(
        (previous[j] ?? 0) + 1,
        (current[j - 1] ?? 0) + 1,
        (previous[j - 1] ?? 0) + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    }
    previous = current;
  }
  return previous[b.length] ?? 0;
}

/** Names of variables whose values are secrets even without `secret` on their field. */
const SECRET_NAME = /SECRET|PASSWORD|PASSWD|TOKEN|KEY|CREDENTIAL/i;

/**
 * How a configuration error shows the value it refused: `="…"` as given, or for a secret (a field
 * marked `secret`, or a name that says so) never the secret itself — a URL with its password (and any
 * `password=` parameter) as `***`, anything else not at all. The problem still names the variable and
 * the rule.
 */
function shownValue(field: Field, given: unknown): string {
  if (!field.secret && !SECRET_NAME.test(field.env)) return `=${JSON.stringify(given)}`;
  const masked = typeof given === "string" ? maskedUrl(given) : undefined;
  return masked === undefined ? " (value not shown: it may hold a secret)" : `=${JSON.stringify(masked)}`;
}

/**
 * A URL (`scheme://[user[:password]@]host…`) with its password and `password=` parameters as `***`;
 * undefined for anything that does not begin like a URL (not to be shown at all). The user information runs to the
 * last `@` (a password may hold an unescaped `@`, `/`, `#` or `?`): masking from the first `:` after
 * the user name to there may hide more than the password, never less.
 */
function maskedUrl(value: string): string | undefined {
  const scheme = /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.exec(value)?.[0];
  if (scheme === undefined) return undefined;
  let rest = value.slice(scheme.length);
  const at = rest.lastIndexOf("@");
  if (at !== -1) {
    const user = rest.slice(0, at);
    const colon = user.indexOf(":");
    rest = `${colon === -1 ? user : `${user.slice(0, colon)}:***`}${rest.slice(at)}`;
  }
  rest = rest.replace(/([?&]password=)[^&#]*/gi, "$1***");
  return scheme + rest;
}

/** Where a setting's value in effect comes from (`assay config --values`). */
export type SettingSource = "environment" | "default" | "derived" | "not set";

export interface SettingInEffect {
  variable: string;
  /** As the process uses it; a secret's URL with its password as `***`, any other secret null. */
  value: string | number | null;
  /** True when the value is withheld or masked because it may hold a secret. */
  masked: boolean;
  from: SettingSource;
}

/**
 * Every setting's value in effect for `env`, validated as `assay api` would (a ConfigError names every
 * bad one), and where it came from: the environment, the default, or derived from other settings (the
 * worker wait raised to the lease TTL; the data directory made absolute counts as its source).
 */
export function configInEffect(env: NodeJS.ProcessEnv = process.env): SettingInEffect[] {
  const config = loadConfig(env) as unknown as Record<string, unknown>;
  return (Object.entries(FIELDS) as [string, Field][]).map(([key, field]) => {
    const given = env[field.env];
    const value = config[key] as string | number | undefined;
    const fallback = (field.schema as { default?: unknown }).default;
    const from: SettingSource =
      given !== undefined && given !== ""
        ? "environment"
        : value === undefined
          ? "not set"
          : value === fallback || key === "dataDir"
            ? "default"
            : "derived";
    if (value === undefined) return { variable: field.env, value: null, masked: false, from };
    if (!field.secret && !SECRET_NAME.test(field.env))
      return { variable: field.env, value, masked: false, from };
    const masked = typeof value === "string" ? maskedUrl(value) : undefined;
    return { variable: field.env, value: masked ?? null, masked: true, from };
  });
}

/** configInEffect as aligned text columns: variable, value, source. */
export function configInEffectText(settings: SettingInEffect[]): string {
  const shown = settings.map((s) => [
    s.variable,
    s.value === null
      ? s.masked
        ? "(set; not shown: it may hold a secret)"
        : "—"
      : s.value === ""
        ? '""'
        : String(s.value),
    s.from,
  ]);
  const rows = [["VARIABLE", "VALUE", "FROM"], ...shown];
  const widths = [0, 1].map((i) => Math.max(...rows.map((r) => (r[i] ?? "").length)));
  return rows
    .map(([variable = "", value = "", from = ""]) =>
      `${variable.padEnd(widths[0] ?? 0)}  ${value.padEnd(widths[1] ?? 0)}  ${from}`.trimEnd(),
    )
    .join("\n");
}

/** The settings table, as docs/configuration.md shows it. */
export function configTable(): string {
  const rows = Object.values(FIELDS).map((f: Field) => {
    const def = (f.schema as { default?: unknown }).default;
    // An empty default is said so: an empty code span shows as two backticks.
    const shown = def === undefined ? "—" : def === "" ? "(empty)" : `\`${String(def)}\``;
    return `| \`${f.env}\` | ${shown} | ${f.description} |`;
  });
  return ["| Variable | Default | Meaning |", "|---|---|---|", ...rows].join("\n");
}

export interface TypeSettings {
  /** Global limit on live runs of the type; 0 = none. */
  concurrency: number;
  maxAttempts: number;
  timeoutMs: number;
}

/** The per-type settings of `type`. */
export function typeSettings(config: Config, type: AnalysisType): TypeSettings {
  const key = type.replace(/-(.)/g, (_, c: string) => c.toUpperCase()) as
    | "summary"
    | "pythonStats"
    | "rReport";
  return {
    concurrency: config[`${key}Concurrency`],
    maxAttempts: config[`${key}MaxAttempts`],
    timeoutMs: config[`${key}TimeoutMs`],
  };
}
