// Error codes and their public messages. A response carries only the stable message of its code;
// the cause is logged, never returned.
export const PUBLIC_MESSAGES = {
  VALIDATION_FAILED: "The request is invalid.",
  INVALID_JSON: "The request body is not valid JSON.",
  INVALID_MULTIPART: "The request body is not valid multipart/form-data.",
  BAD_REQUEST: "The request could not be processed.",
  UNAUTHORIZED: "A valid bearer token is required.",
  NOT_FOUND: "No such route.",
  METHOD_NOT_ALLOWED: "The route does not take this method.",
  FILE_NOT_FOUND: "The file does not exist.",
  ANALYSIS_TYPE_UNSUPPORTED: "The analysis type is not supported.",
  ANALYSIS_TASK_NOT_FOUND: "The analysis task does not exist.",
  ANALYSIS_TASK_ALREADY_FINISHED: "The analysis task has already finished.",
  ANALYSIS_TASK_NOT_READY: "The analysis task has no output to download yet.",
  OUTPUT_NOT_FOUND: "The run has no output of that name.",
  RANGE_NOT_SATISFIABLE: "The requested range is not satisfiable.",
  IDEMPOTENCY_KEY_REUSED: "The Idempotency-Key was already used for a different request.",
  PAYLOAD_TOO_LARGE: "The upload exceeds the size limit.",
  TOO_MANY_STREAMS: "Too many event streams are open.",
  UNSUPPORTED_MEDIA_TYPE: "The content type is not supported.",
  NOT_READY: "The service is not ready.",
  STORAGE_FULL: "The server has no room to store this file.",
  ANALYSIS_OUTPUT_MISSING: "This run's output is missing from the store; an administrator must restore it.",
  INTERNAL_ERROR: "An internal error occurred.",
} as const;

export type ErrorCode = keyof typeof PUBLIC_MESSAGES;

export class ApiError extends Error {
  readonly statusCode: number;
  readonly code: ErrorCode;
  /** Public detail; defaults to the code's stable message. Never put a cause here. */
  readonly publicMessage: string;

  constructor(
    statusCode: number,
    code: ErrorCode,
    publicMessage: string = PUBLIC_MESSAGES[code],
    /** What went wrong underneath: logged, never returned. */
    cause?: unknown,
  ) {
    super(`${code}: ${publicMessage}`, cause === undefined ? undefined : { cause });
    this.name = "ApiError";
    this.statusCode = statusCode;
    this.code = code;
    this.publicMessage = publicMessage;
  }
}

export const notFound = (
  code: "FILE_NOT_FOUND" | "NOT_FOUND" | "ANALYSIS_TASK_NOT_FOUND" | "OUTPUT_NOT_FOUND",
) => new ApiError(404, code);
/**
 * A request refused because the database does not answer (DatabaseGate): 503 NOT_READY, and
 * `Retry-After` on `reply`.
 */
export function databaseUnavailable(reply: { header(name: string, value: string): unknown }): ApiError {
  reply.header("retry-after", "2");
  return new ApiError(503, "NOT_READY", "The database is not answering; try again shortly.");
}
/**
 * A request refused because the object store cannot be used (a store call failed, and so did its
 * check: storeFault): 503 NOT_READY, and `Retry-After` on `reply`.
 */
export function storeUnavailable(
  reply: { header(name: string, value: string): unknown },
  cause: unknown,
): ApiError {
  reply.header("retry-after", "2");
  return new ApiError(
    503,
    "NOT_READY",
    "The object store cannot be used right now; try again shortly.",
    cause,
  );
}
export const validationFailed = (detail: string) => new ApiError(400, "VALIDATION_FAILED", detail);

/** A size limit as people read it: "100 MiB" for a whole number of MiB, "64 KiB" of KiB below 1 MiB, else bytes. */
export const limitText = (bytes: number) =>
  bytes % 1048576 === 0
    ? `${bytes / 1048576} MiB`
    : bytes < 1048576 && bytes % 1024 === 0
      ? `${bytes / 1024} KiB`
      : `${bytes} ${bytes === 1 ? "byte" : "bytes"}`;

/**
 * 413 for an upload over ASSAY_MAX_UPLOAD_BYTES, naming the limit (until 2026-12-07 "exceeds the size
 * limit", which left a user to guess it).
 */
export const uploadTooLarge = (limit: number) =>
  new ApiError(
    413,
    "PAYLOAD_TOO_LARGE",
    `The upload exceeds this server's limit of ${limitText(limit)} per file.`,
  );

/** 413 for a body other than an upload's (a task's create) over its route's limit. */
export const bodyTooLarge = (limit: number) =>
  new ApiError(
    413,
    "PAYLOAD_TOO_LARGE",
    `The request body exceeds this server's limit of ${limitText(limit)}.`,
  );

/**
 * PostgreSQL's disk_full (SQLSTATE 53100): the database could not write the row — the server's lack of
 * room, answered 507 STORAGE_FULL like a full disk under the store, never a bug's 500. Its
 * out_of_memory (53200) is not: memory comes back by itself, and "no room to store" would be untrue.
 */
export const isDatabaseFull = (err: unknown): boolean =>
  err instanceof Error && err.name === "PostgresError" && (err as { code?: unknown }).code === "53100";
