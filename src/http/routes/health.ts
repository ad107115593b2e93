import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import { Type } from "typebox";
import { appliedMigrationCount } from "../../db/migrate.ts";
import { singleFlight } from "../../single-flight.ts";
import { Envelope, ErrorBody, ok } from "../schemas.ts";

const READY_QUERY_TIMEOUT_MS = 2000;
/** `work`, or a rejection after READY_QUERY_TIMEOUT_MS (2 s). */
export function withTimeout<T>(work: Promise<T>, what: string): Promise<T> {
  return Promise.race([
    work,
    new Promise<never>((_, reject) =>
      setTimeout(() => reject(new Error(`${what} timed out`)), READY_QUERY_TIMEOUT_MS).unref(),
    ),
  ]);
}

export const healthRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const migrationCount = singleFlight(() => appliedMigrationCount(app.services.database.sql));
  const storeCheck = singleFlight(() => app.services.storage.check());
  app.get(
    "/healthz",
    {
      schema: {
        summary: "Liveness: the process is up",
        tags: ["health"],
        response: { 200: Envelope(Type.Object({ status: Type.Literal("ok") })) },
      },
    },
    async () => ok({ status: "ok" as const }),
  );

  app.get(
    "/readyz",
    {
      schema: {
        summary: "Readiness: the database is reachable and migrated, and the object store reachable",
        tags: ["health"],
        response: { 200: Envelope(Type.Object({ status: Type.Literal("ready") })), 503: ErrorBody },
      },
    },
    async (request, reply) => {
      const { expectedMigrations, storage } = app.services;
      let applied: number;
      try {
        applied = await withTimeout(migrationCount(), "readiness query");
      } catch (err) {
        request.log.warn({ err }, "readiness: database unreachable");
        return reply.status(503).send({ code: "NOT_READY", message: "The database is unreachable." });
      }
      if (applied < expectedMigrations) {
        return reply.status(503).send({ code: "NOT_READY", message: "The database is not migrated." });
      }
      try {
        await withTimeout(storeCheck(), "object store check");
      } catch (err) {
        request.log.warn({ err, storage: storage.kind }, "readiness: object store unreachable");
        return reply.status(503).send({ code: "NOT_READY", message: "The object store is unreachable." });
      }
      return ok({ status: "ready" as const });
    },
  );
};
