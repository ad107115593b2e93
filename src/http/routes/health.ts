import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import { Type } from "typebox";
import { appliedMigrationCount } from "../../db/migrate.ts";
import { Envelope, ErrorBody, ok } from "../schemas.ts";

const READY_QUERY_TIMEOUT_MS = 2000;

function withTimeout<T>(work: Promise<T>, what: string): Promise<T> {
  return Promise.race([
    work,
    new Promise<never>((_, reject) =>
      setTimeout(() => reject(new Error(`${what} timed out`)), READY_QUERY_TIMEOUT_MS).unref(),
    ),
  ]);
}

export const healthRoutes: FastifyPluginAsyncTypebox = async (app) => {
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
      const { database, expectedMigrations, storage } = app.services;
      let applied: number;
      try {
        applied = await withTimeout(appliedMigrationCount(database.sql), "readiness query");
      } catch (err) {
        request.log.warn({ err }, "readiness: database unreachable");
        return reply.status(503).send({ code: "NOT_READY", message: "The database is unreachable." });
      }
      if (applied < expectedMigrations) {
        return reply.status(503).send({ code: "NOT_READY", message: "The database is not migrated." });
      }
      try {
        await withTimeout(storage.check(), "object store check");
      } catch (err) {
        request.log.warn({ err, storage: storage.kind }, "readiness: object store unreachable");
        return reply.status(503).send({ code: "NOT_READY", message: "The object store is unreachable." });
      }
      return ok({ status: "ready" as const });
    },
  );
};
