// The object store on an S3-compatible service (`ASSAY_STORAGE=s3`: AWS S3, MinIO, Cloudflare R2, Ceph
// RGW). Requests are signed by the AWS SDK; credentials come from its default chain (environment,
// profile, instance role) and never pass through our configuration, logs, or an analysis process's
// environment. Imported only when configured: the SDK costs start-up time and memory.
import fs from "node:fs";
import { type Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import {
  AbortMultipartUploadCommand,
  DeleteObjectsCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListMultipartUploadsCommand,
  ListObjectsV2Command,
  ListPartsCommand,
  type ListPartsCommandOutput,
  NoSuchKey,
  NoSuchUpload,
  S3Client,
  S3ServiceException,
} from "@aws-sdk/client-s3";
import { Upload } from "@aws-sdk/lib-storage";
import {
  type ByteRange,
  checkKey,
  checkPrefix,
  IncompleteUploadsError,
  KEY_PREFIXES,
  meter,
  type ObjectInfo,
  ObjectMissingError,
  type ObjectStore,
  type OpenObject,
  type PutResult,
  RangeNotSatisfiableError,
  rangeIn,
  StoreConfigError,
  watchPut,
} from "./store.ts";

export interface S3StoreOptions {
  bucket: string;
  /** Prepended to every key (e.g. `assay/`); empty for the bucket's root. */
  prefix?: string;
  endpoint?: string;
  region?: string;
  forcePathStyle?: boolean;
  /** How long a connection may take to open (default CONNECT_TIMEOUT_MS). */
  connectTimeoutMs?: number;
  /**
   * How long a request may wait for its response to begin, counted from its start: sending its body
   * is inside it (default RESPONSE_TIMEOUT_MS).
   */
  responseTimeoutMs?: number;
  /** How long check() waits for an answer, retries included (default CHECK_TIMEOUT_MS). */
  checkTimeoutMs?: number;
  /** How long download() waits for more of a body that stopped arriving (default BODY_IDLE_TIMEOUT_MS). */
  bodyIdleTimeoutMs?: number;
}

/** DeleteObjects takes at most this many keys; ListObjectsV2 returns at most this many per page. */
const DELETE_BATCH = 1000;
const LIST_PAGE = 1000;

/**
 * Without timeouts the SDK waits forever for a server that accepted the connection but never answers
 * (an overloaded proxy, a hung gateway): start-up waited without a word, and a worker's input download
 * held its slot and lease for good — the run's timeout aborts the program, not the download. The
 * response timeout ends at the response's headers, never during a body (a download to a slow client
 * may pause for long); a request that times out is retried by the SDK like any transient failure.
 */
const CONNECT_TIMEOUT_MS = 10_000;
/** Generous: a part of a multipart upload (5 MiB) is sent within it, at ~350 kbit/s or faster. */
const RESPONSE_TIMEOUT_MS = 120_000;
/** check() answers /readyz and start-up: it must not wait for three slow attempts. */
const CHECK_TIMEOUT_MS = 10_000;
/** See download(). */
const BODY_IDLE_TIMEOUT_MS = 60_000;

export class S3Store implements ObjectStore {
  readonly kind = "s3";
  readonly client: S3Client;
  private readonly bucket: string;
  private readonly prefix: string;
  /** Where the bucket is, for error messages: the endpoint's origin (never its user or password). */
  private readonly where: string;
  private readonly checkTimeoutMs: number;
  private readonly bodyIdleTimeoutMs: number;

  constructor(o: S3StoreOptions) {
    this.bucket = o.bucket;
    this.prefix = o.prefix ? (o.prefix.endsWith("/") ? o.prefix : `${o.prefix}/`) : "";
    this.where = o.endpoint
      ? ` at ${URL.canParse(o.endpoint) ? new URL(o.endpoint).origin : "the endpoint"}`
      : "";
    this.checkTimeoutMs = o.checkTimeoutMs ?? CHECK_TIMEOUT_MS;
    this.bodyIdleTimeoutMs = o.bodyIdleTimeoutMs ?? BODY_IDLE_TIMEOUT_MS;
    this.client = new S3Client({
      ...(o.region ? { region: o.region } : {}),
      ...(o.endpoint ? { endpoint: o.endpoint } : {}),
      forcePathStyle: o.forcePathStyle ?? false,
      requestHandler: {
        connectionTimeout: o.connectTimeoutMs ?? CONNECT_TIMEOUT_MS,
        requestTimeout: o.responseTimeoutMs ?? RESPONSE_TIMEOUT_MS,
        throwOnRequestTimeout: true,
      },
    });
  }

  private full(key: string): string {
    return `${this.prefix}${checkKey(key)}`;
  }

  async put(key: string, source: Readable, maxBytes = Number.POSITIVE_INFINITY): Promise<PutResult> {
    const m = meter(maxBytes);
    // lib-storage sends small bodies with one PutObject and large ones as a multipart upload, which it
    // aborts when the body fails (leavePartsOnError is false): an upload that is cut off, or that
    // grows past maxBytes, leaves nothing in the bucket.
    const upload = new Upload({
      client: this.client,
      params: { Bucket: this.bucket, Key: this.full(key), Body: m.stream },
    });
    // pipeline() destroys the source when the meter fails (too large) and the meter when the source
    // fails; the upload sees either as a failed body. If the upload fails by itself, the meter is
    // destroyed so that the pipeline (and the source) end too. At most a few parts are in memory.
    // What failed first decides the error: the body (SourceError), the meter (too large), or the
    // store by itself (its own error). Decided before the meter is destroyed, which fails the source.
    const failure = watchPut(source, [m.stream]);
    const piped = pipeline(source, m.stream);
    // Handled at once: when the body fails (or grows too large) while parts are in flight, the pipeline
    // rejects long before upload.done() settles — it waits for those parts and the abort — and an
    // unhandled rejection would end the process. Its error is still awaited and mapped below.
    piped.catch(() => {});
    try {
      await upload.done();
    } catch (err) {
      const thrown = failure(err);
      m.stream.destroy();
      await piped.catch(() => {});
      throw this.noRoomAs(thrown);
    }
    await piped;
    return m.result();
  }

  async putFile(key: string, file: string): Promise<void> {
    const upload = new Upload({
      client: this.client,
      params: { Bucket: this.bucket, Key: this.full(key), Body: fs.createReadStream(file) },
    });
    await upload.done().catch((err: unknown) => {
      throw this.noRoomAs(err);
    });
  }

  /**
   * A bucket whose server has no room — its disks are full, or a quota set on it (or on its user) is
   * reached — as a full disk's error (code ENOSPC, the server's answer its cause), so that it is
   * answered as a full local store is: an upload's 507 STORAGE_FULL (http/routes/files.ts), a run's
   * ANALYSIS_STORAGE_FULL (queue/outcomes.ts). Until 2026-12-06 an upload got a 500 for it, as for a
   * bug, and a quota's refusal (NO_ROOM_CODES: Ceph's QuotaExceeded, MinIO's bucket quota) too until
   * later that day. Any other error is returned as it is.
   */
  private noRoomAs(err: unknown): unknown {
    if (!(err instanceof S3ServiceException)) return err;
    const code = (err as { Code?: unknown }).Code;
    if (
      !NO_ROOM_CODES.has(err.name) &&
      !(typeof code === "string" && NO_ROOM_CODES.has(code)) &&
      err.$metadata?.httpStatusCode !== 507
    )
      return err;
    return Object.assign(new Error(`the store${this.where} has no room left (${err.name})`, { cause: err }), {
      code: "ENOSPC",
    });
  }

  /**
   * A range is GetObject's `Range`, and what the server sends is checked against its Content-Range,
   * so the stream never holds other bytes than `range` says: some S3-compatible servers read
   * `bytes=-n` as `bytes=0-n` (s3rver does), so a range answered with other bytes is asked again as the
   * first and last byte it names, and a second wrong answer gets the whole object (no `range`), as
   * from a server that ignores ranges.
   */
  async open(key: string, o: { range?: ByteRange; signal?: AbortSignal } = {}): Promise<OpenObject> {
    for (let asked = o.range; ; ) {
      const res = await this.get(key, asked, o.signal);
      const stream = res.Body as Readable;
      if (res.ContentLength === undefined) {
        // A server that streams without a length: a download would promise 0 bytes and send more.
        stream.destroy();
        throw new Error(`the store sent ${JSON.stringify(key)} without a Content-Length`);
      }
      if (!o.range) return { stream, size: res.ContentLength };
      // No Content-Range: the server ignored the range and sends the whole object.
      const got = res.ContentRange === undefined ? undefined : contentRange(res.ContentRange);
      const size = got ? got.size : res.ContentLength;
      const want = rangeIn(o.range, size);
      if (!want || (res.ContentRange !== undefined && !got)) {
        stream.destroy();
        if (!want) throw new RangeNotSatisfiableError(key, size);
        throw new Error(`the store sent ${JSON.stringify(key)} with a Content-Range of ${res.ContentRange}`);
      }
      if (!got) return { stream, size };
      if (got.start === want.start && got.end === want.end && res.ContentLength === want.end - want.start + 1)
        return { stream, size, range: want };
      stream.destroy();
      if (asked === undefined) {
        throw new Error(`the store sent bytes ${res.ContentRange} of ${JSON.stringify(key)} unasked`);
      }
      // Asked again for exactly the bytes the server should have sent; when it sends others again
      // (s3rver answers `bytes=0-0` with the whole object), the whole object: a server may ignore a range.
      const exact = !("suffix" in asked) && asked.start === want.start && asked.end === want.end;
      asked = exact ? undefined : want;
    }
  }

  /** GetObject of `key`, or of `range` of it. */
  private async get(key: string, range: ByteRange | undefined, signal: AbortSignal | undefined) {
    try {
      return await this.client.send(
        new GetObjectCommand({
          Bucket: this.bucket,
          Key: this.full(key),
          ...(range === undefined
            ? {}
            : {
                Range:
                  "suffix" in range ? `bytes=-${range.suffix}` : `bytes=${range.start}-${range.end ?? ""}`,
              }),
        }),
        signal ? { abortSignal: signal } : {},
      );
    } catch (err) {
      if (isMissing(err)) throw new ObjectMissingError(key);
      if (range === undefined || !isInvalidRange(err)) throw err;
      // 416: the object's size from the error's ActualObjectSize (S3's, s3rver's), else from a HEAD.
      const told = Number((err as { ActualObjectSize?: unknown }).ActualObjectSize ?? Number.NaN);
      throw new RangeNotSatisfiableError(
        key,
        Number.isSafeInteger(told) ? told : (await this.stat(key, signal)).size,
      );
    }
  }

  /** A HeadObject: no body is opened. */
  async stat(key: string, signal?: AbortSignal): Promise<ObjectInfo> {
    try {
      const res = await this.client.send(
        new HeadObjectCommand({ Bucket: this.bucket, Key: this.full(key) }),
        signal ? { abortSignal: signal } : {},
      );
      if (res.ContentLength === undefined)
        throw new Error(`the store told no size of ${JSON.stringify(key)}`);
      return { key, size: res.ContentLength, modified: res.LastModified ?? new Date(0) };
    } catch (err) {
      // A HEAD's 404 has no body to say whose (NoSuchKey or NoSuchBucket): taken for the object's, as
      // a missing bucket is what check() reports (readiness, start-up, and a download link's maker
      // before it reports a lost output: heldOrMissing in http/routes/downloads.ts).
      throw (err as { name?: string }).name === "NotFound" || isMissing(err)
        ? new ObjectMissingError(key)
        : err;
    }
  }

  /**
   * A body that stops arriving (a gateway that stalls mid-object, the connection half-dead) is given
   * up after bodyIdleTimeoutMs without a byte: a run's signal ends its own download, but a run without
   * a timeout would otherwise hold its slot, and its heartbeated lease, for good. Only here: the reader
   * is a local file, so a pause is the store's. Streams from open() may pause for as long as their
   * reader (a slow client) does.
   */
  async download(key: string, file: string, signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    const { stream } = await this.open(key, signal ? { signal } : {});
    const idleMs = this.bodyIdleTimeoutMs;
    const watchdog = new Transform({
      transform(chunk: Buffer, _enc, done) {
        timer.refresh();
        done(null, chunk);
      },
    });
    const timer = setTimeout(() => {
      watchdog.destroy(new Error(`the store sent nothing of ${JSON.stringify(key)} for ${idleMs} ms`));
    }, idleMs);
    try {
      await pipeline(stream, watchdog, fs.createWriteStream(file), ...(signal ? [{ signal }] : []));
    } finally {
      clearTimeout(timer);
    }
  }

  async delete(keys: readonly string[], o: { signal?: AbortSignal } = {}): Promise<void> {
    await this.deleteFull(
      keys.map((k) => this.full(k)),
      o.signal,
    );
  }

  /** Deletes these keys of the bucket (prefix included), as they are. */
  private async deleteFull(keys: readonly string[], signal?: AbortSignal): Promise<void> {
    for (let i = 0; i < keys.length; i += DELETE_BATCH) {
      const batch = keys.slice(i, i + DELETE_BATCH);
      const res = await this.client.send(
        new DeleteObjectsCommand({
          Bucket: this.bucket,
          Delete: { Objects: batch.map((k) => ({ Key: k })), Quiet: true },
        }),
        signal ? { abortSignal: signal } : {},
      );
      const failed = (res.Errors ?? []).filter((e) => e.Code !== "NoSuchKey");
      if (failed.length > 0) {
        throw new Error(
          `could not delete ${failed.length} objects: ${failed[0]?.Code} ${failed[0]?.Message}`,
        );
      }
    }
  }

  /**
   * Deletes what the listing shows under the prefix, page after page, as listed: an object under it
   * whose key is not of the service's shape (put there by hand or by another tool) is deleted too, as
   * a local store's deletePrefix removes the folder whole — checking the listed keys again made such a
   * key fail every call, and the prefix's other objects stayed. Each page starts after the last one, so
   * a key a server keeps listing after its deletion cannot hold the loop.
   */
  async deletePrefix(prefix: string): Promise<number> {
    checkPrefix(prefix);
    let n = 0;
    for (let after: string | undefined; ; ) {
      const page = await this.list(prefix, {
        limit: DELETE_BATCH,
        ...(after === undefined ? {} : { after }),
      });
      if (page.length === 0) return n;
      await this.deleteFull(page.map((o) => `${this.prefix}${o.key}`));
      n += page.length;
      after = page.at(-1)?.key;
    }
  }

  /**
   * As many objects as asked for, in as many requests as that takes: a server sends at most 1,000 per
   * request, and a caller that takes a short page for the end (every caller) would stop early.
   */
  async list(prefix: string, o: { after?: string; limit?: number } = {}): Promise<ObjectInfo[]> {
    const limit = o.limit ?? LIST_PAGE;
    const found: ObjectInfo[] = [];
    for (let token: string | undefined; found.length < limit; ) {
      const res = await this.client.send(
        new ListObjectsV2Command({
          Bucket: this.bucket,
          Prefix: `${this.prefix}${prefix}`,
          MaxKeys: Math.min(limit - found.length, LIST_PAGE),
          ...(token !== undefined
            ? { ContinuationToken: token }
            : o.after === undefined
              ? {}
              : { StartAfter: `${this.prefix}${o.after}` }),
        }),
      );
      for (const c of res.Contents ?? []) {
        found.push({
          key: (c.Key ?? "").slice(this.prefix.length),
          size: c.Size ?? 0,
          modified: c.LastModified ?? new Date(0),
        });
      }
      if (!res.IsTruncated || !res.NextContinuationToken) break;
      token = res.NextContinuationToken;
    }
    return found.slice(0, limit);
  }

  /**
   * Throws when the bucket cannot be used, saying why in words (the SDK's own words for a missing
   * bucket, a missing region or a page that is not S3's are no help). It lists one key under the
   * prefix: an answer must be S3's listing of the bucket. HeadBucket, used until 2026-12-06, took any
   * 200 — an ASSAY_S3_ENDPOINT that names a web page (a MinIO console's port, a proxy's default site)
   * passed, uploads were then "stored" into it (a PutObject's 200 has no body to read either) and every
   * run analysed the page it served as its input. A listing under the prefix is also what credentials
   * limited to the prefix (an `s3:prefix` condition) allow, which HeadBucket's request never matches.
   * The cause is kept.
   */
  async check(): Promise<void> {
    let name: string | undefined;
    try {
      const res = await this.client.send(
        new ListObjectsV2Command({ Bucket: this.bucket, Prefix: this.prefix, MaxKeys: 1 }),
        { abortSignal: AbortSignal.timeout(this.checkTimeoutMs) },
      );
      name = res.Name;
    } catch (err) {
      throw this.explained(err);
    }
    if (name !== this.bucket) throw new Error(this.notS3());
  }

  private notS3(): string {
    return `the store${this.where} did not answer as an S3 service: ASSAY_S3_ENDPOINT must be the URL of its S3 API (not of a console or a web page)`;
  }

  private explained(err: unknown): unknown {
    const bucket = JSON.stringify(this.bucket);
    const status = (err as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode;
    const name = (err as { name?: string }).name;
    let message: string | undefined;
    if (status === 404) message = `the bucket ${bucket} does not exist${this.where}`;
    else if (status === 403)
      message = `access to the bucket ${bucket}${this.where} is denied: check the credentials (the AWS SDK's default chain) and what they may do`;
    else if (status === 301 || status === 400) {
      const region =
        (err as { $response?: { headers?: Record<string, string> } }).$response?.headers?.[
          "x-amz-bucket-region"
        ] ?? (err as { Region?: unknown }).Region;
      if (typeof region === "string" && region !== "")
        return new StoreConfigError(
          `the bucket ${bucket} is in the region ${region}: set ASSAY_S3_REGION=${region}`,
          {
            cause: err,
          },
        );
      message = `the store refused to look at the bucket ${bucket}${this.where} (HTTP ${status}): check ASSAY_S3_REGION and ASSAY_S3_FORCE_PATH_STYLE`;
    } else if (status !== undefined && status >= 200 && status < 300)
      // A 2xx whose body the SDK could not read as S3's (an HTML page).
      message = this.notS3();
    else if (name === "AbortError" || name === "TimeoutError")
      message = `the store${this.where} did not answer within ${this.checkTimeoutMs} ms`;
    else if (err instanceof Error && /^Region is missing/.test(err.message))
      return new StoreConfigError("the AWS SDK found no region: set ASSAY_S3_REGION (or AWS_REGION)", {
        cause: err,
      });
    return message === undefined ? err : new Error(message, { cause: err });
  }

  /**
   * Only uploads under the service's own keys: with an empty prefix the bucket's root may hold other
   * tools' uploads, which are not ours to end. At most 10 pages of uploads per key prefix and call (one
   * sweep pass); the next pass goes on. Old means idle since `olderThan`: begun before it and no part
   * written since (an upload's start is all S3 lists, and an upload of tens of GB over a slow link may
   * take longer than the sweep's day; one begun before and still under way was aborted, and its client
   * answered a 500 when it ended).
   */
  async abortIncompleteUploads(olderThan: Date): Promise<number> {
    let aborted = 0;
    // An upload whose parts cannot be listed now (a 500, SlowDown past the SDK's retries) is left for
    // the next pass and the others go on: one such upload stopped every pass at it.
    let unlisted = 0;
    let firstError: unknown;
    for (const keyPrefix of KEY_PREFIXES) {
      let markers: { KeyMarker?: string; UploadIdMarker?: string } = {};
      for (let page = 0; page < 10; page++) {
        const res = await this.client.send(
          new ListMultipartUploadsCommand({
            Bucket: this.bucket,
            Prefix: `${this.prefix}${keyPrefix}`,
            ...markers,
          }),
        );
        for (const u of res.Uploads ?? []) {
          if (!u.Key || !u.UploadId || !u.Initiated || u.Initiated >= olderThan) continue;
          try {
            if (await this.partWrittenSince(u.Key, u.UploadId, olderThan)) continue;
          } catch (err) {
            unlisted++;
            firstError ??= err;
            continue;
          }
          if (await this.abortUpload(u.Key, u.UploadId)) aborted++;
        }
        if (!res.IsTruncated) break;
        markers = {
          ...(res.NextKeyMarker ? { KeyMarker: res.NextKeyMarker } : {}),
          ...(res.NextUploadIdMarker ? { UploadIdMarker: res.NextUploadIdMarker } : {}),
        };
      }
    }
    if (unlisted > 0)
      throw new IncompleteUploadsError(
        `could not list the parts of ${unlisted} incomplete ${unlisted === 1 ? "upload" : "uploads"} (left for the next pass; ${aborted} ended)`,
        aborted,
        { cause: firstError },
      );
    return aborted;
  }

  /**
   * Whether a part of the upload was written at or after `since` (or the upload is gone: nothing to
   * end). A server that cannot list parts (s3rver, some small S3-compatible servers), or credentials
   * that may not, answer with the upload's start alone, as before: false.
   */
  /** Set once the server said it cannot list parts: not asked again for every old upload. */
  private partsUnlisted = false;

  private async partWrittenSince(key: string, uploadId: string, since: Date): Promise<boolean> {
    if (this.partsUnlisted) return false;
    let marker: string | undefined;
    // S3 allows 10,000 parts, listed 1,000 a page.
    for (let page = 0; page < 10; page++) {
      let res: ListPartsCommandOutput;
      try {
        res = await this.client.send(
          new ListPartsCommand({
            Bucket: this.bucket,
            Key: key,
            UploadId: uploadId,
            ...(marker ? { PartNumberMarker: marker } : {}),
          }),
        );
      } catch (err) {
        const name = (err as { name?: string }).name;
        if (err instanceof NoSuchUpload || name === "NoSuchUpload") return true;
        const status = (err as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode;
        if (name === "NotImplemented" || name === "MethodNotAllowed" || status === 405 || status === 501) {
          this.partsUnlisted = true;
          return false;
        }
        // Credentials without s3:ListMultipartUploadParts (docs/operations.md listed only the
        // uploads' listing and abort until 2026-12-07) are judged by the start too — by the code
        // only: another 403 (a signature, a clock off) is a failure, and the upload is kept.
        if (name === "AccessDenied") return false;
        throw err;
      }
      if ((res.Parts ?? []).some((p) => p.LastModified !== undefined && p.LastModified >= since)) return true;
      if (!res.IsTruncated || !res.NextPartNumberMarker) return false;
      marker = res.NextPartNumberMarker;
    }
    return false;
  }

  /** Whether this call ended the upload; false when it was already gone. */
  private async abortUpload(key: string, uploadId: string): Promise<boolean> {
    try {
      await this.client.send(
        new AbortMultipartUploadCommand({ Bucket: this.bucket, Key: key, UploadId: uploadId }),
      );
      return true;
    } catch (err) {
      // Another worker's sweep (or the upload's own completion) got there first: the upload is gone,
      // which is all the sweep wants.
      if (err instanceof NoSuchUpload || (err as { name?: string }).name === "NoSuchUpload") return false;
      throw err;
    }
  }
}

/**
 * Only NoSuchKey: a missing bucket (NoSuchBucket) or a wrong endpoint is a 404 too, but it is the
 * store's failure, not a missing object — taken for one, every run of a worker pointed at a deleted or
 * misnamed bucket failed for good as "the input file is not in storage" instead of being retried (and a
 * download logged a succeeded run's output as missing).
 */
function isMissing(err: unknown): boolean {
  if (err instanceof NoSuchKey) return true;
  return (
    err instanceof S3ServiceException &&
    (err.name === "NoSuchKey" || (err as { Code?: string }).Code === "NoSuchKey")
  );
}

/**
 * The error codes with which S3-compatible servers refuse a write for want of room, whatever their HTTP
 * status (any 507 is taken for one too), each as its server's source documents it:
 * - `XMinioStorageFull` (507): MinIO's drives past their free-space threshold (minio cmd/api-errors.go,
 *   ErrStorageFull).
 * - `XMinioAdminBucketQuotaExceeded` (400): a MinIO bucket's hard quota reached (minio
 *   cmd/api-errors.go, ErrAdminBucketQuotaExceeded, "Bucket quota exceeded").
 * - `QuotaExceeded` (403): a Ceph RGW user or bucket quota reached, of size or of object count (ceph
 *   src/rgw/rgw_common.cc, ERR_QUOTA_EXCEEDED → 403 "QuotaExceeded").
 * - `InsufficientStorageSpace` (403): a Huawei Cloud OBS bucket's storage quota reached (OBS API
 *   reference, "Configuring Bucket Storage Quota" and the error code InsufficientStorageSpace).
 * Looked for and not found documented (2026-12-06): a code of its own for this in SeaweedFS (a bucket
 * over its quota is made read-only by an admin script, and its wiki documents only that writes are then
 * denied), Garage (a quota's refusal is its generic "forbidden", a 403 AccessDenied with a message),
 * Wasabi (its error table has none), Backblaze B2's S3 API (`cap_exceeded` is its native API's) and
 * Cloudflare R2 (no per-bucket storage limit). Those stay 500s: a 403 AccessDenied is not told from a
 * key without the right by its code, and a message is no contract.
 */
const NO_ROOM_CODES = new Set([
  "XMinioStorageFull",
  "XMinioAdminBucketQuotaExceeded",
  "QuotaExceeded",
  "InsufficientStorageSpace",
]);

/** S3's answer to a range that selects no byte of the object. */
function isInvalidRange(err: unknown): boolean {
  return (
    err instanceof S3ServiceException && (err.name === "InvalidRange" || err.$metadata.httpStatusCode === 416)
  );
}

/** `bytes <first>-<last>/<size>` of a Content-Range (checked against the range asked by the caller). */
function contentRange(value: string): { start: number; end: number; size: number } | undefined {
  const m = /^bytes (\d{1,15})-(\d{1,15})\/(\d{1,15})$/.exec(value.trim());
  if (!m) return undefined;
  return { start: Number(m[1]), end: Number(m[2]), size: Number(m[3]) };
}
