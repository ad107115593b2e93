// The object store on an S3-compatible service (`ASSAY_STORAGE=s3`: AWS S3, MinIO, Cloudflare R2, Ceph
// RGW). Requests are signed by the AWS SDK; credentials come from its default chain (environment,
// profile, instance role) and never pass through our configuration, logs, or an analysis process's
// environment. Imported only when configured: the SDK costs start-up time and memory.
import fs from "node:fs";
import type { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import {
  AbortMultipartUploadCommand,
  DeleteObjectsCommand,
  GetObjectCommand,
  HeadBucketCommand,
  ListMultipartUploadsCommand,
  ListObjectsV2Command,
  NoSuchKey,
  NoSuchUpload,
  S3Client,
  S3ServiceException,
} from "@aws-sdk/client-s3";
import { Upload } from "@aws-sdk/lib-storage";
import { meter } from "./local.ts";
import {
  checkKey,
  checkPrefix,
  KEY_PREFIXES,
  type ObjectInfo,
  ObjectMissingError,
  type ObjectStore,
  type OpenObject,
  type PutResult,
  watchPut,
} from "./store.ts";

export interface S3StoreOptions {
  bucket: string;
  /** Prepended to every key (e.g. `assay/`); empty for the bucket's root. */
  prefix?: string;
  endpoint?: string;
  region?: string;
  forcePathStyle?: boolean;
}

/** DeleteObjects takes at most this many keys. */
const DELETE_BATCH = 1000;

export class S3Store implements ObjectStore {
  readonly kind = "s3";
  readonly client: S3Client;
  private readonly bucket: string;
  private readonly prefix: string;

  constructor(o: S3StoreOptions) {
    this.bucket = o.bucket;
    this.prefix = o.prefix ? (o.prefix.endsWith("/") ? o.prefix : `${o.prefix}/`) : "";
    this.client = new S3Client({
      ...(o.region ? { region: o.region } : {}),
      ...(o.endpoint ? { endpoint: o.endpoint } : {}),
      forcePathStyle: o.forcePathStyle ?? false,
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
      throw thrown;
    }
    await piped;
    return m.result();
  }

  async putFile(key: string, file: string): Promise<void> {
    const upload = new Upload({
      client: this.client,
      params: { Bucket: this.bucket, Key: this.full(key), Body: fs.createReadStream(file) },
    });
    await upload.done();
  }

  async open(key: string): Promise<OpenObject> {
    try {
      const res = await this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: this.full(key) }));
      const stream = res.Body as Readable;
      if (res.ContentLength === undefined) {
        // A server that streams without a length: a download would promise 0 bytes and send more.
        stream.destroy();
        throw new Error(`the store sent ${JSON.stringify(key)} without a Content-Length`);
      }
      return { stream, size: res.ContentLength };
    } catch (err) {
      throw isMissing(err) ? new ObjectMissingError(key) : err;
    }
  }

  async download(key: string, file: string): Promise<void> {
    const { stream } = await this.open(key);
    await pipeline(stream, fs.createWriteStream(file));
  }

  async delete(keys: readonly string[]): Promise<void> {
    for (let i = 0; i < keys.length; i += DELETE_BATCH) {
      const batch = keys.slice(i, i + DELETE_BATCH);
      const res = await this.client.send(
        new DeleteObjectsCommand({
          Bucket: this.bucket,
          Delete: { Objects: batch.map((k) => ({ Key: this.full(k) })), Quiet: true },
        }),
      );
      const failed = (res.Errors ?? []).filter((e) => e.Code !== "NoSuchKey");
      if (failed.length > 0) {
        throw new Error(
          `could not delete ${failed.length} objects: ${failed[0]?.Code} ${failed[0]?.Message}`,
        );
      }
    }
  }

  async deletePrefix(prefix: string): Promise<number> {
    checkPrefix(prefix);
    let n = 0;
    for (;;) {
      const page = await this.list(prefix, { limit: DELETE_BATCH });
      if (page.length === 0) return n;
      await this.delete(page.map((o) => o.key));
      n += page.length;
    }
  }

  async list(prefix: string, o: { after?: string; limit?: number } = {}): Promise<ObjectInfo[]> {
    const res = await this.client.send(
      new ListObjectsV2Command({
        Bucket: this.bucket,
        Prefix: `${this.prefix}${prefix}`,
        MaxKeys: o.limit ?? 1000,
        ...(o.after === undefined ? {} : { StartAfter: `${this.prefix}${o.after}` }),
      }),
    );
    return (res.Contents ?? []).map((c) => ({
      key: (c.Key ?? "").slice(this.prefix.length),
      size: c.Size ?? 0,
      modified: c.LastModified ?? new Date(0),
    }));
  }

  async check(): Promise<void> {
    await this.client.send(new HeadBucketCommand({ Bucket: this.bucket }));
  }

  /**
   * Only uploads under the service's own keys: with an empty prefix the bucket's root may hold other
   * tools' uploads, which are not ours to end. At most 10 pages of uploads per key prefix and call (one
   * sweep pass); the next pass goes on.
   */
  async abortIncompleteUploads(olderThan: Date): Promise<number> {
    let aborted = 0;
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
          if (await this.abortUpload(u.Key, u.UploadId)) aborted++;
        }
        if (!res.IsTruncated) break;
        markers = {
          ...(res.NextKeyMarker ? { KeyMarker: res.NextKeyMarker } : {}),
          ...(res.NextUploadIdMarker ? { UploadIdMarker: res.NextUploadIdMarker } : {}),
        };
      }
    }
    return aborted;
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

function isMissing(err: unknown): boolean {
  if (err instanceof NoSuchKey) return true;
  return err instanceof S3ServiceException && err.$metadata.httpStatusCode === 404;
}
