// The object store on a local directory (`ASSAY_STORAGE=local`, the default): a key is a file under
// the root (`$ASSAY_DATA_DIR`). Writes go to `.partial/` first and are published with one rename, so a
// key never names half a file. Programs read inputs in place (`localPath`).
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import fsp from "node:fs/promises";
import path from "node:path";
import { type Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import {
  checkKey,
  checkPrefix,
  type ObjectInfo,
  ObjectMissingError,
  type ObjectStore,
  type OpenObject,
  PayloadTooLargeError,
  type PutResult,
  watchPut,
} from "./store.ts";

export { PayloadTooLargeError } from "./store.ts";

/** Uploads in progress, under the root so the final rename stays on one filesystem. */
const PARTIAL_DIR = ".partial";

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

const missing = (err: unknown) => (err as NodeJS.ErrnoException).code === "ENOENT";

export class LocalStore implements ObjectStore {
  readonly kind = "local";
  readonly root: string;

  constructor(root: string) {
    this.root = path.resolve(root);
  }

  /** The absolute path of `key`, refusing anything outside the root. */
  localPath(key: string): string {
    const full = path.resolve(this.root, checkKey(key));
    if (!full.startsWith(this.root + path.sep)) throw new Error(`storage key escapes the root: ${key}`);
    return full;
  }

  /** The partial folder is made once per store (a folder removed meanwhile is made again). */
  private partialReady = false;

  private async partial(): Promise<string> {
    const dir = path.join(this.root, PARTIAL_DIR);
    if (!this.partialReady || !fs.existsSync(dir)) {
      await fsp.mkdir(dir, { recursive: true });
      this.partialReady = true;
    }
    return path.join(dir, `${Date.now()}-${randomBytes(8).toString("hex")}`);
  }

  /** One rename; the target's folder is made only when it is missing (a put costs no mkdir). */
  private async publish(tmp: string, key: string): Promise<void> {
    const target = this.localPath(key);
    try {
      await fsp.rename(tmp, target);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT" || !fs.existsSync(tmp)) throw err;
      await fsp.mkdir(path.dirname(target), { recursive: true });
      await fsp.rename(tmp, target);
    }
  }

  async put(key: string, source: Readable, maxBytes = Number.POSITIVE_INFINITY): Promise<PutResult> {
    this.localPath(key);
    const tmp = await this.partial();
    const m = meter(maxBytes);
    const file = fs.createWriteStream(tmp, { flags: "wx", mode: 0o640 });
    const failure = watchPut(source, [m.stream, file]);
    try {
      await pipeline(source, m.stream, file).catch((err: unknown) => {
        throw failure(err);
      });
      await this.publish(tmp, key);
    } catch (err) {
      // A source that had failed already fails the pipeline before the file is even open: wait until
      // it is closed, or the removal would run first and the file appear after it.
      if (!file.closed) await new Promise<void>((resolve) => file.once("close", () => resolve()));
      await fsp.rm(tmp, { force: true });
      throw err;
    }
    return m.result();
  }

  async putFile(key: string, file: string): Promise<void> {
    this.localPath(key);
    const tmp = await this.partial();
    try {
      await fsp.copyFile(file, tmp);
      await this.publish(tmp, key);
    } catch (err) {
      await fsp.rm(tmp, { force: true });
      throw err;
    }
  }

  /**
   * Opens the file before returning: a key that is gone is known before anything is sent, and one
   * deleted while it is read is read to its end (the descriptor keeps it). The stream closes the
   * descriptor when it ends or is destroyed.
   */
  async open(key: string): Promise<OpenObject> {
    const handle = await fsp.open(this.localPath(key), "r").catch((err: unknown) => {
      throw missing(err) ? new ObjectMissingError(key) : err;
    });
    try {
      const stat = await handle.stat();
      if (!stat.isFile()) throw new ObjectMissingError(key);
      return { stream: handle.createReadStream(), size: stat.size };
    } catch (err) {
      await handle.close();
      throw err;
    }
  }

  async download(key: string, file: string): Promise<void> {
    await fsp.copyFile(this.localPath(key), file).catch((err: unknown) => {
      throw missing(err) ? new ObjectMissingError(key) : err;
    });
  }

  async delete(keys: readonly string[]): Promise<void> {
    for (const key of keys) await fsp.rm(this.localPath(key), { force: true });
  }

  async deletePrefix(prefix: string): Promise<number> {
    const n = await this.count(checkPrefix(prefix));
    await fsp.rm(this.localPath(prefix.slice(0, -1)), { recursive: true, force: true });
    return n;
  }

  private async count(prefix: string): Promise<number> {
    let n = 0;
    for (let after: string | undefined, page: ObjectInfo[]; ; after = page.at(-1)?.key) {
      page = await this.list(prefix, after === undefined ? {} : { after });
      n += page.length;
      if (page.length < 1000) return n;
    }
  }

  /**
   * Walks the directory the prefix names (a local store is small enough for that; S3 lists by
   * prefix natively). Keys come out in the same order S3 gives them: by their UTF-8 bytes.
   */
  async list(prefix: string, o: { after?: string; limit?: number } = {}): Promise<ObjectInfo[]> {
    const slash = prefix.lastIndexOf("/");
    const dirKey = slash === -1 ? "" : prefix.slice(0, slash);
    if (dirKey !== "") checkKey(dirKey);
    const base = dirKey === "" ? this.root : this.localPath(dirKey);
    const found: ObjectInfo[] = [];
    const walk = async (dir: string, keyPrefix: string): Promise<void> => {
      const entries = await fsp.readdir(dir, { withFileTypes: true }).catch((err: unknown) => {
        if (missing(err) || (err as NodeJS.ErrnoException).code === "ENOTDIR") return [];
        throw err;
      });
      for (const e of entries) {
        const key = `${keyPrefix}${e.name}`;
        if (e.isDirectory()) {
          if (`${key}/`.startsWith(prefix) || prefix.startsWith(`${key}/`))
            await walk(path.join(dir, e.name), `${key}/`);
        } else if (e.isFile() && key.startsWith(prefix) && (o.after === undefined || key > o.after)) {
          const stat = await fsp.stat(path.join(dir, e.name)).catch(() => undefined);
          if (stat) found.push({ key, size: stat.size, modified: stat.mtime });
        }
      }
    };
    await walk(base, dirKey === "" ? "" : `${dirKey}/`);
    found.sort((a, b) => Buffer.compare(Buffer.from(a.key), Buffer.from(b.key)));
    return found.slice(0, o.limit ?? 1000);
  }

  async check(): Promise<void> {
    await fsp.mkdir(this.root, { recursive: true });
    await fsp.access(this.root, fs.constants.R_OK | fs.constants.W_OK);
  }

  /**
   * Removes partial uploads started before `olderThan`: what a process killed mid-upload left behind
   * (a live upload writes its partial file all the time, so its modification time is recent).
   */
  async abortIncompleteUploads(olderThan: Date): Promise<number> {
    const dir = path.join(this.root, PARTIAL_DIR);
    const names = await fsp.readdir(dir).catch(() => [] as string[]);
    let removed = 0;
    for (const name of names) {
      const full = path.join(dir, name);
      const stat = await fsp.stat(full).catch(() => undefined);
      if (stat && stat.mtimeMs < olderThan.getTime()) {
        await fsp.rm(full, { force: true });
        removed++;
      }
    }
    return removed;
  }
}
