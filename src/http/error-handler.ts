// Turns anything thrown in a request into the error envelope. Public text comes only from
// PUBLIC_MESSAGES or an ApiError's deliberate detail; the cause goes to the log.
import type { FastifyError, FastifyReply, FastifyRequest } from "fastify";
import { connectionFailed, type Sql } from "../db/client.ts";
import { appliedMigrationCount } from "../db/migrate.ts";
import { singleFlight } from "../single-flight.ts";
import { PayloadTooLargeError, StoreUnavailableError } from "../storage/store.ts";
import { BEARER_CHALLENGE } from "./auth.ts";
import {
  ApiError,
  bodyTooLarge,
  databaseUnavailable,
  type ErrorCode,
  PUBLIC_MESSAGES,
  storeUnavailable,
  uploadTooLarge,
} from "./errors.ts";
import { withTimeout } from "./routes/health.ts";

const BAD_JSON = new Set(["FST_ERR_CTP_INVALID_JSON_BODY", "FST_ERR_CTP_EMPTY_JSON_BODY"]);

/**
 * The query field sent more than once (`?status=queued&status=running`) that failed validation, if
 * any: no query field takes a list, and the schema's message for it ("must be one of queued, running,
 * …" when both were allowed values, "must be integer") did not say what was wrong.
 */
function repeatedQueryField(err: FastifyError, query: unknown): string | undefined {
  if (err.validationContext !== "querystring" || typeof query !== "object" || query === null) return;
  for (const v of err.validation ?? []) {
    const field = v.instancePath.split("/")[1];
    if (field && Array.isArray((query as Record<string, unknown>)[field])) return field;
  }
  return undefined;
}

/** A field name an answer may repeat: letters, digits, `_`, `-`, `.` and `[]` (`status[]`), up to 64. */
const PLAIN_FIELD = /^[A-Za-z0-9_.[\]-]{1,64}$/;

/** SQLSTATEs of a schema older than the code: undefined_table, undefined_column. */
const UNMIGRATED = new Set(["42P01", "42703"]);

function classify(
  err: FastifyError,
  request: FastifyRequest,
): { status: number; code: ErrorCode; message: string } {
  if (err instanceof ApiError) return { status: err.statusCode, code: err.code, message: err.publicMessage };
  if (err.validation?.some((v) => v.keyword === "discriminator" && v.instancePath === "")) {
    // The create body's union has no branch for this analysisType (or it is not a string; a missing
    // one fails `required` first and is VALIDATION_FAILED naming the field).
    return {
      status: 400,
      code: "ANALYSIS_TYPE_UNSUPPORTED",
      message: PUBLIC_MESSAGES.ANALYSIS_TYPE_UNSUPPORTED,
    };
  }
  const repeated = repeatedQueryField(err, request.query);
  if (repeated !== undefined) {
    const name = repeated.length > 64 ? `${repeated.slice(0, 64)}…` : repeated;
    return { status: 400, code: "VALIDATION_FAILED", message: `querystring/${name} may be given only once.` };
  }
  if (err.validation) {
    // Ajv's message for an unknown field names where it is, not the field ("body must NOT have
    // additional properties"): this one names it.
    const unknown = err.validation.find((v) => v.keyword === "additionalProperties");
    const field = unknown?.params?.additionalProperty;
    if (typeof field === "string") {
      const at = `${err.validationContext ?? "body"}${unknown?.instancePath ?? ""}`;
      // Named only when the name is a plain one: any other text the client chose (markup, control
      // characters, a lone surrogate, 64 characters of it) was sent back in the message.
      if (!PLAIN_FIELD.test(field))
        return { status: 400, code: "VALIDATION_FAILED", message: `${at} has a field that is not known.` };
      return { status: 400, code: "VALIDATION_FAILED", message: `${at}/${field} is not a known field.` };
    }
    // An enumeration (a union of literals) fails once per member, and Fastify's message repeated
    // "querystring/status must be equal to constant" for each: this one says it once, with the values.
    const anyOf = err.validation.find((v) => v.keyword === "anyOf");
    const allowed = err.validation
      .filter((v) => v.keyword === "const" && v.instancePath === anyOf?.instancePath)
      .map((v) => String(v.params?.allowedValue));
    if (anyOf && allowed.length > 0) {
      const at = `${err.validationContext ?? "body"}${anyOf.instancePath}`;
      return {
        status: 400,
        code: "VALIDATION_FAILED",
        message: `${at} must be one of ${allowed.join(", ")}`,
      };
    }
    // Fastify's message names the field, e.g. "body/analysisType must be string".
    return { status: 400, code: "VALIDATION_FAILED", message: err.message };
  }
  if (err instanceof PayloadTooLargeError || err.code === "FST_REQ_FILE_TOO_LARGE") {
    const refused = uploadTooLarge(request.server.services.config.maxUploadBytes);
    return { status: 413, code: refused.code, message: refused.publicMessage };
  }
  if (err.code === "FST_ERR_CTP_BODY_TOO_LARGE") {
    const refused = bodyTooLarge(request.routeOptions.bodyLimit);
    return { status: 413, code: refused.code, message: refused.publicMessage };
  }
  if (err.code === "FST_FILES_LIMIT") {
    return { status: 413, code: "PAYLOAD_TOO_LARGE", message: "An upload carries one file." };
  }
  if (err.code === "FST_INVALID_MULTIPART_CONTENT_TYPE") {
    return {
      status: 400,
      code: "VALIDATION_FAILED",
      message: "The request must be multipart/form-data with a `file` part.",
    };
  }
  if (err.code === "FST_ERR_CTP_INVALID_MEDIA_TYPE") {
    return { status: 415, code: "UNSUPPORTED_MEDIA_TYPE", message: PUBLIC_MESSAGES.UNSUPPORTED_MEDIA_TYPE };
  }
  if (BAD_JSON.has(err.code) || (err instanceof SyntaxError && err.statusCode === 400)) {
    return { status: 400, code: "INVALID_JSON", message: PUBLIC_MESSAGES.INVALID_JSON };
  }
  const status = err.statusCode ?? 500;
  // The dashboard's static files: a folder (`/ui/`) or a path out of it (`/ui/../package.json`,
  // refused by the file server with 403) is a file that is not there, as docs/api.md says of `/ui/…`;
  // until 2026-12-07 it was a 403 BAD_REQUEST. (Nothing of ours answers 403: another user's is a 404.)
  if (status === 403) return { status: 404, code: "NOT_FOUND", message: PUBLIC_MESSAGES.NOT_FOUND };
  if (status >= 400 && status < 500)
    return { status, code: "BAD_REQUEST", message: PUBLIC_MESSAGES.BAD_REQUEST };
  return { status: 500, code: "INTERNAL_ERROR", message: PUBLIC_MESSAGES.INTERNAL_ERROR };
}

/** Whether `err` names a table or column the database lacks (42P01, 42703). */
const namesMissingSchema = (err: FastifyError) =>
  err.name === "PostgresError" && UNMIGRATED.has((err as { code?: string }).code ?? "");

export function errorHandler(err: FastifyError, request: FastifyRequest, reply: FastifyReply) {
  // The object store is away (a request's store call failed, and so did the store's check: storeFault):
  // a 503 the client may retry, as for the database, not a bug's 500.
  if (err instanceof StoreUnavailableError)
    return answer(storeUnavailable(reply, err) as unknown as FastifyError, request, reply);
  // The request's query failed because its connection to the database did (refused, cut, timed out,
  // the server shutting down): the 503 the gate gives once it has seen the outage, not a 500 — each
  // request in the first second or so of an outage, before the gate closed, was an INTERNAL_ERROR
  // (found by a trial, 2026-12-07). The gate probes at once.
  if (!(err instanceof ApiError) && connectionFailed(err)) {
    request.server.databaseGate.suspect();
    const refused = databaseUnavailable(reply);
    return answer(Object.assign(refused, { cause: err }) as unknown as FastifyError, request, reply);
  }
  // A table or column the code names and the database lacks: a database not migrated for this release
  // (behind a balancer that sends requests before /readyz says 200) is a 503 the client may retry, as
  // /readyz says — told by the migrations applied, as /readyz tells it; with every migration applied
  // it is a bug's 500 (a mistyped column must not pass for "not migrated"). Logged as a 5xx, whole.
  if (namesMissingSchema(err)) {
    const { database, expectedMigrations } = request.server.services;
    return schemaBehind(database.sql, expectedMigrations).then(
      (behind) => answer(err, request, reply, behind ? NOT_MIGRATED : undefined),
      (lookup: unknown) => {
        request.log.warn({ err: lookup }, "could not tell whether the database is migrated");
        return answer(err, request, reply);
      },
    );
  }
  return answer(err, request, reply);
}

/** How long an answer "behind" is reused; "migrated" is kept for good (migrations only add). */
const BEHIND_REUSED_MS = 1000;

const schemaLookups = new WeakMap<Sql, { migrated: boolean; at: number; count: () => Promise<number> }>();

/**
 * Whether fewer migrations are applied than this release's: the count /readyz makes, shared by every
 * failing request at a time (singleFlight) and bounded (withTimeout), an answer "behind" reused for
 * BEHIND_REUSED_MS and "migrated" for good (a release's migrations only add, and never go away under
 * a running process). Without this, each request that failed on a missing column during an upgrade
 * made two more statements of its own.
 */
function schemaBehind(sql: Sql, expected: number): Promise<boolean> {
  let state = schemaLookups.get(sql);
  if (state === undefined) {
    state = {
      migrated: false,
      at: Number.NEGATIVE_INFINITY,
      count: singleFlight(() => appliedMigrationCount(sql)),
    };
    schemaLookups.set(sql, state);
  }
  if (state.migrated) return Promise.resolve(false);
  if (performance.now() - state.at < BEHIND_REUSED_MS) return Promise.resolve(true);
  const current = state;
  return withTimeout(current.count(), "migration count").then((applied) => {
    current.migrated = applied >= expected;
    current.at = performance.now();
    return !current.migrated;
  });
}

const NOT_MIGRATED = {
  status: 503,
  code: "NOT_READY",
  message: "The database is not migrated to this version.",
} as const;

function answer(
  err: FastifyError,
  request: FastifyRequest,
  reply: FastifyReply,
  as?: { status: number; code: ErrorCode; message: string },
) {
  const { status, code, message } = as ?? classify(err, request);
  // The database gate's 503 is no failure of this request's: the gate logged the outage once.
  if (status >= 500 && !(err instanceof ApiError && err.code === "NOT_READY"))
    request.log.error({ err }, "request failed");
  else
    request.log.info(
      { code, cause: err.cause instanceof Error ? err.cause.message : err.message },
      "request rejected",
    );
  // Every 401 is an ApiError thrown here (the /api hook's, an event stream's re-check): the
  // challenge is set where they all pass, rather than by an onSend hook that every response paid for.
  if (status === 401) reply.header("www-authenticate", BEARER_CHALLENGE);
  return reply.status(status).send({ code, message });
}
