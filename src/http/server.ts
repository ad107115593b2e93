// Builds the Fastify instance around the app plugin. Tests use it with `inject`; `assay api`
// listens with it.
import { randomUUID } from "node:crypto";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from "fastify";
import fp from "fastify-plugin";
import { EventHub } from "../events/hub.ts";
import type { Logger } from "../log.ts";
import { app, type Services } from "./app.ts";

/** JSON bodies are small; uploads are multipart and limited by ASSAY_MAX_UPLOAD_BYTES instead. */
const JSON_BODY_LIMIT = 1024 * 1024;

/** Builds the app; it owns its event hub (one LISTEN connection, opened on the first stream). */
export async function buildServer(
  services: Omit<Services, "events">,
  logger: Logger,
): Promise<FastifyInstance> {
  const events = new EventHub({
    sql: services.database.sql,
    logger,
    sweepIntervalMs: services.config.sseHeartbeatMs,
  });
  const fastify = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    bodyLimit: JSON_BODY_LIMIT,
    genReqId: (req) => {
      const given = req.headers["x-request-id"];
      return typeof given === "string" && /^[\w.-]{1,64}$/.test(given) ? given : randomUUID();
    },
    ajv: {
      customOptions: {
        removeAdditional: false,
        coerceTypes: "array",
        useDefaults: true,
        discriminator: true,
      },
    },
    return503OnClosing: true,
  });
  fastify.addHook("onClose", async () => events.stop());
  await fastify
    .withTypeProvider<TypeBoxTypeProvider>()
    .register(fp(app), { services: { ...services, events } });
  await fastify.ready();
  return fastify;
}
