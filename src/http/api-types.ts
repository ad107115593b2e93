// The API's request and response bodies as TypeBox schemas, in a module that loads no server code
// (typebox and plain constants only). The routes validate and shape with these schemas, and the CLI's
// client (src/client/) takes its types from them with `import type`, which costs it nothing at run
// time: a change to a body here breaks the build of whichever side no longer matches.
import { type Static, type TSchema, Type } from "typebox";
import { ANALYSIS_TYPES, PARAMETER_SCHEMAS } from "../analyses/types.ts";
import type { RunStatus, TaskStatus, TERMINAL_TASK_STATUSES } from "../tasks/states.ts";
import { RUN_STATUSES, TASK_STATUSES } from "../tasks/states.ts";
import { Envelope, ErrorBody, Page, PageQuery } from "./schemas.ts";

export { Envelope, ErrorBody, Page, PageQuery };

// ---- files -----------------------------------------------------------------------------------

export const FileBody = Type.Object({
  fileId: Type.String(),
  name: Type.String(),
  owner: Type.String({ description: "The owner's user name" }),
  contentType: Type.String(),
  sizeBytes: Type.Integer(),
  sha256: Type.String(),
  createdAt: Type.String({ format: "date-time" }),
});

export const FileListQuery = Type.Object(
  {
    sha256: Type.Optional(
      Type.String({ pattern: "^[0-9a-f]{64}$", description: "Only files with this content hash" }),
    ),
    ...PageQuery,
  },
  { additionalProperties: false },
);

// ---- tasks and runs --------------------------------------------------------------------------

/** Whether a type's parameter schema has required fields (so `parameters` may not be left out). */
const needsParameters = (type: (typeof ANALYSIS_TYPES)[number]) =>
  ((PARAMETER_SCHEMAS[type] as { required?: string[] }).required?.length ?? 0) > 0;

const FileId = Type.String({ minLength: 1, maxLength: 32, description: "A file id from POST /api/files" });

/**
 * The create body: a union discriminated on `analysisType`, so Ajv validates `parameters` against the
 * chosen type's schema and reports an unknown type as such (mapped to ANALYSIS_TYPE_UNSUPPORTED).
 */
export const CreateBody = Type.Unsafe<{
  analysisType: string;
  inputFileId?: string;
  inputFileIds?: string[];
  parameters?: Record<string, unknown>;
  priority?: number;
}>({
  type: "object",
  required: ["analysisType"],
  discriminator: { propertyName: "analysisType" },
  oneOf: ANALYSIS_TYPES.map((type) =>
    Type.Object(
      {
        analysisType: Type.Literal(type),
        inputFileId: Type.Optional(FileId),
        // The configured limit (ASSAY_MAX_TASK_RUNS) is checked by the route, with a clear message.
        inputFileIds: Type.Optional(Type.Array(FileId, { maxItems: 1_000_000 })),
        // Optional only where the type needs none: python-stats without `parameters` was accepted
        // and every one of its runs then failed ANALYSIS_INPUT_INVALID.
        parameters: needsParameters(type)
          ? (PARAMETER_SCHEMAS[type] as TSchema)
          : Type.Optional(PARAMETER_SCHEMAS[type] as TSchema),
        priority: Type.Optional(
          Type.Integer({
            minimum: 0,
            maximum: 9,
            description: "0 runs first, 9 last (default 5); beats fair share. Only an admin may set it.",
          }),
        ),
      },
      { additionalProperties: false },
    ),
  ),
});

/** POST /api/analysis-tasks: 201 for a new task (always queued), 200 for an Idempotency-Key replay. */
export const TaskCreatedBody = Type.Object({ taskId: Type.String(), status: Type.Literal("queued") });
export const TaskReplayedBody = Type.Object({ taskId: Type.String(), status: Type.String() });
export const CancelAcceptedBody = Type.Object({ taskId: Type.String(), status: Type.String() });

export const TaskBody = Type.Object({
  taskId: Type.String(),
  analysisType: Type.String(),
  owner: Type.String({ description: "The owner's user name" }),
  status: Type.String(),
  totalCount: Type.Integer(),
  succeededCount: Type.Integer(),
  failedCount: Type.Integer(),
  timedOutCount: Type.Integer(),
  cancelledCount: Type.Integer(),
  progressPercent: Type.Integer(),
  parameters: Type.Record(Type.String(), Type.Unknown()),
  priority: Type.Integer({ minimum: 0, maximum: 9, description: "0 runs first, 9 last" }),
  queue: Type.Union(
    [
      Type.Object({
        runsAhead: Type.Integer({ description: "About how many runs start before this task's first" }),
        usersWaiting: Type.Integer({
          description: "Other users waiting at the same priority, served in turn",
        }),
        higherPriority: Type.Integer({
          description: "Runs of a higher priority waiting (counted up to 10,000)",
        }),
        estimate: Type.Literal(true, { description: "Always true: an estimate, not a promise" }),
        noWorker: Type.Union([Type.String(), Type.Null()], {
          description:
            "Why no live worker can run the task's type now (as GET /api/analysis-types says), null when one can",
        }),
      }),
      Type.Null(),
    ],
    { description: "Where a queued task stands (null unless the task is queued)" },
  ),
  createdAt: Type.String(),
  startedAt: Type.Union([Type.String(), Type.Null()]),
  finishedAt: Type.Union([Type.String(), Type.Null()]),
});

export const TaskListQuery = Type.Object(
  {
    status: Type.Optional(Type.Unsafe<TaskStatus>(Type.Union(TASK_STATUSES.map((s) => Type.Literal(s))))),
    analysisType: Type.Optional(
      Type.String({ pattern: "^[a-z0-9-]{1,64}$", description: "Only tasks of this analysis type" }),
    ),
    ...PageQuery,
  },
  { additionalProperties: false },
);

export const RunBody = Type.Object({
  runId: Type.String(),
  inputFileId: Type.String(),
  fileName: Type.String(),
  status: Type.String(),
  attempt: Type.Integer(),
  errorCode: Type.Union([Type.String(), Type.Null()]),
  errorMessage: Type.Union([Type.String(), Type.Null()]),
  progressPercent: Type.Integer(),
  message: Type.Union([Type.String(), Type.Null()], {
    description: "The latest progress message the program reported; null when none",
  }),
  metrics: Type.Union([Type.Record(Type.String(), Type.Unknown()), Type.Null()]),
  startedAt: Type.Union([Type.String(), Type.Null()]),
  finishedAt: Type.Union([Type.String(), Type.Null()]),
});

export const RunListQuery = Type.Object(
  {
    status: Type.Optional(Type.Unsafe<RunStatus>(Type.Union(RUN_STATUSES.map((s) => Type.Literal(s))))),
    ...PageQuery,
  },
  { additionalProperties: false },
);

/**
 * One output file of a succeeded run (GET …/runs/:runId/outputs). The same shape as the route's own
 * schema in routes/downloads.ts, which is not moved here yet.
 */
export const OutputBody = Type.Object({
  name: Type.String(),
  sizeBytes: Type.Integer({ minimum: 0 }),
  contentType: Type.String(),
});

// ---- events ----------------------------------------------------------------------------------

export const EventBody = Type.Object({
  id: Type.String(),
  taskId: Type.String(),
  runId: Type.Union([Type.String(), Type.Null()]),
  type: Type.String(),
  data: Type.Record(Type.String(), Type.Unknown()),
  createdAt: Type.String(),
});

export const LogsQuery = Type.Object(
  {
    after: Type.Optional(
      Type.String({ pattern: "^[0-9]{1,18}$", description: "Return events after this id" }),
    ),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
  },
  { additionalProperties: false },
);

export const LogsPageBody = Type.Object({
  items: Type.Array(EventBody),
  nextCursor: Type.Union([Type.String(), Type.Null()]),
});

// ---- analysis types --------------------------------------------------------------------------

export const AnalysisTypeBody = Type.Object({
  name: Type.Union(ANALYSIS_TYPES.map((t) => Type.Literal(t))),
  description: Type.String(),
  parameters: Type.Record(Type.String(), Type.Unknown(), {
    description: "The JSON schema `parameters` of POST /api/analysis-tasks is validated with for this type",
  }),
  available: Type.Boolean({ description: "At least one live worker offers the type" }),
  reason: Type.Union([Type.String(), Type.Null()], {
    description:
      'Why not, when unavailable: what live workers reported (e.g. "Rscript not found (2 workers)"), or "no worker is running"',
  }),
  workers: Type.Integer({ minimum: 0, description: "Live workers offering the type" }),
});

// ---- the static types the client uses ----------------------------------------------------------

export type { RunStatus, TaskStatus } from "../tasks/states.ts";
export type TerminalTaskStatus = (typeof TERMINAL_TASK_STATUSES)[number];

export type FileRecord = Static<typeof FileBody>;
export type FileListParams = Static<typeof FileListQuery>;
export type CreateTaskRequest = Static<typeof CreateBody>;
export type TaskCreated = Static<typeof TaskCreatedBody> | Static<typeof TaskReplayedBody>;
export type CancelAccepted = Static<typeof CancelAcceptedBody>;
export type Task = Static<typeof TaskBody>;
export type TaskListParams = Static<typeof TaskListQuery>;
export type Run = Static<typeof RunBody>;
export type RunListParams = Static<typeof RunListQuery>;
export type Output = Static<typeof OutputBody>;
export type TaskEvent = Static<typeof EventBody>;
export type LogsParams = Static<typeof LogsQuery>;
export type LogsPage = Static<typeof LogsPageBody>;
export type AnalysisTypeInfo = Static<typeof AnalysisTypeBody>;
export type ErrorResponse = Static<typeof ErrorBody>;
/** A page of a list: `items`, and the cursor of the next page (null on the last). */
export type PageOf<T> = { items: T[]; nextCursor: string | null };
/** Every successful response: `{code: "OK", message, data}`. */
export type EnvelopeOf<T> = { code: "OK"; message: string; data: T };
