// Configuration: built from the environment once, at start-up, validated by one TypeBox schema.
// Every field is documented here (`description`) and in the README's table; `assay config`
// prints the table from this file so the two cannot drift apart.
import path from "node:path";
import { type Static, type TSchema, Type } from "typebox";
import { Value } from "typebox/value";

const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;

/** Default upload limit: 100 MiB. */
export const DEFAULT_MAX_UPLOAD_BYTES = 100 * 1024 * 1024;

interface Field {
  env: string;
  schema: TSchema;
  description: string;
  /** An optional field has no default: absent means "not configured". */
  optional?: true;
  /** What to say when the value does not match, instead of the schema's own message. */
  hint?: string;
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
    hint: "must be a postgres:// or postgresql:// URL",
    description:
      "PostgreSQL connection URL. When unset, an embedded PostgreSQL is started with its data under $ASSAY_DATA_DIR/pg.",
  },
  host: {
    env: "HOST",
    schema: Type.String({ minLength: 1, default: "127.0.0.1" }),
    description: "Address the HTTP server listens on.",
  },
  port: {
    env: "PORT",
    schema: Type.Integer({ minimum: 0, maximum: 65535, default: 3000 }),
    description: "Port the HTTP server listens on (0 picks a free port).",
  },
  dataDir: {
    env: "ASSAY_DATA_DIR",
    schema: Type.String({ minLength: 1, default: "./.assay" }),
    description: "Directory for uploaded files, outputs and the embedded database.",
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
    schema: Type.Integer({ minimum: 1, default: DEFAULT_MAX_UPLOAD_BYTES }),
    description: "Largest accepted upload in bytes (default 100 MiB); larger uploads get 413.",
  },
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
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n${problems.map((p) => `  ${p}`).join("\n")}`);
    this.name = "ConfigError";
  }
}

function describeProblem(field: Field, given: unknown, value: unknown): string {
  const errors = [...Value.Errors(field.schema, value)];
  const anyOf = (field.schema as { anyOf?: { const?: unknown }[] }).anyOf;
  const detail =
    field.hint ??
    (anyOf
      ? `must be one of ${anyOf.map((s) => String(s.const)).join(", ")}`
      : (errors[0]?.message ?? "is invalid"));
  return `${field.env}=${JSON.stringify(given)}: ${detail}`;
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
        : typeof given === "string" && /^-?\d+$/.test(given.trim())
          ? Number(given)
          : given;
    if (Value.Check(field.schema, value)) out[key] = value;
    else problems.push(describeProblem(field, given, value));
  }
  if (problems.length > 0) throw new ConfigError(problems);
  const config = out as Settings;
  return { ...config, dataDir: path.resolve(config.dataDir) };
}

/** The settings table, as the README shows it. */
export function configTable(): string {
  const rows = Object.values(FIELDS).map((f: Field) => {
    const def = (f.schema as { default?: unknown }).default;
    return `| \`${f.env}\` | ${def === undefined ? "—" : `\`${String(def)}\``} | ${f.description} |`;
  });
  return ["| Variable | Default | Meaning |", "|---|---|---|", ...rows].join("\n");
}
