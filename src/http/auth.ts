// Bearer-token authentication for every /api route. Missing, malformed, unknown, revoked and expired
// tokens all get the same 401: a caller learns nothing about which it was.
import type { FastifyInstance, FastifyRequest } from "fastify";
import { type Authenticated, hashToken, tokenAuthenticate } from "../auth/tokens.ts";
import { ApiError, databaseUnavailable } from "./errors.ts";
import { checkDecimalQuery } from "./query-check.ts";

declare module "fastify" {
  interface FastifyRequest {
    principal: Authenticated | undefined;
    /**
     * The token cache's generation taken before the token was checked (TokenCache.begin()): what goes
     * on after the check (a download) asks again when it has moved (token-watch.ts).
     */
    tokenTicket: number | undefined;
  }
}

/**
 * `Bearer`, one or more spaces, the token. The scheme is matched in any case (RFC 9110 §11.1: an
 * auth-scheme is case-insensitive; `bearer …` from a client or a proxy that lower-cases it is the same
 * credential), and 1*SP may separate it from the token (§11.4).
 */
const BEARER = /^bearer +([^\s]+)$/i;

/**
 * Whether the request carries more than one Authorization field line. Node keeps the first and drops
 * the rest, so `Bearer <mine>` then `Bearer <yours>` authenticated as the first, while a proxy in
 * front may have checked or logged the other. Authorization is a singleton field (RFC 9110 §11.6.2):
 * two of them are a malformed credential, refused like any other.
 */
function repeatedAuthorization(request: FastifyRequest): boolean {
  const raw = request.raw.rawHeaders;
  let seen = 0;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]?.toLowerCase() === "authorization" && ++seen > 1) return true;
  }
  return false;
}

/**
 * The challenge every 401 carries (RFC 9110 §11.6.1: a 401 must send one; RFC 6750 §3). The same for
 * every cause, without an `error` parameter: a caller learns nothing about which it was.
 */
export const BEARER_CHALLENGE = 'Bearer realm="assay"';

/** Adds the onRequest hook to `scope` (the /api plugin). Its 401s carry BEARER_CHALLENGE (error-handler.ts). */
export function requireBearer(scope: FastifyInstance) {
  scope.decorateRequest("tokenTicket", undefined);
  scope.addHook("onRequest", async (request, reply) => {
    // First: a token the cache lacks would wait for the database too.
    if (scope.databaseGate.refuses()) throw databaseUnavailable(reply);
    if (repeatedAuthorization(request)) throw new ApiError(401, "UNAUTHORIZED");
    const match = BEARER.exec(request.headers.authorization ?? "");
    request.tokenTicket = scope.services.tokens?.begin();
    const principal = match?.[1]
      ? await tokenAuthenticate(scope.services.database.sql, match[1], scope.services.tokens)
      : undefined;
    if (!principal) throw new ApiError(401, "UNAUTHORIZED");
    request.principal = principal;
    checkDecimalQuery(request);
    refuseEncodedBody(request);
  });
}

/**
 * A body in a Content-Encoding (gzip, br, …) is refused: the server decodes none, so a compressed JSON
 * body was a 400 INVALID_JSON, and an uncompressed one labelled gzip was taken as it was (a 201).
 * `identity` is no encoding. A request without a body is let through whatever it says.
 */
function refuseEncodedBody(request: FastifyRequest): void {
  const encoding = request.headers["content-encoding"];
  if (encoding === undefined || /^\s*(identity\s*)?$/i.test(encoding)) return;
  const hasBody =
    request.headers["transfer-encoding"] !== undefined ||
    (request.headers["content-length"] !== undefined && request.headers["content-length"] !== "0");
  if (hasBody)
    throw new ApiError(
      415,
      "UNSUPPORTED_MEDIA_TYPE",
      "A Content-Encoding is not supported: send the body as it is.",
    );
}

/** The authenticated principal; only for handlers behind `requireBearer`. */
export function principalOf(request: FastifyRequest): Authenticated {
  if (!request.principal) throw new Error("principalOf called outside an authenticated scope");
  return request.principal;
}

/** The request's bearer token; only for handlers behind `requireBearer`. */
export function bearerOf(request: FastifyRequest): string {
  const token = BEARER.exec(request.headers.authorization ?? "")?.[1];
  if (!token) throw new Error("bearerOf called outside an authenticated scope");
  return token;
}

/** The stored hash of the request's bearer token; only for handlers behind `requireBearer`. */
export function bearerHashOf(request: FastifyRequest): string {
  return hashToken(bearerOf(request));
}
