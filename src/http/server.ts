// Builds the Fastify instance around the app plugin. Tests use it with `inject`; `assay api`
// listens with it.
import { randomUUID } from "node:crypto";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from "fastify";
import fp from "fastify-plugin";
import { TokenCache } from "../auth/token-cache.ts";
import { EventHub } from "../events/hub.ts";
import type { Logger } from "../log.ts";
import { TaskCache } from "../tasks/task-cache.ts";
import { app, type Services } from "./app.ts";
import { lazyCompilers } from "./lazy-compilers.ts";

/**
 * JSON bodies are small but for a task's file ids: 1 MiB, plus room for ASSAY_MAX_TASK_RUNS ids (an id
 * and its quotes and comma take at most 19 bytes; 32 leaves room for spacing). Uploads are multipart
 * and limited by ASSAY_MAX_UPLOAD_BYTES instead.
 */
export const jsonBodyLimit = (maxTaskRuns: number) => 1024 * 1024 + 32 * maxTaskRuns;

/** Builds the app; it owns its event hub (one LISTEN connection, opened on the first stream). */
export async function buildServer(
  services: Omit<Services, "events" | "tokens" | "tasks">,
  logger: Logger,
): Promise<FastifyInstance> {
  const events = new EventHub({
    sql: services.database.sql,
    logger,
    sweepIntervalMs: services.config.sseHeartbeatMs,
  });
  const fastify = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    bodyLimit: jsonBodyLimit(services.config.maxTaskRuns),
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
    schemaController: { compilersFactory: lazyCompilers({ coerceBodies: false }) },
  });
  const tokens = new TokenCache();
  await tokens.start(services.database.sql, logger);
  // Listens before the event hub does, so an entry is dropped before a stream delivers its event.
  const tasks = new TaskCache();
  await tasks.start(services.database.sql, logger);
  fastify.addHook("onClose", async () => {
    await tokens.stop();
    await tasks.stop();
    await events.stop();
  });
  await fastify
    .withTypeProvider<TypeBoxTypeProvider>()
    .register(fp(app), { services: { ...services, events, tokens, tasks } });
  await fastify.ready();
  return fastify;
}
