// Builds the Fastify instance around the app plugin. Tests use it with `inject`; `assay api`
// listens with it.
import { randomUUID } from "node:crypto";
import http from "node:http";
import type { Socket } from "node:net";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import Fastify, {
  type FastifyBaseLogger,
  type FastifyError,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
} from "fastify";
import fp from "fastify-plugin";
import { TokenCache } from "../auth/token-cache.ts";
import { EventHub } from "../events/hub.ts";
import type { Logger } from "../log.ts";
import { TaskCache } from "../tasks/task-cache.ts";
import { app, type Services } from "./app.ts";
import { PUBLIC_MESSAGES, uploadTooLarge } from "./errors.ts";
import { lazyCompilers } from "./lazy-compilers.ts";

/**
 * JSON bodies are small but for a task's file ids: 1 MiB, plus room for ASSAY_MAX_TASK_RUNS ids (an id
 * and its quotes and comma take at most 19 bytes; 32 leaves room for spacing). Uploads are multipart
 * and limited by ASSAY_MAX_UPLOAD_BYTES instead.
 */
export const jsonBodyLimit = (maxTaskRuns: number) => 1024 * 1024 + 32 * maxTaskRuns;

/**
 * The longest path parameter the router matches. Fastify's default, 100, answered a longer one with a
 * bare 414 of its own, so an id of 101 characters was not the resource's 404 and an output name of
 * 101–128 characters (runner/outputs.ts allows 128) could not be fetched. The limit guards regex
 * parameters against slow matching, and no route has one: a parameter cannot be longer than Node's
 * whole request head (16 KiB) anyway.
 */
const MAX_PARAM_LENGTH = 16 * 1024;

const BAD_REQUEST = JSON.stringify({ code: "BAD_REQUEST", message: PUBLIC_MESSAGES.BAD_REQUEST });

/**
 * What Node's default clientErrorHandler does (answer a request Node's parser refused, then drop the
 * socket), with our envelope instead of Fastify's `{error, message, statusCode}`: a request head
 * over Node's limit (431), one that is not HTTP (400) or one that took too long (408).
 */
function clientErrorHandler(this: FastifyInstance, err: Error & { code?: string }, socket: Socket) {
  if (err.code === "ECONNRESET" || socket.destroyed) return;
  const status =
    err.code === "ERR_HTTP_REQUEST_TIMEOUT" ? 408 : err.code === "HPE_HEADER_OVERFLOW" ? 431 : 400;
  this.log.trace({ err }, "client error");
  // A refused request pipelined behind one whose answer has begun (an event stream, a download) gets
  // no answer of its own, as with Node's default handler: written into that answer's body, it was
  // taken for part of the stream or the file (until 2026-12-06). The socket is destroyed all the same.
  const answering = (socket as Socket & { _httpMessage?: http.ServerResponse })._httpMessage;
  if (socket.writable && !answering?.headersSent) {
    socket.write(
      `HTTP/1.1 ${status} ${http.STATUS_CODES[status]}\r\nContent-Length: ${Buffer.byteLength(BAD_REQUEST)}\r\n` +
        `Content-Type: application/json; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\n` +
        `Connection: close\r\n\r\n${BAD_REQUEST}`,
    );
  }
  socket.destroy(err);
}

/**
 * A URL the router cannot decode (`%zz`) is refused before any route or hook: Fastify's own answer was
 * not an envelope and echoed the path. The path stays out of the log too (a /view/ link is a
 * capability). No `onSend` hook runs here: the headers every answer carries (app.ts) are set here, and
 * `no-store` whatever the path (until 2026-12-06 this answer went without either). No `onResponse`
 * hook runs either: the answer is counted in the request durations here, as an unmatched request
 * (metrics/api.ts; until 2026-12-06 it was not counted at all), timed from this handler's start —
 * the router refuses a URL as soon as the request's head is read.
 */
function frameworkError(err: FastifyError, request: FastifyRequest, reply: FastifyReply) {
  const started = performance.now();
  const { server } = request;
  reply.raw.once("finish", () =>
    server.observeUnrouted?.(request.method, reply.statusCode, (performance.now() - started) / 1000),
  );
  reply.header("x-content-type-options", "nosniff").header("cache-control", "no-store");
  const status = err.statusCode ?? 500;
  if (status >= 500) {
    request.log.error({ code: err.code }, "request failed");
    return reply.status(500).send({ code: "INTERNAL_ERROR", message: PUBLIC_MESSAGES.INTERNAL_ERROR });
  }
  request.log.info({ code: "BAD_REQUEST", cause: err.code }, "request rejected");
  return reply.status(status).send({ code: "BAD_REQUEST", message: PUBLIC_MESSAGES.BAD_REQUEST });
}

/**
 * `Expect: 100-continue` (curl sends it with every body over 1 MiB): Node answered `100 Continue` to
 * every such request before any route or hook ran, so a client with a bad token or a body over the limit
 * sent its whole body to be discarded after the 401 or 413 — and the connection, kept alive, then waited
 * for a body it would never get. Here the interim answer waits until the request has passed routing and
 * authentication (the `onRequest` hooks) and its body is wanted (`preParsing`); an answer before that
 * goes out without it, and Node closes the connection after it (`Connection: close`). A JSON body whose
 * `Content-Length` is over the route's limit is refused the same, unread (Fastify's 413).
 */
/**
 * Room in a multipart body beside its file: up to 10 form fields of at most 1 MiB each (busboy's
 * fieldSize) and the parts' boundaries and headers. A `Content-Length` over ASSAY_MAX_UPLOAD_BYTES plus
 * this cannot hold a file within the limit.
 */
export const MULTIPART_SLACK_BYTES = 11 * 1024 * 1024;

const MULTIPART = /^\s*multipart\/form-data\s*(;|$)/i;

function deferContinue(fastify: FastifyInstance, maxUploadBytes: number): void {
  const awaiting = new WeakSet<http.IncomingMessage>();
  fastify.server.on("checkContinue", (req: http.IncomingMessage, res: http.ServerResponse) => {
    awaiting.add(req);
    fastify.server.emit("request", req, res);
  });
  // Another expectation than 100-continue: Node's own 417 had no body; the same answer in the envelope.
  // Fastify never sees the request, so no hook counts it: counted here as an unmatched request.
  fastify.server.on("checkExpectation", (req: http.IncomingMessage, res: http.ServerResponse) => {
    const started = performance.now();
    res.once("finish", () =>
      fastify.observeUnrouted?.(req.method ?? "", 417, (performance.now() - started) / 1000),
    );
    res.writeHead(417, {
      "content-type": "application/json; charset=utf-8",
      "content-length": Buffer.byteLength(BAD_REQUEST),
      "x-content-type-options": "nosniff",
    });
    res.end(BAD_REQUEST);
  });
  fastify.addHook("preParsing", (request, reply, payload, done) => {
    if (awaiting.delete(request.raw)) {
      const length = Number(request.headers["content-length"]);
      // By its header: request.isMultipart() is false until the multipart parser has run, after this,
      // so every upload over the JSON limit went without its 100 (curl then waits a second and sends).
      const multipart = MULTIPART.test(request.headers["content-type"] ?? "");
      // An upload that cannot fit is refused before its body is asked for (413, the connection
      // closed): it was sent its 100 and read up to the limit, stored, then deleted.
      if (multipart && length > maxUploadBytes + MULTIPART_SLACK_BYTES)
        return done(uploadTooLarge(maxUploadBytes));
      if (multipart || !(length > request.routeOptions.bodyLimit)) reply.raw.writeContinue();
    }
    done(null, payload);
  });
}

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
    // Checked by app.ts, which answers a request without a Host in the envelope.
    http: { requireHostHeader: false },
    routerOptions: { maxParamLength: MAX_PARAM_LENGTH },
    frameworkErrors: frameworkError,
    clientErrorHandler,
    schemaController: { compilersFactory: lazyCompilers({ coerceBodies: false }) },
  });
  deferContinue(fastify, services.config.maxUploadBytes);
  const tokens = new TokenCache();
  // Listens before the event hub does, so an entry is dropped before a stream delivers its event.
  const tasks = new TaskCache();
  // Side by side: each waits at most DB_ANSWER_MS for a database that does not answer.
  await Promise.all([
    tokens.start(services.database.sql, logger),
    tasks.start(services.database.sql, logger),
  ]);
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
