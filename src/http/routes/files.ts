import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import { Type } from "typebox";
import { fileCreate, fileGet, fileList, sanitizeFileName } from "../../files/files.ts";
import { PayloadTooLargeError } from "../../storage/store.ts";
import { principalOf } from "../auth.ts";
import { ApiError, notFound } from "../errors.ts";
import { Envelope, ErrorBody, errorResponses, IdParam, isId, ok, Page, PageQuery } from "../schemas.ts";

const FileBody = Type.Object({
  fileId: Type.String(),
  name: Type.String(),
  contentType: Type.String(),
  sizeBytes: Type.Integer(),
  sha256: Type.String(),
  createdAt: Type.String({ format: "date-time" }),
});

/**
 * An error from starting to read the multipart body: the parser's own (no boundary, a malformed part
 * header) become 400 INVALID_MULTIPART; errors with a code of their own (size limits, not multipart at
 * all) pass through to the error handler unchanged.
 */
function rejectMalformed(err: unknown): never {
  if (typeof (err as { code?: unknown }).code === "string") throw err;
  throw new ApiError(400, "INVALID_MULTIPART", undefined, err);
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
        response: { 201: Envelope(FileBody), ...errorResponses },
      },
    },
    async (request, reply) => {
      const { database, storage, config } = app.services;
      const part = await request.file().catch(rejectMalformed);
      if (part?.fieldname !== "file") {
        // Drain whatever part arrived so the connection can be reused.
        part?.file.resume();
        throw new ApiError(400, "VALIDATION_FAILED", "The request must carry a `file` part.");
      }
      // Only an error of the part's own stream is the body's fault (it ends before its closing
      // boundary, say) — it may have failed before this line, so ask the stream, not a listener; the
      // store's and the database's errors are ours. The store's meter fails one byte past the limit,
      // before @fastify/multipart (whose limit is a byte higher) would cut the stream short.
      const record = await fileCreate(database.sql, storage, principalOf(request), part.file, {
        name: sanitizeFileName(part.filename),
        contentType: part.mimetype || "application/octet-stream",
        maxBytes: config.maxUploadBytes,
      }).catch((err: unknown) => {
        if (err === part.file.errored && !(err instanceof PayloadTooLargeError)) {
          throw new ApiError(400, "INVALID_MULTIPART", undefined, err);
        }
        throw err;
      });
      request.log.info({ fileId: record.fileId, sizeBytes: record.sizeBytes }, "file uploaded");
      return reply.status(201).send(ok(record, "File uploaded"));
    },
  );

  app.get(
    "/files",
    {
      schema: {
        summary: "The caller's files (an admin: everyone's), newest first, in pages; `sha256` finds copies",
        tags: ["files"],
        security: [{ bearer: [] }],
        querystring: Type.Object(
          {
            sha256: Type.Optional(
              Type.String({ pattern: "^[0-9a-f]{64}$", description: "Only files with this content hash" }),
            ),
            ...PageQuery,
          },
          { additionalProperties: false },
        ),
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
};
