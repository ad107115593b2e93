// HEAD refused on the routes that stream (files, zips, tables, events).
import type { FastifyInstance } from "fastify";

/**
 * HEAD on a route that streams a file, a zip, a table or events: 405, with `Allow: GET`. Fastify's own
 * HEAD route would run the GET handler and read the streamed body to its end to discard it: an output
 * read whole from the store (a full GET from S3) per HEAD, a zip's plan run and its stream destroyed. A
 * truthful HEAD needs what only opening the object tells (whether it is there, its length), and a
 * zip's or a table's length is not known before it is written, so these routes have none. An event
 * stream's HEAD (routes/events.ts) would subscribe and read the task's log for a response without a
 * body, holding the connection until the stream ended.
 */
export function noHead(app: FastifyInstance, url: string, o: { logLevel?: "warn" } = {}) {
  app.head(url, { schema: { hide: true }, ...o }, async (_request, reply) =>
    reply.code(405).header("allow", "GET").send(),
  );
}
