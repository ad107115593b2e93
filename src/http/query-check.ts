// Integer query fields in decimal digits only: Ajv's coercion took any number JavaScript reads
// (`limit=1e1` was 10, `0x10` 16, `+5`, ` 5` and `5.0` were 5).
import type { FastifyRequest } from "fastify";
import { validationFailed } from "./errors.ts";

declare module "fastify" {
  interface FastifyContextConfig {
    /** The route's integer query fields, checked by checkDecimalQuery (set by app.ts's onRoute). */
    integerQuery?: readonly string[];
  }
}

/** The query fields of a route's querystring schema that are integers. */
export function integerFields(schema: unknown): string[] {
  const properties = (schema as { properties?: Record<string, { type?: unknown }> } | undefined)?.properties;
  if (properties === undefined) return [];
  return Object.keys(properties).filter((name) => properties[name]?.type === "integer");
}

/**
 * The integer fields of a route's query schema, for checkDecimalQuery; throws (at start-up, from the
 * `/api` scope's onRoute hook) on one it could not check rightly:
 * - declared otherwise than as a plain `{ type: "integer" }` property (inside a union or a $ref, Ajv
 *   would coerce it unchecked);
 * - without a `maximum` below 2^53 - 1 (a value past that is replaced by it for the schema to refuse:
 *   right only where the maximum is below it).
 */
export function integerQueryFields(url: string, schema: unknown): string[] {
  const integers = integerFields(schema);
  const declared = JSON.stringify(schema ?? {}).split('"integer"').length - 1;
  if (declared !== integers.length)
    throw new Error(
      `${url}: an integer query field must be a plain { type: "integer" } property (query-check.ts)`,
    );
  const properties = (schema as { properties: Record<string, { maximum?: unknown }> } | undefined)
    ?.properties;
  for (const field of integers) {
    const maximum = properties?.[field]?.maximum;
    if (typeof maximum !== "number" || maximum >= Number.MAX_SAFE_INTEGER)
      throw new Error(
        `${url}: the integer query field ${field} must declare a maximum below 2^53 - 1 (query-check.ts)`,
      );
  }
  return integers;
}

const DECIMAL = /^[0-9]+$/;
/** 2^53 - 1 in decimal digits: 16 of them. */
const MAX_EXACT = String(Number.MAX_SAFE_INTEGER);

/**
 * Throws VALIDATION_FAILED when an integer query field of the request's route is not decimal digits.
 * Called from the `/api` scope's onRequest hook (auth.ts), where the query is parsed and the schema
 * not yet applied: one hook fewer per request than a hook of its own. A field given twice is left to
 * the schema, whose answer says so (error-handler.ts).
 */
export function checkDecimalQuery(request: FastifyRequest): void {
  const fields = request.routeOptions.config.integerQuery;
  if (fields === undefined) return;
  const query = request.query as Record<string, unknown>;
  for (const field of fields) {
    const value = query[field];
    if (typeof value !== "string") continue;
    if (!DECIMAL.test(value))
      throw validationFailed(`querystring/${field} must be an integer in decimal digits.`);
    // Past 2^53 - 1 a number is no longer exact, and past 308 digits Ajv's coercion made it Infinity,
    // which passed `maximum` and reached the database (a 500). Such a value is replaced by 2^53 - 1,
    // which the schema refuses naming the bound: every integer query field declares a maximum below
    // it (integerQueryFields). Exact values are left to the schema.
    const digits = value.replace(/^0+/, "");
    if (digits.length > 16 || (digits.length === 16 && digits > MAX_EXACT)) query[field] = MAX_EXACT;
  }
}
