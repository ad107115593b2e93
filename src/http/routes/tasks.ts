import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import { Type } from "typebox";
import { isAnalysisType } from "../../analyses/types.ts";
import { typeSettings } from "../../config.ts";
import { hasLoneSurrogate } from "../../files/file-name.ts";
import { workerStaleMs } from "../../queue/sql.ts";
import { taskCancel } from "../../tasks/cancel.ts";
import { taskCreate } from "../../tasks/create.ts";
import {
  type Page as ListPage,
  type RunView,
  runList,
  type TaskView,
  taskGetOwned,
  taskList,
} from "../../tasks/read.ts";
import { pageKey, visibleTo } from "../../tasks/task-cache.ts";
import {
  CancelAcceptedBody,
  CreateBody,
  RunBody,
  RunListQuery,
  TaskBody,
  TaskCreatedBody,
  TaskListQuery,
  TaskReplayedBody,
} from "../api-types.ts";
import { principalOf } from "../auth.ts";
import { ApiError, isDatabaseFull, notFound, validationFailed } from "../errors.ts";
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

/** NUL, or a surrogate without its other half: text PostgreSQL's jsonb refuses to store. */
const unstorable = (s: string) => s.includes("\u0000") || hasLoneSurrogate(s);

/**
 * Where in `value` (the validated parameters) a string holds text jsonb cannot store, as the field's
 * path, or undefined. JSON allows `\u0000` and `\ud800`, so the schemas pass them, and the insert then
 * failed: a 500 for the client's input. The keys were checked by the schemas (none allows unknown ones).
 */
function unstorableAt(value: unknown, at: string): string | undefined {
  if (typeof value === "string") return unstorable(value) ? at : undefined;
  if (Array.isArray(value)) {
    for (const [i, v] of value.entries()) {
      const found = unstorableAt(v, `${at}/${i}`);
      if (found) return found;
    }
  } else if (value && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) {
      const found = unstorableAt(v, `${at}/${k}`);
      if (found) return found;
    }
  }
  return undefined;
}

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
          200: Envelope(TaskReplayedBody),
          201: Envelope(TaskCreatedBody),
          409: ErrorBody,
          507: ErrorBody,
          ...errorResponses,
        },
      },
    },
    async (request, reply) => {
      const { config, database } = app.services;
      const body = request.body;
      const principal = principalOf(request);
      // Never silently ignored: a user who asks for a priority is told it is not theirs to set, before
      // anything else about the request (a body that breaks the schema is told that first).
      if (body.priority !== undefined && principal.role !== "admin") {
        throw validationFailed("body/priority may only be set by an admin.");
      }
      if (!isAnalysisType(body.analysisType)) throw new ApiError(400, "ANALYSIS_TYPE_UNSUPPORTED");
      if ((body.inputFileId === undefined) === (body.inputFileIds === undefined)) {
        throw validationFailed("Give exactly one of body/inputFileId and body/inputFileIds.");
      }
      const fileIds = [...new Set(body.inputFileIds ?? [body.inputFileId as string])];
      if (fileIds.length === 0) throw validationFailed("body/inputFileIds must name at least one file.");
      if (fileIds.length > config.maxTaskRuns) {
        throw validationFailed(`A task may have at most ${config.maxTaskRuns} input files.`);
      }
      const key = idempotencyKeyOf(request.headers["idempotency-key"]);
      const badText = unstorableAt(body.parameters, "body/parameters");
      if (badText) throw validationFailed(`${badText} must not contain NUL or an unpaired surrogate.`);
      // An id that cannot exist is a missing file, as in GET /api/files/:fileId.
      if (!fileIds.every(isId)) throw notFound("FILE_NOT_FOUND");
      const result = await taskCreate(database.sql, principal, {
        analysisType: body.analysisType,
        fileIds,
        parameters: body.parameters ?? {},
        maxAttempts: typeSettings(config, body.analysisType).maxAttempts,
        ...(body.priority === undefined ? {} : { priority: body.priority }),
        ...(key === undefined ? {} : { idempotencyKey: key }),
      }).catch((err: unknown) => {
        // The database without the disk to write the task (SQLSTATE 53100): the server's lack of room,
        // as for an upload, not a bug's 500; nothing was written (one statement), so the same request
        // succeeds once there is room.
        if (isDatabaseFull(err))
          throw new ApiError(507, "STORAGE_FULL", "The server has no room to store this task.", err);
        throw err;
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
        querystring: TaskListQuery,
        response: { 200: Envelope(Page(TaskBody)), ...errorResponses },
      },
    },
    async (request) => {
      const { status, analysisType, limit, cursor } = request.query;
      const page = await taskList(app.services.database.sql, principalOf(request), {
        limit: limit ?? 20,
        workerStaleMs: workerStaleMs(app.services.config.leaseTtlMs),
        ...(status === undefined ? {} : { status }),
        ...(analysisType === undefined ? {} : { analysisType }),
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
      if (!isId(taskId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      const principal = principalOf(request);
      // A cached task is still checked against the caller (owner or admin), as the statement does.
      const cache = app.services.tasks;
      const cached = cache?.get<TaskView>(taskId);
      if (cached) {
        if (!visibleTo(principal, cached.ownerId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
        return ok(cached.value);
      }
      const ticket = cache?.begin();
      const found = await taskGetOwned(app.services.database.sql, principal, taskId, {
        workerStaleMs: workerStaleMs(app.services.config.leaseTtlMs),
      });
      if (!found) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      // A queued task's estimate depends on other users' runs: never cached.
      if (ticket !== undefined && found.task.status !== "queued") {
        cache?.set(taskId, found.ownerId, found.task, ticket);
      }
      return ok(found.task);
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
        querystring: RunListQuery,
        response: { 200: Envelope(Page(RunBody)), ...errorResponses },
      },
    },
    async (request) => {
      const { taskId } = request.params;
      if (!isId(taskId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      const { status, limit, cursor } = request.query;
      const query = {
        limit: limit ?? 20,
        ...(status === undefined ? {} : { status }),
        ...(cursor === undefined ? {} : { cursor }),
      };
      const principal = principalOf(request);
      // Cached like the task (see task-cache.ts), and checked against the caller the same way.
      const cache = app.services.tasks;
      const key = pageKey(query);
      const cached = cache?.getPage<ListPage<RunView>>(taskId, key);
      if (cached) {
        if (!visibleTo(principal, cached.ownerId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
        return ok(cached.value);
      }
      const ticket = cache?.begin();
      const found = await runList(app.services.database.sql, principal, taskId, query);
      if (!found) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      if (ticket !== undefined)
        cache?.setPage(taskId, key, found.ownerId, found.page, found.page.items.length, ticket);
      return ok(found.page);
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
          202: Envelope(CancelAcceptedBody),
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
      // Whatever it changed, this process answers from the database again at once (the event's
      // notification would do it too, a moment later).
      if (result) app.services.tasks?.invalidate(taskId);
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
