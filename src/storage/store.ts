// The object store: where uploaded files and analysis outputs live, by key. Two backends implement it
// — a local directory (`local.ts`) and any S3-compatible service (`s3.ts`) — and pass one contract test
// suite (test/integration/storage.test.ts). Nothing outside src/storage/ knows which one it talks to,
// except through `localPath`, which only a local store offers (programs then read inputs in place).
//
// Keys are made by the service, never taken from a user: `files/<fileId>` and
// `outputs/<taskId>/<runId>.<attempt>.<leaseToken>/<name>`.
import { createHash } from "node:crypto";
import os from "node:os";
import { type Readable, Transform } from "node:stream";
import { singleFlight } from "../single-flight.ts";

export class PayloadTooLargeError extends Error {
  readonly limit: number;

  constructor(limit: number) {
    super(`payload exceeds ${limit} bytes`);
    this.name = "PayloadTooLargeError";
    this.limit = limit;
  }
}

/**
 * The body being stored failed by itself (cut off, malformed multipart): the sender's fault, not the
 * store's. `cause` is the body's error.
 */
export class SourceError extends Error {
  constructor(cause: unknown) {
    super(`the body failed: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
    this.name = "SourceError";
  }
}

/**
 * Remembers which stream of a put failed first. When one stream of a pipeline fails, the pipeline
 * destroys the others with the same error, so the error alone does not say whose fault it was (a full
 * disk would look like a malformed body): the first `error` event does. Listeners are attached before
 * the pipeline's, so they see the origin first.
 */
export function watchPut(
  source: Readable,
  ours: readonly NodeJS.EventEmitter[],
): (fallback: unknown) => unknown {
  let first: { fromSource: boolean; err: unknown } | undefined =
    source.errored === null ? undefined : { fromSource: true, err: source.errored };
  source.once("error", (err) => (first ??= { fromSource: true, err }));
  for (const s of ours) s.once("error", (err) => (first ??= { fromSource: false, err }));
  /** The error a failed put throws: a SourceError when the body failed first, else what failed first. */
  return (fallback) => {
    if (first === undefined) return fallback;
    return first.fromSource ? new SourceError(first.err) : first.err;
  };
}

/**
 * The disk is full (ENOSPC) or the user's quota on it is (EDQUOT): the server has no room, which is
 * neither the request's fault nor a bug, and passes once space is freed.
 */
export function isNoSpace(err: unknown): boolean {
  const { code, errno } = (err ?? {}) as NodeJS.ErrnoException;
  // libuv has no name for EDQUOT: Node calls it UNKNOWN, with the system's errno (-122 on Linux).
  return code === "ENOSPC" || code === "EDQUOT" || (errno !== undefined && errno === -EDQUOT);
}

const EDQUOT = os.constants.errno.EDQUOT ?? Number.NaN;

/**
 * The store's settings cannot work, whatever time does (no region for the AWS SDK, the bucket in
 * another region than the one set): start-up says so and exits, as for a database's wrong password,
 * instead of waiting for the store for ever.
 */
export class StoreConfigError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "StoreConfigError";
  }
}

/**
 * The store could not be used when an attempt needed it (not answering, refusing connections, its
 * bucket gone): no fault of the run's, and it passes when the store is back. The worker puts the run
 * back with its attempt refunded and holds its claims (queue/outcomes.ts, Worker.holdClaims). Made
 * only by storeFault(), which has asked the store itself first.
 */
export class StoreUnavailableError extends Error {
  constructor(cause: unknown) {
    super(`the object store cannot be used: ${cause instanceof Error ? cause.message : String(cause)}`, {
      cause,
    });
    this.name = "StoreUnavailableError";
  }
}

/** Some incomplete uploads could not be judged this pass; `aborted`, how many others were ended. */
export class IncompleteUploadsError extends Error {
  override name = "IncompleteUploadsError";
  readonly aborted: number;
  constructor(message: string, aborted: number, options?: ErrorOptions) {
    super(message, options);
    this.aborted = aborted;
  }
}

/** Each store's check (storeFault), one at a time: the failures that meet an outage together share one. */
const checks = new WeakMap<Pick<ObjectStore, "check">, () => Promise<void>>();

/** `store.check()`, or the one already in flight: an outage sends one check, not one per failure. */
function sharedCheck(store: Pick<ObjectStore, "check">): Promise<void> {
  let check = checks.get(store);
  if (check === undefined) {
    check = singleFlight(() => store.check());
    checks.set(store, check);
  }
  return check();
}

/**
 * What an attempt's failed store operation (an input's fetch, an output's put) throws: a
 * StoreUnavailableError when the store, asked at once (its check(): one listing, bounded by its own
 * timeout), cannot be used either; else `err` as it is — the store answers, so the failure is this
 * object's or this request's (retried as any thrown error, its attempt counted). Without the check a
 * store down for 15 s failed every queued run within seconds: each claim failed at once, its three
 * attempts used up 1 s and 2 s apart (a user's trial, 2026-12-07). `err` as it is too when `signal` has
 * aborted (a cancel or timeout decides then) and for a full store (isNoSpace: a hold of its own).
 */
export async function storeFault(
  store: Pick<ObjectStore, "check">,
  err: unknown,
  signal?: AbortSignal,
): Promise<unknown> {
  if (signal?.aborted || isNoSpace(err) || err instanceof StoreUnavailableError) return err;
  try {
    await sharedCheck(store);
    return err;
  } catch {
    return signal?.aborted ? err : new StoreUnavailableError(err);
  }
}

/** The key names no object. */
export class ObjectMissingError extends Error {
  readonly key: string;

  constructor(key: string) {
    super(`no object ${JSON.stringify(key)}`);
    this.name = "ObjectMissingError";
    this.key = key;
  }
}

export interface PutResult {
  sizeBytes: number;
  sha256: string;
}

/** Counts and hashes what passes; fails past `maxBytes`. */
export function meter(maxBytes: number) {
  const hash = createHash("sha256");
  let size = 0;
  const stream = new Transform({
    transform(chunk: Buffer, _enc, done) {
      size += chunk.length;
      if (size > maxBytes) return done(new PayloadTooLargeError(maxBytes));
      hash.update(chunk);
      done(null, chunk);
    },
  });
  return { stream, result: (): PutResult => ({ sizeBytes: size, sha256: hash.digest("hex") }) };
}

export interface ObjectInfo {
  key: string;
  size: number;
  modified: Date;
}

/**
 * Some bytes of an object, as an HTTP `Range` names them: from `start` to `end` (inclusive; past the
 * last byte or absent, to the last byte), or the last `suffix` bytes (the whole object when it is
 * shorter). Safe non-negative integers, `end` not below `start`.
 */
export type ByteRange = { start: number; end?: number } | { suffix: number };

/**
 * A range that selects no byte of the object (it starts at or past its end, a suffix of 0, any range
 * of an empty object): `size` is the object's, which a 416's `Content-Range` names.
 */
export class RangeNotSatisfiableError extends Error {
  readonly size: number;

  constructor(key: string, size: number) {
    super(`no byte of ${JSON.stringify(key)} (${size} bytes) is in the range asked`);
    this.name = "RangeNotSatisfiableError";
    this.size = size;
  }
}

/** Where a range falls in an object of `size` bytes (first and last byte); undefined when it selects none. */
export function rangeIn(range: ByteRange, size: number): { start: number; end: number } | undefined {
  if ("suffix" in range) {
    return range.suffix > 0 && size > 0
      ? { start: Math.max(0, size - range.suffix), end: size - 1 }
      : undefined;
  }
  if (range.start >= size) return undefined;
  return { start: range.start, end: Math.min(range.end ?? size - 1, size - 1) };
}

export interface OpenObject {
  stream: Readable;
  /** The whole object's size, also when only a range of it is read. */
  size: number;
  /** The bytes `stream` holds (first and last) when a range was asked; undefined: the whole object. */
  range?: { start: number; end: number };
}

export interface ObjectStore {
  /** `local` or `s3`, for logs and readiness messages. */
  readonly kind: string;
  /**
   * Streams `source` to `key` while hashing and counting it, never whole in memory. Nothing is visible
   * under `key` unless every byte was written. Over `maxBytes`: PayloadTooLargeError, and nothing is
   * left behind (a multipart upload is aborted).
   */
  put(key: string, source: Readable, maxBytes?: number): Promise<PutResult>;
  /** Writes a local file under `key`. */
  putFile(key: string, file: string): Promise<void>;
  /**
   * Opens `key` for reading; ObjectMissingError when there is no such object. With `range`, only those
   * bytes are read — the store starts at the range's first byte, never reading what comes before —
   * and `range` of the result says which; RangeNotSatisfiableError when it selects no byte.
   */
  open(key: string, o?: { range?: ByteRange }): Promise<OpenObject>;
  /**
   * The size and modification time of `key`'s object, without opening it (a HeadObject on S3): what a
   * download needs to answer a conditional request before it opens a body it might not send.
   * ObjectMissingError when there is no such object.
   */
  stat(key: string): Promise<ObjectInfo>;
  /**
   * Copies `key` into the local file `file` (created or replaced). `signal` ends a download in
   * progress (a run cancelled or timed out while its input arrives; the local store, a copy on one
   * disk, looks at it only before it starts): it fails then, with the
   * signal's reason or an AbortError (callers read the signal, not the error); what it wrote of
   * `file` is the caller's to delete.
   */
  download(key: string, file: string, signal?: AbortSignal): Promise<void>;
  /**
   * Deletes these keys; keys without an object are fine. `signal` ends a delete in progress (a store
   * that does not answer): it fails then, and what it deleted so far stays deleted.
   */
  delete(keys: readonly string[], o?: { signal?: AbortSignal }): Promise<void>;
  /** Deletes every object whose key starts with `prefix` (which must end with `/`); returns how many. */
  deletePrefix(prefix: string): Promise<number>;
  /** Objects whose key starts with `prefix`, in key order, after `after`, at most `limit` (default 1000). */
  list(prefix: string, o?: { after?: string; limit?: number }): Promise<ObjectInfo[]>;
  /** Throws, with the cause, when the store cannot be reached. */
  check(): Promise<void>;
  /**
   * Ends uploads started before `olderThan` that never completed (a process killed mid-upload):
   * partial files of a local store, incomplete multipart uploads of a bucket, which take space (and
   * are billed) but are not objects, so no listing shows them. Returns how many.
   */
  abortIncompleteUploads(olderThan: Date): Promise<number>;
  /** The local file of `key`, when the store is a local directory; absent on remote stores. */
  localPath?(key: string): string;
}

// Output names may hold capitals (runner/outputs.ts SAFE_NAME): every name the runner accepts must be
// a key the store accepts, or a program's success would fail at publication.
const KEY_SHAPE = /^[A-Za-z0-9][A-Za-z0-9._/-]*$/;

/** Refuses keys that are not the service's own shape: no `..`, no empty segment, no leading `/`. */
export function checkKey(key: string): string {
  const parts = key.split("/");
  if (!KEY_SHAPE.test(key) || parts.some((p) => p === "" || p === "." || p === "..")) {
    throw new Error(`invalid storage key: ${JSON.stringify(key)}`);
  }
  return key;
}

/**
 * Whether the store takes `key` (checkKey). A listing may show objects the service never names (`out
 * (1).json`, a copy made by hand in a local store's folder, a foreign object in a bucket): whoever
 * deletes what it listed leaves those alone, or the store's delete refuses the whole batch.
 */
export function isStoreKey(key: string): boolean {
  try {
    checkKey(key);
    return true;
  } catch {
    return false;
  }
}

/** A prefix to list or delete under: a key shape ending with `/`. */
export function checkPrefix(prefix: string): string {
  if (!prefix.endsWith("/")) throw new Error(`a prefix must end with "/": ${JSON.stringify(prefix)}`);
  checkKey(prefix.slice(0, -1));
  return prefix;
}

/**
 * The folders every key of the service is under. Whatever else a bucket holds (with an empty
 * ASSAY_S3_PREFIX, Assay shares its root with other tools) is not ours to sweep.
 */
export const KEY_PREFIXES = ["files/", "outputs/"] as const;

/** The storage key of an output file: `outputs/<outputKey>/<name>` (outputKey as runs.output_key has it). */
export const outputObjectKey = (outputKey: string, name: string) => `outputs/${outputKey}/${name}`;

/** The prefix of every output object of a task. */
export const taskOutputsPrefix = (taskId: string | number) => `outputs/${taskId}/`;
