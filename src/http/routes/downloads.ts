// Downloads: one run's output file, or a streamed zip of every succeeded run's outputs; and the links
// that let a browser save them itself (view-links.ts).
import { createHash } from "node:crypto";
import path from "node:path";
import { Readable } from "node:stream";
import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { type TObject, type TSchema, Type } from "typebox";
import { type WatchedGrant, watchToken } from "../../auth/token-watch.ts";
import { type Authenticated, type Principal, wallClockDeadline } from "../../auth/tokens.ts";
import {
  type DownloadTarget,
  downloadLinkCheck,
  downloadLinkPath,
  type ViewTarget,
  viewLinkCheck,
  viewLinkPath,
} from "../../auth/view-links.ts";
import { isDatabaseError, type Sql } from "../../db/client.ts";
import { databaseNow } from "../../db/clock.ts";
import { SAFE_NAME } from "../../runner/outputs.ts";
import {
  type ByteRange,
  ObjectMissingError,
  type ObjectStore,
  RangeNotSatisfiableError,
  StoreUnavailableError,
  storeFault,
} from "../../storage/store.ts";
import {
  type DownloadPlan,
  outputKeyOf,
  type RunOutput,
  runDownloadPlan,
  runOutputFiles,
  runOutputsPlan,
  taskDownloadPlan,
  taskExists,
  type ZipRun,
  zipPages,
} from "../../tasks/outputs.ts";
import { taskVisible } from "../../tasks/read.ts";
import { RESULTS_FILE_NAME, resultMetricKeys, resultsCsv } from "../../tasks/results.ts";
import { bearerHashOf, principalOf } from "../auth.ts";
import { ApiError, databaseUnavailable, notFound } from "../errors.ts";
import { noHead } from "../no-head.ts";
import { byteResponses, Envelope, ErrorBody, errorResponses, IdParam, isId, ok } from "../schemas.ts";
import { ZipWriter } from "../zip.ts";

const OutputBody = Type.Object({
  name: Type.String(),
  sizeBytes: Type.Integer({ minimum: 0 }),
  contentType: Type.String(),
});

/** A link the API made: a path on its own origin, and when it stops working. */
const LinkBody = Envelope(
  Type.Object({ url: Type.String(), expiresAt: Type.String({ format: "date-time" }) }),
);

const CONTENT_TYPES: Record<string, string> = {
  ".json": "application/json",
  ".csv": "text/csv; charset=utf-8",
  ".html": "text/html; charset=utf-8",
  ".png": "image/png",
  ".svg": "image/svg+xml",
  ".txt": "text/plain; charset=utf-8",
  ".md": "text/markdown; charset=utf-8",
};

/** The Content-Type of an output, by its extension (outputs are limited to these). */
export const contentTypeOf = (name: string) =>
  CONTENT_TYPES[path.extname(name).toLowerCase()] ?? "application/octet-stream";

/** `attachment` (or `inline`) with an ASCII fallback and the exact UTF-8 name (RFC 6266 / 5987). */
export function contentDisposition(name: string, kind: "attachment" | "inline" = "attachment"): string {
  const ascii = name.replace(/[^\x20-\x7e]|["\\]/g, "_");
  return `${kind}; filename="${ascii}"; filename*=UTF-8''${encodeURIComponent(name)}`;
}

/**
 * How long a download may hand its client nothing before it is cut off: the socket's inactivity (no
 * write completed, no byte read). A client that stops reading — a browser's paused download, a hung
 * program — otherwise kept its connection and what the download holds (a local file's descriptor, or
 * one of the S3 client's 50 pooled sockets: fifty paused downloads would leave none for any other
 * store request of the API) for as long as it kept the connection; a store that stops sending
 * mid-object (its body has no timeout) is cut off the same. Longer than the store's 120 s wait for a
 * response, so a slow open between a zip's entries is not. The kernel wakes a writer of a full socket
 * only once a good part of its send buffer (hundreds of KB) has gone, so a client reading below a few
 * KB/s looks stalled too.
 */
export const DOWNLOAD_STALL_MS = 5 * 60_000;

/**
 * Arms what bounds a response about to be streamed: the stall bound (DOWNLOAD_STALL_MS), and the cut-off
 * when the token that authorised it stops being valid (cutOffWhenTokenEnds).
 */
type Guard = (reply: FastifyReply) => void;

/** The guard of a response authorised by `grant` (a bearer token, or the token of a link). */
function guardOf(app: FastifyInstance, grant: WatchedGrant): Guard {
  return (reply) => {
    cutOffWhenStalled(reply);
    cutOffWhenTokenEnds(app, reply, grant);
  };
}

/** The grant of a request authenticated by its bearer token. */
function bearerGrant(request: FastifyRequest): WatchedGrant {
  const { tokenId, role, deadline } = principalOf(request);
  return { tokenId, role, deadline, ticket: request.tokenTicket };
}

/**
 * Cuts the response off when the token that authorised it stops being valid while it is sent — revoked,
 * its user's role changed, or expired (token-watch.ts) — as later requests with it are refused. The
 * connection is destroyed, not the response ended: a body with a Content-Length arrives short, a chunked
 * one (a zip, results.csv) without its last chunk, so no client takes it for a complete file. The watch
 * stops however the response ends (sent, client gone, broken off).
 */
function cutOffWhenTokenEnds(app: FastifyInstance, reply: FastifyReply, grant: WatchedGrant): void {
  const raw = reply.raw;
  const stop = watchToken(
    app.services.database.sql,
    app.services.tokens,
    grant,
    (why) => {
      reply.log.info({ tokenId: grant.tokenId, why }, "download cut off: its token is no longer valid");
      raw.destroy();
    },
    {
      onCheckFailed: (err) =>
        reply.log.warn(
          { err, tokenId: grant.tokenId },
          "could not check the tokens of the downloads under way again; trying again",
        ),
    },
  );
  raw.once("close", stop);
  if (raw.destroyed || raw.closed) stop();
}

/** Arms the stall bound (DOWNLOAD_STALL_MS) for the response about to be streamed. */
function cutOffWhenStalled(reply: FastifyReply): void {
  const raw = reply.raw;
  // `inject` (tests) answers without a socket of its own.
  if (typeof raw.socket?.setTimeout !== "function") return;
  // The response's own listener: Node replaces the socket's timer with its keep-alive timeout once
  // the response is done, so this never outlives it on an idle connection.
  raw.setTimeout(DOWNLOAD_STALL_MS, () => {
    reply.log.info("download cut off: its client took nothing for too long");
    raw.destroy();
  });
}

/**
 * A recorded output that is not there. When its task is gone too, retention deleted both between the
 * plan and the read: a 404, as if the request had come a moment later. Otherwise the store lost it (a
 * restore from an older backup, an object deleted by hand): a 500 ANALYSIS_OUTPUT_MISSING, logged at
 * error level with the run and the key, before any byte is sent — the server's fault, but one the
 * client is told (until 2026-12-06 it was a bare INTERNAL_ERROR). A run row that names no servable
 * output at all (not `usable`: a bug or a hand edit, never written so) stays an INTERNAL_ERROR.
 */
async function outputMissing(
  reply: FastifyReply,
  output: RunOutput,
  taskExists: () => Promise<boolean>,
  o: { err?: unknown; file?: string | undefined } = {},
): Promise<ApiError> {
  if (!(await taskExists())) return notFound("ANALYSIS_TASK_NOT_FOUND");
  const fields = {
    err: o.err,
    runId: output.runId,
    outputKey: output.outputKey,
    ...(o.file === undefined ? {} : { file: o.file }),
  };
  if (!output.usable) {
    reply.log.error(fields, "a succeeded run's output record names no output that can be served");
    return new ApiError(500, "INTERNAL_ERROR");
  }
  reply.log.error(fields, "a succeeded run's output is missing");
  return new ApiError(500, "ANALYSIS_OUTPUT_MISSING");
}

async function send(
  sql: Sql,
  store: ObjectStore,
  plan: DownloadPlan,
  reply: FastifyReply,
  taskExists: () => Promise<boolean>,
  guard: Guard,
) {
  if (plan.kind === "not-found") throw notFound("ANALYSIS_TASK_NOT_FOUND");
  if (plan.kind === "not-ready") throw new ApiError(409, "ANALYSIS_TASK_NOT_READY");
  reply.header("x-content-type-options", "nosniff");
  if (plan.kind === "single") return sendObject(store, plan.output, reply, taskExists, guard);
  // The first page of runs and their files is read before anything is sent: a recorded output missing
  // from it is a logged 500 (or a 404 when retention deleted the task meanwhile), not a zip without it.
  const { taskId } = plan;
  const pages = zipPages(sql, store, taskId);
  let first: IteratorResult<ZipRun[]>;
  try {
    first = await pages.next();
    if (first.done && !(await taskExists())) throw notFound("ANALYSIS_TASK_NOT_FOUND");
    const missing = first.done ? undefined : first.value.find((r) => r.names === null);
    if (missing) throw await outputMissing(reply, missing.output, taskExists, { file: missing.missing });
  } catch (err) {
    await pages.return(undefined);
    // Retention may delete the task between the plan and its first page: a 404, as for a later request.
    if (!(err instanceof ApiError) && !(await taskExists())) throw notFound("ANALYSIS_TASK_NOT_FOUND");
    // The first page's listing failed: a store that fails its check too is a 503 (storeFault).
    if (!(err instanceof ApiError) && !isDatabaseError(err)) throw await storeFault(store, err);
    throw err;
  }
  const keys = await resultMetricKeys(sql, taskId);
  async function* entries(): AsyncGenerator<ZipEntry> {
    yield { name: RESULTS_FILE_NAME, open: async () => resultsCsv(sql, taskId, keys) };
    for (let page = first; !page.done; page = await pages.next()) {
      for (const run of page.value) {
        // A later page's missing output: the zip is broken off (logged), never ended without it.
        if (run.names === null) {
          const file = run.missing ?? run.output.outputFileName;
          throw new ZipOutputMissing(outputKeyOf(run.output, file), runOf(run.output, file));
        }
        for (const [i, name] of run.names.entries()) {
          const key = outputKeyOf(run.output, name);
          yield {
            name: `${run.folder}/${run.entries[i] as string}`,
            open: async () => (await store.open(key)).stream,
            from: runOf(run.output, name),
          };
        }
      }
    }
  }
  reply.header("content-type", "application/zip");
  reply.header("content-disposition", contentDisposition(`task-${taskId}.zip`));
  guard(reply);
  return reply.send(zipStream(entries(), reply, plan.finishedAt, taskId));
}

/** Where a zip entry is read from, for the log: its run, the run's output key and the file. */
interface EntryOrigin {
  runId: string;
  outputKey: string;
  file: string;
}

const runOf = (output: RunOutput, file: string): EntryOrigin => ({
  runId: output.runId,
  outputKey: output.outputKey,
  file,
});

/** A run on a later page of a zip whose recorded output the store does not hold. */
class ZipOutputMissing extends ObjectMissingError {
  readonly origin: EntryOrigin;

  constructor(key: string, origin: EntryOrigin) {
    super(key);
    this.origin = origin;
  }
}

/**
 * The name a download plan saves under: its one file's, or undefined for a zip. Refused as its download
 * would be: 404 for a task or run not found, 409 for one not ready, 500 for a recorded output unusable.
 */
async function plannedName(
  plan: DownloadPlan,
  reply: FastifyReply,
  taskExists: () => Promise<boolean>,
): Promise<string | undefined> {
  if (plan.kind === "not-found") throw notFound("ANALYSIS_TASK_NOT_FOUND");
  if (plan.kind === "not-ready") throw new ApiError(409, "ANALYSIS_TASK_NOT_READY");
  if (plan.kind === "zip") return undefined;
  if (!plan.output.usable) throw await outputMissing(reply, plan.output, taskExists);
  return plan.output.outputFileName;
}

/**
 * Refuses a link to one output the store does not hold with the 500 ANALYSIS_OUTPUT_MISSING its
 * download would get, before the link is made: the dashboard's buttons make a link and send the
 * browser to it, which shows a failed download without the message (until 2026-12-06 the link was
 * made from the record alone). One stat (a HEAD on S3). A zip's link is not checked: its runs are
 * checked a page at a time as it is sent.
 */
async function heldOrMissing(
  store: ObjectStore,
  output: RunOutput,
  name: string,
  reply: FastifyReply,
  taskExists: () => Promise<boolean>,
): Promise<void> {
  try {
    await store.stat(outputKeyOf(output, name));
  } catch (err) {
    // S3 answers a HEAD in a bucket that is not there with a bare 404, as for a missing object: an
    // outage is not to be reported as a lost output. The store's own check tells them apart (one
    // listing of a key, on this path only): a store that fails it is a 503 NOT_READY. Not a local
    // store's for a missing object: its check makes the data folder when it is missing.
    const missing = err instanceof ObjectMissingError;
    const fault = missing && store.localPath ? err : await storeFault(store, err);
    if (fault instanceof StoreUnavailableError || !missing) throw fault;
    throw await outputMissing(reply, output, taskExists, { err, file: name });
  }
}

/**
 * One output, opened before the headers are sent: an object that is gone is a logged 500. The stream
 * is released when it ends or when Fastify destroys it because the client left. Resumable: a strong
 * ETag, `If-None-Match` (304), one `Range` (206, or 416 when it selects no byte), `If-Range`. A request
 * with a condition (`If-None-Match`, or `If-Range` with a `Range`) asks the store for the object's
 * size first (a HeadObject on S3) and opens a body only to send it: a 304 opens none, and an `If-Range`
 * that does not match opens the whole object and no range. Without one, the object is opened at once.
 */
async function sendObject(
  store: ObjectStore,
  output: RunOutput,
  reply: FastifyReply,
  taskExists: () => Promise<boolean>,
  guard: Guard,
  name = output.outputFileName,
  disposition: "attachment" | "inline" = "attachment",
) {
  if (!output.usable) throw await outputMissing(reply, output, taskExists);
  const key = outputKeyOf(output, name);
  const { headers } = reply.request;
  // A failure that is no missing object: the store's check says whether the store is away (a 503
  // NOT_READY the client may retry) or this request failed (a 500).
  const missing = async (err: unknown): Promise<never> => {
    throw err instanceof ObjectMissingError
      ? await outputMissing(reply, output, taskExists, { err })
      : await storeFault(store, err);
  };
  let range = byteRange(headers.range);
  const ifRange = range === undefined ? undefined : headers["if-range"];
  if (headers["if-none-match"] !== undefined || ifRange !== undefined) {
    const { size } = await store.stat(key).catch(missing);
    const etag = etagOf(key, size);
    if (noneMatch(headers["if-none-match"], etag))
      return reply.code(304).header("accept-ranges", "bytes").header("etag", etag).send();
    // A range of another version than the client holds: the whole object instead (RFC 9110 §13.1.5).
    if (ifRange !== undefined && ifRange !== etag) range = undefined;
  }
  const opened = await store
    .open(key, range ? { range } : {})
    .catch((err: unknown) => (err instanceof RangeNotSatisfiableError ? err : missing(err)));
  reply.header("accept-ranges", "bytes");
  reply.header("etag", etagOf(key, opened.size));
  if (opened instanceof RangeNotSatisfiableError) {
    reply.header("content-range", `bytes */${opened.size}`);
    throw new ApiError(416, "RANGE_NOT_SATISFIABLE");
  }
  const { stream, size } = opened;
  reply.header("content-type", contentTypeOf(name));
  reply.header("content-disposition", contentDisposition(name, disposition));
  if (opened.range) {
    const { start, end } = opened.range;
    reply.code(206);
    reply.header("content-range", `bytes ${start}-${end}/${size}`);
    reply.header("content-length", end - start + 1);
  } else reply.header("content-length", size);
  guard(reply);
  return reply.send(stream);
}

/**
 * The ETag of an object: from its key and size, which never change for a key (an output's key names
 * its attempt, and an object is written once), so it is strong. Hashed: the key is not the client's.
 */
const etagOf = (key: string, size: number) =>
  `"${createHash("sha256").update(`${key}\0${size}`).digest("base64url").slice(0, 27)}"`;

/** Whether `If-None-Match` names `etag` (weak comparison) or is `*`. */
function noneMatch(header: string | undefined, etag: string): boolean {
  if (header === undefined) return false;
  return header.split(",").some((t) => {
    const tag = t.trim();
    return tag === "*" || tag.replace(/^W\//, "") === etag;
  });
}

/** Digits as a number, at most a safe integer (a larger one is past any object's end). */
const digits = (s: string) => Math.min(Number(s), Number.MAX_SAFE_INTEGER);

/**
 * The one range of `Range: bytes=…`; undefined when there is none, it is malformed, its unit is not
 * bytes, or it names several ranges — the whole object is sent then, as RFC 9110 §14.2 allows.
 */
function byteRange(header: string | undefined): ByteRange | undefined {
  const m = header === undefined ? null : /^bytes[ \t]*=[ \t]*(.*)$/i.exec(header.trim());
  if (!m) return undefined;
  // A list may hold empty elements (`bytes=0-9,`): ranges are what is between its commas.
  const specs = (m[1] as string)
    .split(",")
    .map((r) => r.trim())
    .filter((r) => r !== "");
  if (specs.length !== 1) return undefined;
  const r = /^(?:(\d+)-(\d*)|-(\d+))$/.exec(specs[0] as string);
  if (!r) return undefined;
  if (r[3] !== undefined) return { suffix: digits(r[3]) };
  const start = digits(r[1] as string);
  if (r[2] === "") return { start };
  const end = digits(r[2] as string);
  return end < start ? undefined : { start, end };
}

/** A task's results.csv, streamed (see GET …/results.csv). */
async function sendResults(
  sql: Sql,
  principal: Principal,
  taskId: string,
  reply: FastifyReply,
  guard: Guard,
) {
  if (!isId(taskId) || !(await taskVisible(sql, principal, taskId))) {
    throw notFound("ANALYSIS_TASK_NOT_FOUND");
  }
  const keys = await resultMetricKeys(sql, taskId);
  reply.header("content-type", "text/csv; charset=utf-8");
  reply.header("content-disposition", contentDisposition(`task-${taskId}-results.csv`));
  reply.header("x-content-type-options", "nosniff");
  const csv = resultsCsv(sql, taskId, keys);
  // A page that cannot be read mid-stream, or a task that retention deleted between pages
  // (resultLines checks it with every page), breaks the response off — never a complete-looking
  // truncated table; Fastify destroys the connection, this says why.
  csv.once("error", (err) => reply.log.error({ err, taskId }, "results.csv broken off"));
  guard(reply);
  return reply.send(csv);
}

interface ZipEntry {
  /** Its path inside the zip. */
  name: string;
  /** Opens its content (an object of the store, or the results table), when its turn comes. */
  open: () => Promise<Readable>;
  /** The run output it is read from (not the results table's), named in the log if it cannot be. */
  from?: EntryOrigin;
}

/**
 * A zip of `entries`, streamed: one entry's content is read at a time, opened only when its turn comes,
 * and the entries themselves are made page by page as the zip is read (see tasks/outputs.ts zipPages),
 * so a zip of any size holds one page of runs, one object stream, a few chunks, and the central
 * directory's ~80 bytes per entry. Every way it can end is handled here:
 * - an entry that cannot be read (an output deleted by retention mid-download, say, or missing from a
 *   later page of runs) breaks the response off — the client sees a failed transfer, never a
 *   complete-looking truncated zip — and is logged at error level with the task, and the run, its
 *   output key and the file when an output was being read; it never becomes an uncaught exception;
 * - a client that goes away (Fastify destroys the returned stream) ends the generator, which releases
 *   the object being read.
 */
function zipStream(
  entries: AsyncGenerator<ZipEntry>,
  reply: FastifyReply,
  mtime: Date,
  taskId: string,
): Readable {
  const zip = new ZipWriter({ mtime });
  // The output being opened or read, for the log should it fail (none between entries).
  let from: EntryOrigin | undefined;
  // The object being read. A client that leaves while it is stalled (an S3 body on a half-dead
  // connection) must release it at once: the generator's return() would only be seen at its next
  // yield, which a stalled read never reaches.
  let reading: Readable | undefined;
  let clientGone = false;
  let ended = false;
  reply.raw.once("close", () => {
    if (ended) return;
    clientGone = true;
    reading?.destroy();
  });
  async function* bytes(): AsyncGenerator<Buffer> {
    try {
      for await (const entry of entries) {
        if (clientGone) return;
        from = entry.from;
        reading = await entry.open();
        if (clientGone) {
          reading.destroy();
          return;
        }
        yield* zip.entry(entry.name, reading);
        reading = undefined;
        from = undefined;
      }
      yield* zip.end();
      ended = true;
    } catch (err) {
      if (!clientGone) {
        const at = err instanceof ZipOutputMissing ? err.origin : from;
        reply.log.error({ err, taskId, ...at }, "zip download broken off: an output could not be read");
      }
      throw err;
    } finally {
      reading?.destroy();
      await entries.return(undefined);
    }
  }
  return Readable.from(bytes(), { objectMode: false });
}

export const downloadRoutes: FastifyPluginAsyncTypebox = async (app) => {
  // 416: a Range that selects no byte of a file (see sendObject).
  const responses = { 409: ErrorBody, 416: ErrorBody, ...errorResponses };

  noHead(app, "/analysis-tasks/:taskId/download");
  app.get(
    "/analysis-tasks/:taskId/download",
    {
      exposeHeadRoute: false,
      schema: {
        summary: "The output: the file itself for a one-file task, else a zip with a folder per input file",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam }),
        response: {
          ...byteResponses(
            "The one run's output file (resumable), or a zip of every succeeded run's outputs (streamed, not resumable)",
            ["application/octet-stream", "application/zip"],
            true,
          ),
          ...responses,
        },
      },
    },
    async (request, reply) => {
      const { taskId } = request.params;
      if (!isId(taskId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      return send(
        app.services.database.sql,
        app.services.storage,
        await taskDownloadPlan(app.services.database.sql, principalOf(request), taskId),
        reply,
        () => taskExists(app.services.database.sql, taskId),
        guardOf(app, bearerGrant(request)),
      );
    },
  );

  noHead(app, "/analysis-tasks/:taskId/results.csv");
  app.get(
    "/analysis-tasks/:taskId/results.csv",
    {
      exposeHeadRoute: false,
      schema: {
        summary:
          "The task's runs as one CSV table (a row per run, a column per metric key); streamed, also while the task runs",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam }),
        response: { ...byteResponses("The table, streamed", ["text/csv"], false), ...errorResponses },
      },
    },
    async (request, reply) => {
      return sendResults(
        app.services.database.sql,
        principalOf(request),
        request.params.taskId,
        reply,
        guardOf(app, bearerGrant(request)),
      );
    },
  );

  noHead(app, "/analysis-tasks/:taskId/runs/:runId/download");
  app.get(
    "/analysis-tasks/:taskId/runs/:runId/download",
    {
      exposeHeadRoute: false,
      schema: {
        summary: "One succeeded run's output file",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam, runId: IdParam }),
        response: { ...byteResponses("The output file", ["application/octet-stream"], true), ...responses },
      },
    },
    async (request, reply) => {
      const { taskId, runId } = request.params;
      if (!isId(taskId) || !isId(runId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      return send(
        app.services.database.sql,
        app.services.storage,
        await runDownloadPlan(app.services.database.sql, principalOf(request), taskId, runId),
        reply,
        () => taskExists(app.services.database.sql, taskId),
        guardOf(app, bearerGrant(request)),
      );
    },
  );

  app.get(
    "/analysis-tasks/:taskId/runs/:runId/outputs",
    {
      schema: {
        summary: "The output files of a run: its succeeded attempt's, or none",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam, runId: IdParam }),
        response: { 200: Envelope(Type.Object({ items: Type.Array(OutputBody) })), ...errorResponses },
      },
    },
    async (request, reply) => {
      const { taskId, runId } = request.params;
      if (!isId(taskId) || !isId(runId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      const { sql } = app.services.database;
      const plan = await runOutputsPlan(sql, principalOf(request), taskId, runId);
      if (plan.kind === "not-found") throw notFound("ANALYSIS_TASK_NOT_FOUND");
      if (plan.kind === "none") return ok({ items: [] });
      if (!plan.output.usable) throw await outputMissing(reply, plan.output, () => taskExists(sql, taskId));
      const files = await runOutputFiles(app.services.storage, plan.output).catch(
        async (err: unknown): Promise<never> => {
          throw await storeFault(app.services.storage, err);
        },
      );
      return ok({
        items: files.map((f) => ({ name: f.name, sizeBytes: f.size, contentType: contentTypeOf(f.name) })),
      });
    },
  );

  noHead(app, "/analysis-tasks/:taskId/runs/:runId/outputs/:name");
  app.get(
    "/analysis-tasks/:taskId/runs/:runId/outputs/:name",
    {
      exposeHeadRoute: false,
      schema: {
        summary: "One output file of a run, shown inline in a sandbox (no script runs in this origin)",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam, runId: IdParam, name: Type.String() }),
        response: {
          ...byteResponses("The file, its type told by its name", ["application/octet-stream"], true),
          416: ErrorBody,
          ...errorResponses,
        },
      },
    },
    async (request, reply) => {
      const { taskId, runId, name } = request.params;
      const found = await findOutput(app, principalOf(request), { taskId, runId, name }, reply);
      // An HTML or SVG report is the program's, not ours: shown in a sandbox (a unique origin, no
      // script), it cannot read Assay's storage or call the API as the viewer.
      reply.header("content-security-policy", "sandbox");
      reply.header("x-content-type-options", "nosniff");
      const guard = guardOf(app, bearerGrant(request));
      return sendObject(app.services.storage, found.output, reply, found.exists, guard, name, "inline");
    },
  );

  app.post(
    "/analysis-tasks/:taskId/runs/:runId/outputs/:name/link",
    {
      schema: {
        summary:
          "A view link to one output: a URL that shows it for a few minutes without a token (for frames)",
        description:
          "For what cannot send an Authorization header, such as an iframe showing an HTML report. The link shows this one output, expires after ten minutes (or with its token, if sooner) and stops working when the token that made it is revoked or expires; it is served from /view/… in a sandbox with its own styles allowed and nothing fetched.",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam, runId: IdParam, name: Type.String() }),
        response: { 200: LinkBody, ...errorResponses },
      },
    },
    async (request, reply) => {
      const { taskId, runId, name } = request.params;
      const principal = principalOf(request);
      const found = await findOutput(app, principal, { taskId, runId, name }, reply);
      await heldOrMissing(app.services.storage, found.output, name, reply, found.exists);
      // On the database's clock: the link is checked by whichever instance answers (view-links.ts).
      const now = await databaseNow(app.services.database.sql);
      const { path, expiresAt } = viewLinkPath(
        principal.tokenId,
        bearerHashOf(request),
        { taskId, runId, name },
        now,
        wallClockDeadline(principal, now),
      );
      return ok({ url: path, expiresAt });
    },
  );

  // Download links: what the dashboard's download buttons save, streamed to disk by the browser.
  const linkSchema = <P extends TObject, R extends Record<number, TSchema>>(
    summary: string,
    params: P,
    responses: R,
  ) => ({
    summary,
    description:
      "A URL that downloads this as an attachment, without a token, for five minutes and until the token that made it is revoked or expires: a browser saves it itself, streamed to disk (and resumes it where the download is resumable). Served from /view/download/….",
    tags: ["tasks"],
    security: [{ bearer: [] }],
    params,
    response: { 200: LinkBody, ...responses },
  });
  const made = async (request: FastifyRequest, t: DownloadTarget) => {
    const principal = principalOf(request);
    // On the database's clock: the link is checked by whichever instance answers (view-links.ts).
    const now = await databaseNow(app.services.database.sql);
    const { path, expiresAt } = downloadLinkPath(
      principal.tokenId,
      bearerHashOf(request),
      t,
      now,
      wallClockDeadline(principal, now),
    );
    return ok({ url: path, expiresAt });
  };

  app.post(
    "/analysis-tasks/:taskId/download/link",
    {
      schema: linkSchema(
        "A download link to the task's download (its zip, or its one file)",
        Type.Object({ taskId: IdParam }),
        { 409: ErrorBody, ...errorResponses },
      ),
    },
    async (request, reply) => {
      const { taskId } = request.params;
      if (!isId(taskId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      const { sql } = app.services.database;
      const plan = await taskDownloadPlan(sql, principalOf(request), taskId);
      const exists = () => taskExists(sql, taskId);
      const name = await plannedName(plan, reply, exists);
      if (plan.kind === "single" && name !== undefined)
        await heldOrMissing(app.services.storage, plan.output, name, reply, exists);
      return made(request, { kind: "task", taskId, name: name ?? `task-${taskId}.zip` });
    },
  );

  app.post(
    "/analysis-tasks/:taskId/results.csv/link",
    {
      schema: linkSchema(
        "A download link to the task's results.csv",
        Type.Object({ taskId: IdParam }),
        errorResponses,
      ),
    },
    async (request) => {
      const { taskId } = request.params;
      const { sql } = app.services.database;
      if (!isId(taskId) || !(await taskVisible(sql, principalOf(request), taskId))) {
        throw notFound("ANALYSIS_TASK_NOT_FOUND");
      }
      return made(request, { kind: "results", taskId, name: `task-${taskId}-results.csv` });
    },
  );

  app.post(
    "/analysis-tasks/:taskId/runs/:runId/download/link",
    {
      schema: linkSchema(
        "A download link to one succeeded run's output file",
        Type.Object({ taskId: IdParam, runId: IdParam }),
        { 409: ErrorBody, ...errorResponses },
      ),
    },
    async (request, reply) => {
      const { taskId, runId } = request.params;
      if (!isId(taskId) || !isId(runId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      const { sql } = app.services.database;
      const plan = await runDownloadPlan(sql, principalOf(request), taskId, runId);
      const exists = () => taskExists(sql, taskId);
      const name = (await plannedName(plan, reply, exists)) as string;
      if (plan.kind === "single") await heldOrMissing(app.services.storage, plan.output, name, reply, exists);
      return made(request, { kind: "run", taskId, runId, name });
    },
  );

  app.post(
    "/analysis-tasks/:taskId/runs/:runId/outputs/:name/download-link",
    {
      schema: linkSchema(
        "A download link to one output file of a run",
        Type.Object({ taskId: IdParam, runId: IdParam, name: Type.String() }),
        errorResponses,
      ),
    },
    async (request, reply) => {
      const { taskId, runId, name } = request.params;
      const found = await findOutput(app, principalOf(request), { taskId, runId, name }, reply);
      await heldOrMissing(app.services.storage, found.output, name, reply, found.exists);
      return made(request, { kind: "output", taskId, runId, name });
    },
  );
};

/**
 * `GET /view/:link/:name`, outside the /api scope: the output a view link names, checked by the link's
 * signature instead of a bearer token. Its policy sandboxes it (an opaque origin, no script, no form,
 * no fetch) and lets the document style itself and show inline images.
 */
export const viewRoutes: FastifyPluginAsyncTypebox = async (app) => {
  // The link is a capability: its HEAD's request line stays out of the info log too.
  noHead(app, "/view/:link/:name", { logLevel: "warn" });
  app.get(
    "/view/:link/:name",
    {
      exposeHeadRoute: false,
      schema: { hide: true, params: Type.Object({ link: Type.String(), name: Type.String() }) },
      // The link is a capability: the request lines that name it stay out of the info log.
      logLevel: "warn",
    },
    async (request, reply) => {
      if (app.databaseGate.refuses()) throw databaseUnavailable(reply);
      const ticket = app.services.tokens?.begin();
      const checked = await viewLinkCheck(
        app.services.database.sql,
        request.params.link,
        request.params.name,
      );
      if (!checked) throw notFound("OUTPUT_NOT_FOUND");
      const found = await findOutput(app, checked.principal, checked.target, reply);
      reply.header("content-security-policy", VIEW_CSP);
      reply.header("x-content-type-options", "nosniff");
      reply.header("referrer-policy", "no-referrer");
      reply.header("cache-control", "private, no-store");
      return sendObject(
        app.services.storage,
        found.output,
        reply,
        found.exists,
        linkGuard(app, checked.principal, ticket),
        checked.target.name,
        "inline",
      );
    },
  );
  await app.register(downloadLinkRoutes);
};

/**
 * `GET /view/download/:link/:name`: what a download link names, as an attachment, checked by the link's
 * signature instead of a bearer token, and answered as its /api route would be (a one-file download and
 * an output resumable, a zip and results.csv streamed). Under /view/ so its path stays out of the log.
 */
const downloadLinkRoutes: FastifyPluginAsyncTypebox = async (app) => {
  noHead(app, "/view/download/:link/:name", { logLevel: "warn" });
  app.get(
    "/view/download/:link/:name",
    {
      exposeHeadRoute: false,
      schema: { hide: true, params: Type.Object({ link: Type.String(), name: Type.String() }) },
      // The link is a capability: the request lines that name it stay out of the info log.
      logLevel: "warn",
    },
    async (request, reply) => {
      if (app.databaseGate.refuses()) throw databaseUnavailable(reply);
      const { sql } = app.services.database;
      const ticket = app.services.tokens?.begin();
      const checked = await downloadLinkCheck(sql, request.params.link, request.params.name);
      if (!checked) throw notFound("OUTPUT_NOT_FOUND");
      const { principal, target: t } = checked;
      const guard = linkGuard(app, principal, ticket);
      reply.header("referrer-policy", "no-referrer");
      reply.header("cache-control", "private, no-store");
      // Saved, never shown; were it shown (a browser that ignores the disposition), then in a sandbox.
      reply.header("content-security-policy", "sandbox");
      const exists = () => taskExists(sql, t.taskId);
      const store = app.services.storage;
      if (t.kind === "task")
        return send(sql, store, await taskDownloadPlan(sql, principal, t.taskId), reply, exists, guard);
      if (t.kind === "results") return sendResults(sql, principal, t.taskId, reply, guard);
      if (t.kind === "run")
        return send(
          sql,
          store,
          await runDownloadPlan(sql, principal, t.taskId, t.runId),
          reply,
          exists,
          guard,
        );
      const found = await findOutput(app, principal, t, reply);
      reply.header("x-content-type-options", "nosniff");
      return sendObject(store, found.output, reply, found.exists, guard, t.name, "attachment");
    },
  );
};

/**
 * The guard of a body served through a view or download link: its token as the link's check found it,
 * `ticket` taken before that check.
 */
function linkGuard(app: FastifyInstance, principal: Authenticated, ticket: number | undefined): Guard {
  const { tokenId, role, deadline } = principal;
  return guardOf(app, { tokenId, role, deadline, ticket });
}

/** The policy of a document shown through a view link. */
export const VIEW_CSP = [
  "sandbox",
  "default-src 'none'",
  "style-src 'unsafe-inline'",
  "img-src data:",
  "frame-ancestors 'self'",
].join("; ");

/**
 * The recorded output `name` of a run the principal may see; 404 for an id that cannot exist, a task
 * they cannot see, a run without outputs, or a name the run did not record (`..`, slashes decoded from
 * %2F and anything else the runner would not have accepted never reach the store).
 */
async function findOutput(
  app: FastifyInstance,
  principal: Principal,
  t: ViewTarget,
  reply: FastifyReply,
): Promise<{ output: RunOutput; exists: () => Promise<boolean> }> {
  if (!isId(t.taskId) || !isId(t.runId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
  const { sql } = app.services.database;
  const plan = await runOutputsPlan(sql, principal, t.taskId, t.runId);
  if (plan.kind === "not-found") throw notFound("ANALYSIS_TASK_NOT_FOUND");
  if (plan.kind === "none" || !SAFE_NAME.test(t.name)) throw notFound("OUTPUT_NOT_FOUND");
  const exists = () => taskExists(sql, t.taskId);
  if (!plan.output.usable) throw await outputMissing(reply, plan.output, exists);
  // A run from before its files were recorded names only its result file: that one is not looked for
  // in the store's listing, where a lost one was a 404 (its read then says it is missing, a 500).
  if (plan.output.files === null && t.name === plan.output.outputFileName)
    return { output: plan.output, exists };
  const files = await runOutputFiles(app.services.storage, plan.output);
  if (!files.some((f) => f.name === t.name)) throw notFound("OUTPUT_NOT_FOUND");
  return { output: plan.output, exists };
}
