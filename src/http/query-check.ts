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

const DECIMAL = /^[0-9]+$/;

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
    if (typeof value === "string" && !DECIMAL.test(value))
      throw validationFailed(`querystring/${field} must be an integer in decimal digits.`);
  }
}
