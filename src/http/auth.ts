// Bearer-token authentication for every /api route. Missing, malformed, unknown and revoked
// tokens all get the same 401: a caller learns nothing about which it was.
import type { FastifyInstance, FastifyRequest } from "fastify";
import { type Principal, tokenAuthenticate } from "../auth/tokens.ts";
import { ApiError } from "./errors.ts";

declare module "fastify" {
  interface FastifyRequest {
    principal: Principal | undefined;
  }
}

const BEARER = /^Bearer ([^\s]+)$/;

/** Adds the onRequest hook to `scope` (the /api plugin). */
export function requireBearer(scope: FastifyInstance) {
  scope.addHook("onRequest", async (request) => {
    const match = BEARER.exec(request.headers.authorization ?? "");
    const principal = match?.[1] ? await tokenAuthenticate(scope.services.database.sql, match[1]) : undefined;
    if (!principal) throw new ApiError(401, "UNAUTHORIZED");
    request.principal = principal;
  });
}

/** The authenticated principal; only for handlers behind `requireBearer`. */
export function principalOf(request: FastifyRequest): Principal {
  if (!request.principal) throw new Error("principalOf called outside an authenticated scope");
  return request.principal;
}
