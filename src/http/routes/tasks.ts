import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import { type TSchema, Type } from "typebox";
import { ANALYSIS_TYPES, isAnalysisType, PARAMETER_SCHEMAS } from "../../analyses/types.ts";
import { typeSettings } from "../../config.ts";
import { taskCancel } from "../../tasks/cancel.ts";
import { taskCreate } from "../../tasks/create.ts";
import { runList, taskGet, taskList } from "../../tasks/read.ts";
import { TASK_STATUSES } from "../../tasks/states.ts";
import { principalOf } from "../auth.ts";
import { ApiError, notFound, validationFailed } from "../errors.ts";
import { Envelope, ErrorBody, errorResponses, IdParam, isId, ok, Page, PageQuery } from "../schemas.ts";

const FileId = Type.String({ minLength: 1, maxLength: 32, description: "A file id from POST /api/files" });

/**
 * The create body: a union discriminated on `analysisType`, so Ajv validates `parameters` against the
 * chosen type's schema and reports an unknown type as such (mapped to ANALYSIS_TYPE_UNSUPPORTED).
 */
const CreateBody = Type.Unsafe<{
  analysisType: string;
  inputFileId?: string;
  inputFileIds?: string[];
  parameters?: Record<string, unknown>;
}>({
  type: "object",
  required: ["analysisType"],
  discriminator: { propertyName: "analysisType" },
  oneOf: ANALYSIS_TYPES.map((type) =>
    Type.Object(
      {
        analysisType: Type.Literal(type),
        inputFileId: Type.Optional(FileId),
        inputFileIds: Type.Optional(Type.Array(FileId, { maxItems: 100_000 })),
        parameters: Type.Optional(PARAMETER_SCHEMAS[type] as TSchema),
      },
      { additionalProperties: false },
    ),
  ),
});

const TaskBody = Type.Object({
  taskId: Type.String(),
  analysisType: Type.String(),
  status: Type.String(),
  totalCount: Type.Integer(),
  succeededCount: Type.Integer(),
  failedCount: Type.Integer(),
  timedOutCount: Type.Integer(),
  cancelledCount: Type.Integer(),
  progressPercent: Type.Integer(),
  parameters: Type.Record(Type.String(), Type.Unknown()),
  createdAt: Type.String(),
  startedAt: Type.Union([Type.String(), Type.Null()]),
  finishedAt: Type.Union([Type.String(), Type.Null()]),
});

const RunBody = Type.Object({
  runId: Type.String(),
  inputFileId: Type.String(),
  fileName: Type.String(),
  status: Type.String(),
  attempt: Type.Integer(),
  errorCode: Type.Union([Type.String(), Type.Null()]),
  errorMessage: Type.Union([Type.String(), Type.Null()]),
  progressPercent: Type.Integer(),
  metrics: Type.Union([Type.Record(Type.String(), Type.Unknown()), Type.Null()]),
  startedAt: Type.Union([Type.String(), Type.Null()]),
  finishedAt: Type.Union([Type.String(), Type.Null()]),
});

const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,200}$/;

export const taskRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.post(
    "/analysis-tasks",
    {
      schema: {
        summary: "Create an analysis task over one or more uploaded files",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        headers: Type.Object({ "idempotency-key": Type.Optional(Type.String()) }),
        body: CreateBody,
        response: {
          200: Envelope(Type.Object({ taskId: Type.String(), status: Type.String() })),
          201: Envelope(Type.Object({ taskId: Type.String(), status: Type.Literal("queued") })),
          409: ErrorBody,
          ...errorResponses,
        },
      },
    },
    async (request, reply) => {
      const { config, database } = app.services;
      const body = request.body;
      if (!isAnalysisType(body.analysisType)) throw new ApiError(400, "ANALYSIS_TYPE_UNSUPPORTED");
      if ((body.inputFileId === undefined) === (body.inputFileIds === undefined)) {
        throw validationFailed("Give exactly one of body/inputFileId and body/inputFileIds.");
      }
      const fileIds = [...new Set(body.inputFileIds ?? [body.inputFileId as string])];
      if (fileIds.length === 0) throw validationFailed("body/inputFileIds must name at least one file.");
      if (fileIds.length > config.maxTaskRuns) {
        throw validationFailed(`A task may have at most ${config.maxTaskRuns} input files.`);
      }
      // An id that cannot exist is a missing file, as in GET /api/files/:fileId.
      if (!fileIds.every(isId)) throw notFound("FILE_NOT_FOUND");
      const key = request.headers["idempotency-key"];
      if (key !== undefined && !IDEMPOTENCY_KEY.test(key)) {
        throw validationFailed("The Idempotency-Key header must be 1–200 visible ASCII characters.");
      }
      const result = await taskCreate(database.sql, principalOf(request), {
        analysisType: body.analysisType,
        fileIds,
        parameters: body.parameters ?? {},
        maxAttempts: typeSettings(config, body.analysisType).maxAttempts,
        ...(key === undefined ? {} : { idempotencyKey: key }),
      });
      switch (result.kind) {
        case "files-missing":
          throw notFound("FILE_NOT_FOUND");
        case "idempotency-conflict":
          throw new ApiError(409, "IDEMPOTENCY_KEY_REUSED");
        case "existing":
          return reply
            .status(200)
            .send(ok({ taskId: result.taskId, status: result.status }, "Task already created"));
        case "created":
          request.log.info({ taskId: result.taskId, runs: fileIds.length }, "task created");
          return reply
            .status(201)
            .send(ok({ taskId: result.taskId, status: "queued" as const }, "Task created"));
      }
    },
  );

  app.get(
    "/analysis-tasks",
    {
      schema: {
        summary: "List tasks, newest first",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        querystring: Type.Object(
          { status: Type.Optional(Type.Union(TASK_STATUSES.map((s) => Type.Literal(s)))), ...PageQuery },
          { additionalProperties: false },
        ),
        response: { 200: Envelope(Page(TaskBody)), ...errorResponses },
      },
    },
    async (request) => {
      const { status, limit, cursor } = request.query;
      const page = await taskList(app.services.database.sql, principalOf(request), {
        limit: limit ?? 20,
        ...(status === undefined ? {} : { status }),
        ...(cursor === undefined ? {} : { cursor }),
      });
      return ok(page);
    },
  );

  app.get(
    "/analysis-tasks/:taskId",
    {
      schema: {
        summary: "A task: status, counts, progress",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam }),
        response: { 200: Envelope(TaskBody), ...errorResponses },
      },
    },
    async (request) => {
      const { taskId } = request.params;
      const task = isId(taskId)
        ? await taskGet(app.services.database.sql, principalOf(request), taskId)
        : undefined;
      if (!task) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      return ok(task);
    },
  );

  app.get(
    "/analysis-tasks/:taskId/runs",
    {
      schema: {
        summary: "The runs of a task (one per input file)",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam }),
        querystring: Type.Object(PageQuery, { additionalProperties: false }),
        response: { 200: Envelope(Page(RunBody)), ...errorResponses },
      },
    },
    async (request) => {
      const { taskId } = request.params;
      const { limit, cursor } = request.query;
      const page = isId(taskId)
        ? await runList(app.services.database.sql, principalOf(request), taskId, {
            limit: limit ?? 50,
            ...(cursor === undefined ? {} : { cursor }),
          })
        : undefined;
      if (!page) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      return ok(page);
    },
  );

  app.post(
    "/analysis-tasks/:taskId/cancel",
    {
      schema: {
        summary: "Cancel a task: queued runs end at once, running processes are killed",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam }),
        response: {
          202: Envelope(Type.Object({ taskId: Type.String(), status: Type.String() })),
          409: ErrorBody,
          ...errorResponses,
        },
      },
    },
    async (request, reply) => {
      const { taskId } = request.params;
      const result = isId(taskId)
        ? await taskCancel(app.services.database.sql, principalOf(request), taskId)
        : undefined;
      if (!result || result.kind === "not-found") throw notFound("ANALYSIS_TASK_NOT_FOUND");
      if (result.kind === "finished") throw new ApiError(409, "ANALYSIS_TASK_ALREADY_FINISHED");
      request.log.info(
        {
          taskId,
          status: result.status,
          cancelledQueued: result.cancelledQueued,
          cancellingLive: result.cancellingLive,
        },
        "task cancel requested",
      );
      return reply.status(202).send(ok({ taskId, status: result.status }, "Cancellation accepted"));
    },
  );
};
