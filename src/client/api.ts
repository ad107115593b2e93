// The API's routes as typed functions. Request and response types are the server's own
// (src/http/api-types.ts): a change to a body there breaks the build here.
import type {
  AnalysisTypeInfo,
  CancelAccepted,
  CreateTaskRequest,
  FileRecord,
  LogsPage,
  Output,
  PageOf,
  Run,
  RunStatus,
  Task,
  TaskCreated,
  TaskListParams,
} from "../http/api-types.ts";
import type { ApiClient } from "./http.ts";

/** The largest page the list routes serve. */
const PAGE = 100;

const enc = encodeURIComponent;

export const analysisTypes = async (c: ApiClient, signal?: AbortSignal) =>
  (await c.get<{ items: AnalysisTypeInfo[] }>("/api/analysis-types", undefined, signal)).items;

/** Every item of a paged list, following `nextCursor`. */
async function allPages<T>(
  c: ApiClient,
  path: string,
  query: Record<string, string | number | undefined>,
  signal?: AbortSignal,
): Promise<T[]> {
  const items: T[] = [];
  for (let cursor: string | undefined; ; ) {
    const page = await c.get<PageOf<T>>(path, { ...query, limit: PAGE, cursor }, signal);
    items.push(...page.items);
    if (page.nextCursor === null) return items;
    cursor = page.nextCursor;
  }
}

/** The user a token belongs to (`GET /api/me`). */
export interface Me {
  userId: string;
  name: string;
  role: string;
}

const whoAmI = new WeakMap<ApiClient, Promise<Me>>();

/** The caller (GET /api/me), asked once per client: a failed ask is asked again next time. */
export function me(c: ApiClient, signal?: AbortSignal): Promise<Me> {
  let asked = whoAmI.get(c);
  if (!asked) {
    asked = c.get<Me>("/api/me", undefined, signal);
    whoAmI.set(c, asked);
    asked.catch(() => whoAmI.delete(c));
  }
  return asked;
}

/** The files the caller can see with these bytes (an admin: anyone's). */
export const filesBySha256 = (c: ApiClient, sha256: string, signal?: AbortSignal) =>
  allPages<FileRecord>(c, "/api/files", { sha256 }, signal);

export const filePage = (c: ApiClient, q: { limit: number; cursor?: string }, signal?: AbortSignal) =>
  c.get<PageOf<FileRecord>>("/api/files", q, signal);

export const fileDelete = (c: ApiClient, fileId: string, signal?: AbortSignal) =>
  c.json<{ fileId: string }>("DELETE", `/api/files/${enc(fileId)}`, {
    ...(signal === undefined ? {} : { signal }),
  });

export async function taskCreate(
  c: ApiClient,
  body: CreateTaskRequest,
  idempotencyKey: string,
): Promise<TaskCreated> {
  return c.json<TaskCreated>("POST", "/api/analysis-tasks", {
    json: body,
    headers: { "idempotency-key": idempotencyKey },
  });
}

/** `once`: asked once, not tried again (the event stream's loop does its own retrying). */
export const taskGet = (c: ApiClient, taskId: string, signal?: AbortSignal, once = false) =>
  c.get<Task>(`/api/analysis-tasks/${enc(taskId)}`, undefined, signal, once);

export const taskPage = (c: ApiClient, q: TaskListParams, signal?: AbortSignal) =>
  c.get<PageOf<Task>>("/api/analysis-tasks", { ...q }, signal);

/** Every run of a task (with `status`, only those), in run id order. */
export const runsOf = (c: ApiClient, taskId: string, status?: RunStatus, signal?: AbortSignal) =>
  allPages<Run>(c, `/api/analysis-tasks/${enc(taskId)}/runs`, { status }, signal);

export const taskCancel = (c: ApiClient, taskId: string, signal?: AbortSignal) =>
  c.json<CancelAccepted>("POST", `/api/analysis-tasks/${enc(taskId)}/cancel`, {
    ...(signal === undefined ? {} : { signal }),
  });

export const logsPage = (
  c: ApiClient,
  taskId: string,
  after: string | null,
  limit = 1000,
  signal?: AbortSignal,
  once = false,
) =>
  c.get<LogsPage>(
    `/api/analysis-tasks/${enc(taskId)}/logs`,
    { limit, after: after ?? undefined },
    signal,
    once,
  );

export const runOutputs = async (c: ApiClient, taskId: string, runId: string, signal?: AbortSignal) =>
  (
    await c.get<{ items: Output[] }>(
      `/api/analysis-tasks/${enc(taskId)}/runs/${enc(runId)}/outputs`,
      undefined,
      signal,
    )
  ).items;

export const outputPath = (taskId: string, runId: string, name: string) =>
  `/api/analysis-tasks/${enc(taskId)}/runs/${enc(runId)}/outputs/${enc(name)}`;

export const resultsCsvPath = (taskId: string) => `/api/analysis-tasks/${enc(taskId)}/results.csv`;
