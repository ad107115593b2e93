// HEAD refused on the routes that stream (files, zips, tables, events).
import type { FastifyInstance } from "fastify";

/**
 * The paths of the routes given to noHead, as their segments (`:name` a parameter), per server (every
 * encapsulated instance shares its root's): what a 405 for another method leaves out of `Allow`
 * (app.ts), since their HEAD route is there only to refuse.
 */
const refused = new WeakMap<object, string[][]>();

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
  const paths = refused.get(app.server) ?? [];
  refused.set(app.server, paths);
  paths.push(`${app.prefix}${url}`.split("/"));
  app.head(url, { schema: { hide: true }, ...o }, async (_request, reply) =>
    reply.code(405).header("allow", "GET").send(),
  );
}

/**
 * Whether `url` (a request's, its query included) is the path of a route given to noHead. Its
 * segments are decoded as the router decodes them; one that cannot be is no match.
 */
export function headRefused(app: FastifyInstance, url: string): boolean {
  const paths = refused.get(app.server);
  if (paths === undefined) return false;
  const end = url.indexOf("?");
  const segments = (end === -1 ? url : url.slice(0, end)).split("/");
  return paths.some(
    (path) =>
      path.length === segments.length &&
      path.every((p, i) => {
        if (p.startsWith(":")) return true;
        try {
          return decodeURIComponent(segments[i] as string) === p;
        } catch {
          return false;
        }
      }),
  );
}
