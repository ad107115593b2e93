// Shared TypeBox schemas of the HTTP API (the same schemas validate requests, shape responses and
// generate the OpenAPI document at /docs).
import { type TSchema, Type } from "typebox";
import { validationFailed } from "./errors.ts";

export const ErrorBody = Type.Object(
  { code: Type.String(), message: Type.String() },
  { $id: "ErrorBody", description: "Every error: a stable code and a stable public message." },
);

export function Envelope<T extends TSchema>(data: T) {
  return Type.Object({ code: Type.Literal("OK"), message: Type.String(), data });
}

export function ok<T>(data: T, message = "OK") {
  return { code: "OK" as const, message, data };
}

/** Ids are strings of digits; anything else is a 404, never a 500 (checked in the handler). */
export const IdParam = Type.String({ description: "A decimal id" });

const ID_SHAPE = /^[1-9][0-9]{0,14}$/;
/** True for an id that can exist: decimal, no leading zero, below 2^53 for sure. */
export const isId = (s: string) => ID_SHAPE.test(s);

export const errorResponses = {
  400: ErrorBody,
  401: ErrorBody,
  404: ErrorBody,
  413: ErrorBody,
  500: ErrorBody,
};

/**
 * The responses of a route that sends bytes, not an envelope: for the OpenAPI document only. Fastify
 * serializes no stream, so these never shape what is sent; each media type's body is `binary`.
 */
export function byteResponses(ok: string, mediaTypes: readonly string[], resumable: boolean) {
  const body = (description: string) => ({
    description,
    content: Object.fromEntries(mediaTypes.map((m) => [m, { schema: { type: "string", format: "binary" } }])),
  });
  if (!resumable) return { 200: body(ok) };
  return {
    200: body(`${ok}; with an ETag and Accept-Ranges: bytes`),
    206: body("The bytes one `Range` selects (`Content-Range` says which)"),
    304: { description: "Not modified: `If-None-Match` names the ETag (no body)", type: "null" },
  };
}

/** Query fields of a paged list: the page size and the previous page's `nextCursor`. */
export const PageQuery = {
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100, default: 20 })),
  cursor: Type.Optional(
    Type.String({ pattern: "^[1-9][0-9]{0,14}$", description: "nextCursor of the previous page" }),
  ),
};

/** A page of a list: its items and the cursor of the next page (null on the last). */
export const Page = <T extends TSchema>(item: T) =>
  Type.Object({ items: Type.Array(item), nextCursor: Type.Union([Type.String(), Type.Null()]) });

/**
 * The query of a route that takes none: a query field there is unknown, and gets 400 like an unknown
 * field of a list's query (a mistyped `?stauts=` must not look accepted). Given to every /api route
 * without a query schema of its own (http/app.ts).
 */
export const NoQuery = Type.Object({}, { additionalProperties: false });

/** An `Idempotency-Key` (task creates, uploads): 1–200 visible ASCII characters. */
const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,200}$/;

/** The request's `Idempotency-Key`, if it sent one; VALIDATION_FAILED when it is not a key. */
export function idempotencyKeyOf(header: string | string[] | undefined): string | undefined {
  if (header === undefined) return undefined;
  if (typeof header !== "string" || !IDEMPOTENCY_KEY.test(header))
    throw validationFailed("The Idempotency-Key header must be 1–200 visible ASCII characters.");
  return header;
}
