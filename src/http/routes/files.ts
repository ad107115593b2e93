import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import type { FastifyReply, FastifyRequest } from "fastify";
import { Type } from "typebox";
import { isDatabaseError } from "../../db/client.ts";
import { storedFileName } from "../../files/file-name.ts";
import { fileCreate, fileDelete, fileGet, fileList } from "../../files/files.ts";
import { isNoSpace, PayloadTooLargeError, SourceError, storeFault } from "../../storage/store.ts";
import { FileBody, FileListQuery } from "../api-types.ts";
import { principalOf } from "../auth.ts";
import { ApiError, isDatabaseFull, notFound, validationFailed } from "../errors.ts";
import { watchPartHeaders } from "../part-headers.ts";
import {
  Envelope,
  ErrorBody,
  errorResponses,
  IdParam,
  idempotencyKeyOf,
  isId,
  ok,
  Page,
} from "../schemas.ts";

/**
 * An error from starting to read the multipart body: the parser's own (no boundary, a malformed part
 * header) become 400 INVALID_MULTIPART; errors with a code of their own (size limits, not multipart at
 * all) pass through to the error handler unchanged.
 */
function rejectMalformed(err: unknown): never {
  if (typeof (err as { code?: unknown }).code === "string") throw err;
  throw new ApiError(400, "INVALID_MULTIPART", undefined, err);
}

/**
 * A media type (RFC 9110): a type and a subtype of token characters, at most 127 each (RFC 6838).
 * busboy gives the part's declared type lower-cased and without its parameters, but otherwise as sent:
 * a NUL in it failed the insert (a 500), and escape sequences or 20 KB of it were stored and returned.
 */
const MEDIA_TYPE = /^[!#$%&'*+.^_`|~0-9a-z-]{1,127}\/[!#$%&'*+.^_`|~0-9a-z-]{1,127}$/i;

/** How long the rest of a refused upload's body is read and discarded before the connection is cut. */
const DISCARD_TIMEOUT_MS = 30_000;

/**
 * After an upload failed before its body was read to the end (413, a failing store): reads and
 * discards the rest, so that the connection can carry the client's next request. Left unread, the
 * body stays in the socket and the next request on that keep-alive connection — a browser's next
 * upload, the CLI's next file — waits forever. Node does not do this itself for a body the handler
 * had started reading. A client still sending after DISCARD_TIMEOUT_MS is cut off.
 */
function discardRest(request: FastifyRequest): void {
  const raw = request.raw;
  if (raw.readableEnded || raw.destroyed) return;
  raw.unpipe();
  const timer = setTimeout(() => raw.socket.destroy(), DISCARD_TIMEOUT_MS);
  timer.unref();
  raw.once("end", () => clearTimeout(timer));
  raw.once("close", () => clearTimeout(timer));
  raw.resume();
}

export const fileRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.post(
    "/files",
    {
      schema: {
        summary: "Upload a data file (multipart/form-data, field `file`)",
        tags: ["files"],
        consumes: ["multipart/form-data"],
        security: [{ bearer: [] }],
        headers: Type.Object({ "idempotency-key": Type.Optional(Type.String()) }),
        response: {
          200: Envelope(FileBody),
          201: Envelope(FileBody),
          409: ErrorBody,
          507: ErrorBody,
          ...errorResponses,
        },
      },
    },
    async (request, reply) => {
      try {
        return await upload(request, reply);
      } catch (err) {
        discardRest(request);
        throw err;
      }
    },
  );

  async function upload(request: FastifyRequest, reply: FastifyReply) {
    const { database, storage, config } = app.services;
    // Checked before the body is read (the body's rest is discarded).
    const idempotencyKey = idempotencyKeyOf(request.headers["idempotency-key"]);
    const parsing = request.file();
    // Watched from the same tick as the parser is piped: no chunk passes unseen.
    const headers = watchPartHeaders(request.raw);
    const part = await parsing.catch(rejectMalformed);
    if (part?.fieldname !== "file") {
      // Drain whatever part arrived so the connection can be reused.
      part?.file.resume();
      // busboy drops a part whose file name holds a line break as if it had not been sent.
      if (headers.fileNameHasLineBreak())
        throw validationFailed("The file name must not contain line breaks.");
      throw new ApiError(400, "VALIDATION_FAILED", "The request must carry a `file` part.");
    }
    headers.release();
    // Only a failure that started in the part's own stream is the body's fault (it ends before its
    // closing boundary, say): the store says so with a SourceError. A full disk or a failing bucket
    // destroys the part's stream too, with its own error, and stays ours: a full disk (ENOSPC, EDQUOT;
    // a bucket's server out of room, see s3.ts) or a database without the disk to write the row
    // (SQLSTATE 53100; fileCreate has deleted the stored bytes then) is 507 STORAGE_FULL — the
    // server's lack of room, neither a bug (500) nor a brief outage (a 503, which the CLI would retry
    // within seconds); nothing of the upload is kept, so the same request (its Idempotency-Key too)
    // succeeds once there is room —, anything else 500. The store's meter fails one byte past the
    // limit, before @fastify/multipart (whose limit is a byte higher) would cut the stream short.
    const result = await fileCreate(database.sql, storage, principalOf(request), part.file, {
      name: storedFileName(part.filename),
      contentType: MEDIA_TYPE.test(part.mimetype) ? part.mimetype : "application/octet-stream",
      maxBytes: config.maxUploadBytes,
      ...(idempotencyKey === undefined ? {} : { idempotencyKey }),
    }).catch(async (err: unknown): Promise<never> => {
      if (err instanceof SourceError) throw new ApiError(400, "INVALID_MULTIPART", undefined, err.cause);
      if (isNoSpace(err) || isDatabaseFull(err)) throw new ApiError(507, "STORAGE_FULL", undefined, err);
      // A store that is away (its check fails too) is a 503 NOT_READY the client retries, with the
      // same Idempotency-Key: until 2026-12-07 a 500, which the CLI does not retry. Not asked for
      // the database's errors (its outage is the gate's 503), nor for the upload's own size.
      if (err instanceof PayloadTooLargeError || isDatabaseError(err)) throw err;
      throw await storeFault(storage, err);
    });
    switch (result.kind) {
      case "idempotency-conflict":
        throw new ApiError(409, "IDEMPOTENCY_KEY_REUSED");
      case "existing":
        // A retry whose first try committed (its answer lost): the same file, as a task replay is 200.
        return reply.status(200).send(ok(result.file, "File already uploaded"));
      case "created":
        request.log.info({ fileId: result.file.fileId, sizeBytes: result.file.sizeBytes }, "file uploaded");
        return reply.status(201).send(ok(result.file, "File uploaded"));
    }
  }

  app.get(
    "/files",
    {
      schema: {
        summary: "The caller's files (an admin: everyone's), newest first, in pages; `sha256` finds copies",
        tags: ["files"],
        security: [{ bearer: [] }],
        querystring: FileListQuery,
        response: { 200: Envelope(Page(FileBody)), ...errorResponses },
      },
    },
    async (request) => {
      const { sha256, limit, cursor } = request.query;
      return ok(
        await fileList(app.services.database.sql, principalOf(request), {
          limit: limit ?? 20,
          ...(sha256 === undefined ? {} : { sha256 }),
          ...(cursor === undefined ? {} : { cursor }),
        }),
      );
    },
  );

  app.get(
    "/files/:fileId",
    {
      schema: {
        summary: "File metadata (owner or admin)",
        tags: ["files"],
        security: [{ bearer: [] }],
        params: Type.Object({ fileId: IdParam }),
        response: { 200: Envelope(FileBody), 401: ErrorBody, 404: ErrorBody },
      },
    },
    async (request) => {
      const { fileId } = request.params;
      const record = isId(fileId)
        ? await fileGet(app.services.database.sql, principalOf(request), fileId)
        : undefined;
      if (!record) throw notFound("FILE_NOT_FOUND");
      return ok(record);
    },
  );

  app.delete(
    "/files/:fileId",
    {
      schema: {
        summary: "Delete a file (owner or admin): its record and its bytes",
        description:
          "Tasks made from it keep their runs and outputs; a run of an unfinished task that has not read it yet fails ANALYSIS_INPUT_INVALID. A second delete is a 404. The answer comes once the record is gone: bytes the store has not deleted within 5 seconds are left to the store sweep.",
        tags: ["files"],
        security: [{ bearer: [] }],
        params: Type.Object({ fileId: IdParam }),
        response: {
          200: Envelope(Type.Object({ fileId: Type.String() })),
          401: ErrorBody,
          404: ErrorBody,
        },
      },
    },
    async (request) => {
      const { fileId } = request.params;
      const { database, storage } = app.services;
      const deleted =
        isId(fileId) &&
        (await fileDelete(database.sql, storage, principalOf(request), fileId, (err) =>
          request.log.warn({ err, fileId }, "a deleted file's bytes are left to the store sweep"),
        ));
      if (!deleted) throw notFound("FILE_NOT_FOUND");
      request.log.info({ fileId }, "file deleted");
      return ok({ fileId }, "File deleted");
    },
  );
};
