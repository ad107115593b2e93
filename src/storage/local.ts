// Object storage by key on a local directory. Keys are server-made (`files/123`), never a user's
// file name; every key is resolved under the root and anything escaping it is refused.
// An S3-compatible backend can implement the same surface later.
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import fsp from "node:fs/promises";
import path from "node:path";
import { type Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";

export class PayloadTooLargeError extends Error {
  constructor(readonly limit: number) {
    super(`payload exceeds ${limit} bytes`);
    this.name = "PayloadTooLargeError";
  }
}

/** Bytes written to a temporary name, not yet visible under any key. */
export interface StagedObject {
  readonly sizeBytes: number;
  readonly sha256: string;
  /** Publishes the bytes under `key` with one atomic rename. */
  commit(key: string): Promise<void>;
  /** Removes the temporary bytes (idempotent). */
  discard(): Promise<void>;
}

const KEY_SHAPE = /^[a-z0-9][a-z0-9._/-]*$/;
/** Uploads in progress, under the root so the final rename stays on one filesystem. */
const PARTIAL_DIR = ".partial";

export class LocalStorage {
  readonly root: string;

  constructor(root: string) {
    this.root = path.resolve(root);
  }

  /** The absolute path of `key`, refusing anything outside the root. */
  resolve(key: string): string {
    if (!KEY_SHAPE.test(key) || key.split("/").some((p) => p === "." || p === "..")) {
      throw new Error(`invalid storage key: ${JSON.stringify(key)}`);
    }
    const full = path.resolve(this.root, key);
    if (!full.startsWith(this.root + path.sep)) throw new Error(`storage key escapes the root: ${key}`);
    return full;
  }

  /**
   * Streams `source` to a temporary file while hashing it. Throws PayloadTooLargeError (after
   * removing what was written) when more than `maxBytes` arrive.
   */
  async stage(source: Readable, maxBytes: number): Promise<StagedObject> {
    const tmpDir = path.join(this.root, PARTIAL_DIR);
    await fsp.mkdir(tmpDir, { recursive: true });
    const tmpPath = path.join(tmpDir, `${Date.now()}-${randomBytes(8).toString("hex")}`);
    const hash = createHash("sha256");
    let size = 0;
    const meter = new Transform({
      transform(chunk: Buffer, _enc, done) {
        size += chunk.length;
        if (size > maxBytes) return done(new PayloadTooLargeError(maxBytes));
        hash.update(chunk);
        done(null, chunk);
      },
    });
    try {
      await pipeline(source, meter, fs.createWriteStream(tmpPath, { flags: "wx", mode: 0o640 }));
    } catch (err) {
      await fsp.rm(tmpPath, { force: true });
      throw err;
    }
    const sha256 = hash.digest("hex");
    return {
      sizeBytes: size,
      sha256,
      commit: async (key) => {
        const target = this.resolve(key);
        await fsp.mkdir(path.dirname(target), { recursive: true });
        await fsp.rename(tmpPath, target);
      },
      discard: () => fsp.rm(tmpPath, { force: true }),
    };
  }

  /**
   * Removes partial uploads older than `olderThanMs`: what a process killed mid-upload left behind.
   * Returns how many were removed.
   */
  async sweepPartials(olderThanMs: number): Promise<number> {
    const dir = path.join(this.root, PARTIAL_DIR);
    const names = await fsp.readdir(dir).catch(() => [] as string[]);
    let removed = 0;
    for (const name of names) {
      const full = path.join(dir, name);
      const stat = await fsp.stat(full).catch(() => undefined);
      if (stat && Date.now() - stat.mtimeMs > olderThanMs) {
        await fsp.rm(full, { force: true });
        removed++;
      }
    }
    return removed;
  }

  open(key: string): fs.ReadStream {
    return fs.createReadStream(this.resolve(key));
  }

  async delete(key: string): Promise<void> {
    await fsp.rm(this.resolve(key), { force: true });
  }

  async exists(key: string): Promise<boolean> {
    return fsp.access(this.resolve(key)).then(
      () => true,
      () => false,
    );
  }
}
