// The HTTP application as a Fastify plugin (fastify/demo style): shared services are a typed
// decorator, routes only validate and delegate.
import multipart from "@fastify/multipart";
import { fastifySSE } from "@fastify/sse";
import swagger from "@fastify/swagger";
import swaggerUi from "@fastify/swagger-ui";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import type { Registry } from "prom-client";
import type { TokenCache } from "../auth/token-cache.ts";
import type { Config } from "../config.ts";
import type { Database } from "../db/client.ts";
import { DatabaseGate, type GateOptions } from "../db/gate.ts";
import type { EventHub } from "../events/hub.ts";
import { apiMetrics } from "../metrics/api.ts";
import { processRegistry } from "../metrics/registry.ts";
import type { ObjectStore } from "../storage/store.ts";
import type { TaskCache } from "../tasks/task-cache.ts";
import { requireBearer } from "./auth.ts";
import { errorHandler } from "./error-handler.ts";
import { ApiError } from "./errors.ts";
import { headRefused } from "./no-head.ts";
import { integerQueryFields } from "./query-check.ts";
import { analysisTypeRoutes } from "./routes/analysis-types.ts";
import { dashboardRoutes, meRoutes } from "./routes/dashboard.ts";
import { downloadRoutes, viewRoutes } from "./routes/downloads.ts";
import { eventRoutes } from "./routes/events.ts";
import { fileRoutes } from "./routes/files.ts";
import { healthRoutes } from "./routes/health.ts";
import { taskRoutes } from "./routes/tasks.ts";
import { ErrorBody, NoQuery } from "./schemas.ts";

export interface Services {
  config: Config;
  database: Database;
  storage: ObjectStore;
  /** Fans task events out to SSE streams; started and stopped by whoever builds the app. */
  events: EventHub;
  /** Authenticated tokens for a few seconds (absent: every request asks the database). */
  tokens?: TokenCache;
  /** Tasks as GET /api/analysis-tasks/:id answers them, for up to a second (absent: never cached). */
  tasks?: TaskCache;
  /** Migrations the code expects; /readyz compares the database against it. */
  expectedMigrations: number;
  /** Served at /metrics; `assay all` shares it with the worker. Default: a new one. */
  metrics?: Registry;
  /** The database gate's timings (tests shorten them). Default: src/db/gate.ts's constants. */
  databaseGate?: GateOptions;
}

declare module "fastify" {
  interface FastifyInstance {
    services: Services;
    /** Whether requests that need the database are refused now (the database does not answer). */
    databaseGate: DatabaseGate;
  }
}

/**
 * Cuts off a request whose body stops coming: from the request's start until its body has been
 * received whole (`complete`, whether or not anything has read it yet), the socket must take a byte
 * at least every `idleMs`; else it is destroyed. Without it an upload (or a JSON body) that stalled
 * midway held its connection — and an upload the part it had stored — for as long as its client kept
 * the socket open (Node's requestTimeout is off under Fastify). A body the server stops reading (a
 * store slow to take it) stops the socket's reading too, and is cut off the same after as long.
 *
 * A timer of the request's own, reading `socket.bytesRead`: the socket's inactivity timer is Node's
 * (its keep-alive timeout), shared by every request on the connection — clearing it at one body's end
 * left an idle socket after an early answer (a 401 before the body) with no timeout at all, and
 * cleared the timer a pipelined request behind it had armed (a review).
 */
function bodyIdleTimeout(request: FastifyRequest, idleMs: number) {
  const raw = request.raw;
  const socket = raw.socket as (typeof raw.socket & { bytesRead?: number }) | null;
  // A GET or a bodiless POST (fetch sends `Content-Length: 0`) has nothing to time.
  const length = raw.headers["content-length"];
  const hasBody = (length !== undefined && length !== "0") || raw.headers["transfer-encoding"] !== undefined;
  // `inject` (tests) hands a request without a socket of its own.
  if (!hasBody || raw.complete || typeof socket?.bytesRead !== "number") return;
  let seen = socket.bytesRead;
  let progressAt = performance.now();
  const timer = setInterval(
    () => {
      if (raw.complete || socket.destroyed) return clearInterval(timer);
      const now = performance.now();
      if (socket.bytesRead !== seen) {
        seen = socket.bytesRead;
        progressAt = now;
      } else if (now - progressAt >= idleMs) {
        clearInterval(timer);
        request.log.info({ idleMs }, "request cut off: its body made no progress for too long");
        socket.destroy();
      }
    },
    Math.max(100, Math.floor(idleMs / 4)),
  );
  timer.unref();
  raw.once("close", () => clearInterval(timer));
}

/**
 * What Node's parser lets through and RFC 9112 refuses (400): a request target of `*` but for OPTIONS
 * (the asterisk form is its alone; the router took `GET *` for `/` and answered with the dashboard), an
 * HTTP/1.1 request without a Host field, and a Host sent more than once. Node's own answer to a missing
 * Host was a bare 400 without an envelope: its check is off (server.ts) and made here instead.
 */
function malformedRequest(raw: FastifyRequest["raw"]): string | undefined {
  if (raw.url === "*" && raw.method !== "OPTIONS") return "a request target of * but for OPTIONS";
  // Counted in the raw list (Node keeps the first of a repeated Host in `headers`): every request
  // passes here, and `headersDistinct` builds an object of every header to answer it.
  let hosts = 0;
  const names = raw.rawHeaders;
  for (let i = 0; i < names.length; i += 2) {
    const name = names[i] as string;
    if (name.length === 4 && name.toLowerCase() === "host") hosts++;
  }
  if (hosts > 1 || (hosts === 0 && raw.httpVersion === "1.1")) return "a Host field missing or repeated";
  return undefined;
}

/**
 * What every answer carries unless its route set its own: `nosniff` (a JSON body holding a user's file
 * name is never read as HTML or script), and under /api `no-store`, so neither a shared proxy nor the
 * browser's disk cache keeps a user's tasks, files or outputs after they signed out (until 2026-12-06
 * the API's answers said nothing on either). An event stream keeps the `no-cache` it sets itself.
 */
const API_PATH = /^\/api(?:[/?]|$)/;

function defaultHeaders(reply: FastifyReply, cacheControl?: string): void {
  if (!reply.hasHeader("x-content-type-options")) reply.header("x-content-type-options", "nosniff");
  if (cacheControl !== undefined && !reply.hasHeader("cache-control"))
    reply.header("cache-control", cacheControl);
}

/** Every method a route here may have, in the order `Allow` lists them. */
const METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] as const;

/**
 * The methods some route answers at `url` (a request's, its query included), for the 405 of a path
 * that has routes but none for the request's method (`DELETE /api/analysis-tasks/1`, `PUT /api/files`):
 * until 2026-12-06 that was the 404 of a path that does not exist. Asked of the router only when no
 * route matched, so a request that has a route pays nothing. HEAD is left out where its route only
 * refuses it (no-head.ts).
 */
function allowedMethods(fastify: FastifyInstance, url: string): string[] {
  // The asterisk form (`OPTIONS *`) names no path: the router takes it for a bad URL, and Fastify's
  // answer to one looks like a route of every method.
  if (!url.startsWith("/")) return [];
  return METHODS.filter(
    (method) =>
      fastify.findRoute({ method, url }) !== null && !(method === "HEAD" && headRefused(fastify, url)),
  );
}

export async function app(fastify: FastifyInstance, opts: { services: Services }) {
  fastify.decorate("services", opts.services);
  const gate = new DatabaseGate(opts.services.database, fastify.log, opts.services.databaseGate);
  fastify.decorate("databaseGate", gate);
  fastify.addHook("onClose", async () => gate.stop());
  fastify.addHook("onRequest", (request, _reply, done) => {
    const malformed = malformedRequest(request.raw);
    if (malformed !== undefined)
      return done(new ApiError(400, "BAD_REQUEST", undefined, new Error(`refused: ${malformed}`)));
    bodyIdleTimeout(request, opts.services.config.uploadIdleMs);
    done();
  });
  // A callback, not an async hook: it is on every answer's path, and an async one costs a promise each.
  fastify.addHook("onSend", (request, reply, payload, done) => {
    // The route it matched, not the address as sent: `/%61pi/me` is routed to `/api/me`.
    defaultHeaders(reply, API_PATH.test(request.routeOptions.url ?? request.url) ? "no-store" : undefined);
    done(null, payload);
  });
  fastify.decorateRequest("principal", undefined);
  fastify.addSchema(ErrorBody);

  await fastify.register(swagger, {
    openapi: {
      info: {
        title: "Assay",
        description: "Runs whitelisted analysis programs over uploaded data files.",
        version: "0.1.0",
      },
      components: { securitySchemes: { bearer: { type: "http", scheme: "bearer" } } },
    },
  });
  await fastify.register(swaggerUi, {
    routePrefix: "/docs",
    // Its page holds the token a user gives "Authorize": never framed by another site (clickjacking),
    // and its address never sent on (it went without either until 2026-12-06).
    uiHooks: {
      onRequest: (_request, reply, done) => {
        reply.header("content-security-policy", "frame-ancestors 'none'");
        reply.header("x-frame-options", "DENY");
        reply.header("referrer-policy", "no-referrer");
        done();
      },
    },
  });
  await fastify.register(multipart, {
    // One byte above ours: the store's meter rejects an upload past the limit first (413, nothing
    // stored); at exactly this limit @fastify/multipart would truncate the stream instead.
    limits: { fileSize: opts.services.config.maxUploadBytes + 1, files: 1, fields: 10, parts: 11 },
    // The file name as sent: storedFileName() takes its base name (busboy's cut at a backslash too,
    // and `back\slash.csv` was named `slash.csv`).
    preservePath: true,
  });

  await fastify.register(fastifySSE, { heartbeatInterval: opts.services.config.sseHeartbeatMs });
  // Ends every SSE stream when the server closes, so clients reconnect (to another instance) and resume.
  const streams = new AbortController();
  fastify.addHook("preClose", async () => streams.abort());

  const registry = opts.services.metrics ?? processRegistry();
  apiMetrics(fastify, opts.services.database.sql, opts.services.events, registry);
  fastify.get("/metrics", { schema: { hide: true } }, async (_request, reply) => {
    reply.header("content-type", registry.contentType);
    return registry.metrics();
  });

  fastify.setErrorHandler(errorHandler);
  fastify.setNotFoundHandler((request, reply) => {
    const allowed = allowedMethods(fastify, request.url);
    // A route's own callNotFound (a /ui/ file that is not there) is the route's 404, not a 405.
    if (allowed.length === 0 || allowed.includes(request.method)) throw new ApiError(404, "NOT_FOUND");
    reply.header("allow", allowed.join(", "));
    throw new ApiError(405, "METHOD_NOT_ALLOWED");
  });

  await fastify.register(healthRoutes);
  await fastify.register(dashboardRoutes);
  await fastify.register(viewRoutes);
  await fastify.register(
    async (api) => {
      api.addHook("onRoute", (route) => {
        if (route.schema?.querystring === undefined) route.schema = { ...route.schema, querystring: NoQuery };
        // What any route may answer besides its own (the route's entries win): 503 while the database
        // does not answer (the gate), 415 for a body of a type no parser takes.
        const methods = [route.method].flat();
        route.schema.response = {
          503: ErrorBody,
          ...(methods.includes("POST") ? { 415: ErrorBody } : {}),
          ...(route.schema.response as object | undefined),
        };
        // Checked by the scope's onRequest hook (auth.ts, checkDecimalQuery), not a hook of its own.
        const integers = integerQueryFields(route.url, route.schema.querystring);
        if (integers.length > 0) route.config = { ...route.config, integerQuery: integers };
      });
      requireBearer(api);
      await api.register(meRoutes);
      await api.register(fileRoutes);
      await api.register(taskRoutes);
      await api.register(analysisTypeRoutes);
      await api.register(eventRoutes, { streams: streams.signal });
      await api.register(downloadRoutes);
    },
    { prefix: "/api" },
  );
}
