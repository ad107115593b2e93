import {
  MAX_TOKEN_LIFETIME_SECONDS,
  ROLES,
  type Role,
  tokenCreate,
  tokenList,
  tokenRevoke,
} from "../auth/tokens.ts";
import type { Config } from "../config.ts";
import { firstAnswer, isoTime } from "../db/client.ts";
import { COMMAND_ANSWER_MS, COMMAND_CONNECT_MS, schemaState, schemaTooOld } from "../db/migrate.ts";
import { openDatabase } from "../db/open.ts";
import { createLogger } from "../log.ts";
import { need, parse, UsageError } from "./usage.ts";

const CREATE_USAGE = "assay token create --user <name> [--role admin|user] [--expires-in <duration>]";

const HELP = `Usage:
  ${CREATE_USAGE}
      Creates the user if needed (role defaults to user; --role changes an existing user's role)
      and prints a new token as the last line of stdout. The token is shown only this once.
      --expires-in 30m, 12h or 90d (minutes, hours or days; at most 3650d): the token stops
      working then, as if revoked. Without it the token works until it is revoked.
  assay token revoke <id>
      Revokes a token; requests with it get 401 from then on.
  assay token list
      Lists tokens (id, user, role, created, last used, revoked, expires); never the secrets.
      An expiry that has passed is marked "(expired)".`;

const DURATION_UNITS: Record<string, number> = { m: 60, h: 3600, d: 86_400 };

/** `--expires-in`'s duration (`30m`, `12h`, `90d`) in seconds: at least a minute, at most ten years. */
export function expiresInSeconds(text: string): number {
  const m = /^([0-9]{1,10})([mhd])$/.exec(text);
  const seconds = m ? Number(m[1]) * (DURATION_UNITS[m[2] as string] as number) : 0;
  if (!(seconds > 0 && seconds <= MAX_TOKEN_LIFETIME_SECONDS))
    throw new UsageError(
      `--expires-in must be a duration of minutes, hours or days such as 30m, 12h or 90d, from 1m to ${MAX_TOKEN_LIFETIME_SECONDS / 86_400}d; got ${JSON.stringify(text)}`,
    );
  return seconds;
}

async function withDatabase<T>(
  config: Config,
  fn: (db: Awaited<ReturnType<typeof openDatabase>>) => Promise<T>,
) {
  // Quiet: the token must be the last line of stdout, and logs go to stderr here.
  const logger = createLogger({ level: "warn", destination: process.stderr });
  const database = await openDatabase(config, logger, { max: 2, connectTimeoutMs: COMMAND_CONNECT_MS });
  try {
    // Bounded: a database that never answers hung the command (for ever, when its connections are
    // closed before it answers).
    await firstAnswer(database.sql, COMMAND_ANSWER_MS);
    // A schema older than this release (`assay migrate` not run for it yet): said so, not a missing
    // column's raw 42703 from the first statement that names it.
    const state = await schemaState(database.sql);
    if (state.kind === "older") throw schemaTooOld(state);
    return await fn(database);
  } catch (err) {
    // A missing table (42P01): an external DATABASE_URL that `assay migrate` has not brought up yet —
    // the first command a new installation runs, which said only `relation "users" does not exist`.
    if ((err as { code?: unknown }).code === "42P01")
      throw new Error("the database is not migrated to this version: run `assay migrate` first", {
        cause: err,
      });
    throw err;
  } finally {
    await database.close();
  }
}

/** Control characters and line breaks: a name with one breaks `token list`'s lines and columns. */
const UNPRINTABLE = /[\p{Cc}\p{Zl}\p{Zp}]/u;

/**
 * Refuses what `sub` does not take. Ignored, it was a silent surprise: `token revoke 5 6` revoked 5
 * only and said so, and `token list --user a` listed every user's tokens.
 */
function refuseExtra(
  sub: string,
  given: { values: Record<string, unknown>; positionals: string[] },
  options: readonly string[],
  positionals: number,
  usage: string,
) {
  const option = Object.keys(given.values).find((o) => o !== "help" && !options.includes(o));
  if (option !== undefined) throw new UsageError(`token ${sub} does not take --${option}; usage: ${usage}`);
  if (given.positionals.length > positionals) throw new UsageError(`too many arguments; usage: ${usage}`);
}

export async function tokenCommand(argv: string[], config: Config | undefined): Promise<number> {
  const [sub, ...rest] = argv;
  const { values, positionals } = parse({
    args: rest,
    allowPositionals: true,
    options: {
      user: { type: "string" },
      role: { type: "string" },
      "expires-in": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help || !sub || sub === "--help" || sub === "-h") {
    console.log(HELP);
    return sub || values.help ? 0 : 2;
  }
  const given = { values, positionals };
  switch (sub) {
    case "create": {
      refuseExtra(sub, given, ["user", "role", "expires-in"], 0, CREATE_USAGE);
      const user = values.user?.trim();
      if (!user) throw new UsageError("token create needs --user <name>");
      // Characters, as it says: `length` counts UTF-16 units, two for each of 𩸽, 𠮷 or an emoji.
      if ([...user].length > 100) throw new UsageError("--user must be at most 100 characters");
      if (UNPRINTABLE.test(user))
        throw new UsageError("--user must not contain control characters or line breaks");
      if (values.role !== undefined && !ROLES.includes(values.role as Role)) {
        throw new UsageError(`--role must be one of ${ROLES.join(", ")}`);
      }
      const lifetime =
        values["expires-in"] === undefined ? undefined : expiresInSeconds(values["expires-in"]);
      const created = await withDatabase(need(config), (db) =>
        tokenCreate(db.sql, user, values.role as Role | undefined, lifetime),
      );
      const expires = created.expiresAt === null ? "" : `, expires ${created.expiresAt}`;
      console.log(
        `token ${created.tokenId} for user ${user} (role ${created.role}${expires}); store it now, it is not shown again:`,
      );
      console.log(created.token);
      return 0;
    }
    case "revoke": {
      refuseExtra(sub, given, [], 1, "assay token revoke <id> (one token at a time)");
      const typed = positionals[0];
      if (!typed || !/^[0-9]+$/.test(typed)) throw new UsageError("token revoke needs a numeric token id");
      // Numeric, but beyond any token's (a bigint; a Number is exact only to 2^53 − 1).
      const id = typed.replace(/^0+(?=[0-9])/, "");
      if (!/^[1-9][0-9]{0,14}$/.test(id))
        throw new UsageError(`token id ${typed} is out of range: token ids are 1 to 999999999999999`);
      const revoked = await withDatabase(need(config), (db) => tokenRevoke(db.sql, Number(id)));
      if (!revoked) {
        console.error(`assay: no live token with id ${id}`);
        return 1;
      }
      console.log(`token ${id} revoked`);
      return 0;
    }
    case "list": {
      refuseExtra(sub, given, [], 0, "assay token list");
      const tokens = await withDatabase(need(config), (db) => tokenList(db.sql));
      console.log(["id", "user", "role", "created", "last used", "revoked", "expires"].join("\t"));
      for (const t of tokens) {
        const when = (d: string | null) => (d ? isoTime(d) : "-");
        const expires = `${when(t.expiresAt)}${t.expired ? " (expired)" : ""}`;
        console.log(
          [t.id, t.user, t.role, when(t.createdAt), when(t.lastUsedAt), when(t.revokedAt), expires].join(
            "\t",
          ),
        );
      }
      return 0;
    }
    default:
      throw new UsageError(`unknown token command: ${sub}\n\n${HELP}`);
  }
}
