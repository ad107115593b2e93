// The dashboard: static ES modules from web/ at `/` (no bundler, no CDN), and `GET /api/me` for the
// signed-in user. Preact, its hooks and htm are served from node_modules under /ui/vendor/; the hooks
// module imports "preact" by its bare name, which a browser cannot resolve without an import map (an
// inline script, which the CSP forbids), so that one specifier is rewritten to the served path.
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import fastifyStatic from "@fastify/static";
import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import type { FastifyReply } from "fastify";
import { Type } from "typebox";
import { principalOf } from "../auth.ts";
import { Envelope, errorResponses, ok } from "../schemas.ts";

export const WEB_ROOT = path.resolve(import.meta.dirname, "../../../web");

/**
 * The dashboard's policy: scripts only from this origin (no inline script, no eval), API calls only to
 * it; images from outputs are shown from blob: URLs, HTML reports in a sandboxed frame from a view link
 * (/view/…, served with a policy of its own: a blob: document would inherit this one and lose its
 * styles).
 */
export const DASHBOARD_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' blob: data:",
  "connect-src 'self'",
  "frame-src 'self'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join("; ");

/**
 * The dashboard's headers, on the page and on every file under /ui/ — /ui/index.html is the page too,
 * and it went without `no-referrer` and `X-Frame-Options` until 2026-12-06.
 */
const SECURITY_HEADERS: [string, string][] = [
  ["content-security-policy", DASHBOARD_CSP],
  ["x-content-type-options", "nosniff"],
  ["referrer-policy", "no-referrer"],
  ["x-frame-options", "DENY"],
];

function secure(reply: FastifyReply): void {
  for (const [name, value] of SECURITY_HEADERS) reply.header(name, value);
}

const require = createRequire(import.meta.url);
/** A file beside a package entry's CommonJS build (the packages do not export their dist/ paths). */
const moduleFile = (entry: string, file: string) => path.join(path.dirname(require.resolve(entry)), file);

/** The vendor modules, read once: name → source. */
function vendorModules(): Map<string, string> {
  const preact = fs.readFileSync(moduleFile("preact", "preact.module.js"), "utf8");
  const hooks = fs
    .readFileSync(moduleFile("preact/hooks", "hooks.module.js"), "utf8")
    .replace(/from\s*["']preact["']/g, 'from"./preact.js"');
  if (/from\s*["'][^./]/.test(hooks))
    throw new Error("preact/hooks imports a bare specifier we do not serve");
  const htm = fs.readFileSync(moduleFile("htm", "htm.module.js"), "utf8");
  return new Map([
    ["preact.js", preact],
    ["hooks.js", hooks],
    ["htm.js", htm],
  ]);
}

const MeBody = Type.Object({ userId: Type.String(), name: Type.String(), role: Type.String() });

/** `GET /api/me`, registered inside the authenticated /api scope. */
export const meRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    "/me",
    {
      schema: {
        summary: "The user the token belongs to",
        tags: ["users"],
        security: [{ bearer: [] }],
        response: { 200: Envelope(MeBody), ...errorResponses },
      },
    },
    async (request) => {
      const p = principalOf(request);
      return ok({ userId: String(p.userId), name: p.name, role: p.role });
    },
  );
};

export const dashboardRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const vendor = vendorModules();
  const index = fs.readFileSync(path.join(WEB_ROOT, "index.html"));

  await app.register(fastifyStatic, {
    root: WEB_ROOT,
    prefix: "/ui/",
    index: false,
    wildcard: true,
    // Modules change with the code: revalidate every time (ETag), never serve stale code.
    cacheControl: false,
    setHeaders: (res) => {
      for (const [name, value] of SECURITY_HEADERS) res.setHeader(name, value);
      res.setHeader("cache-control", "no-cache");
    },
  });

  app.get("/", { schema: { hide: true } }, async (_request, reply) => {
    secure(reply);
    reply.header("cache-control", "no-cache");
    return reply.type("text/html; charset=utf-8").send(index);
  });

  app.get<{ Params: { name: string } }>(
    "/ui/vendor/:name",
    { schema: { hide: true } },
    async (request, reply) => {
      const source = vendor.get(request.params.name);
      if (source === undefined) return reply.callNotFound();
      secure(reply);
      reply.header("cache-control", "public, max-age=3600");
      return reply.type("text/javascript; charset=utf-8").send(source);
    },
  );
};
