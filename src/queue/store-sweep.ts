// The store sweep (maintenance): deletes objects that no row references and that are older than a day
// — what a crash between storing an object and writing its row leaves (an upload whose row was never
// inserted, outputs of a task whose deletion was interrupted, an attempt whose worker died mid-upload
// and whose run then ended elsewhere). Bounded: each pass looks at one page of each prefix, resuming
// where the last pass stopped and wrapping around at the end. Each process starts at a random point of
// each prefix's keys (randomStartKey), and its first pass comes within a minute of start: a cursor
// starting at the first key in every process, an interval (an hour) after start, meant that workers
// restarted daily only ever looked at the first ~24 pages, and short-lived ones at none. A service
// with start/stop/runOnce; safe in every worker at once (deleting an object twice is harmless).
import type { Sql } from "../db/client.ts";
import { databaseNow } from "../db/clock.ts";
import type { Logger } from "../log.ts";
import {
  IncompleteUploadsError,
  isStoreKey,
  KEY_PREFIXES,
  type ObjectInfo,
  type ObjectStore,
} from "../storage/store.ts";
import { FIRST_PASS_WITHIN_MS, IntervalService, loggedFailure } from "./service.ts";
import { fileIdsKnown, type OutputFolder, outputFoldersReferenced } from "./sql.ts";

export interface StoreSweepOptions {
  sql: Sql;
  logger: Logger;
  store: ObjectStore;
  intervalMs: number;
  /** Objects younger than this are never swept: their rows may be about to be written. */
  minAgeMs?: number;
  /** Objects looked at per prefix and pass. */
  pageSize?: number;
  /** The first pass comes at a random moment within this long of start() (at most intervalMs). */
  firstPassWithinMs?: number;
  /** Where this process's walk of each prefix starts (randomStartKey's source of randomness). */
  random?: () => number;
  /** This host's wall clock, ms since the epoch (Date.now; tests move it). */
  clock?: () => number;
}

const DEFAULT_MIN_AGE_MS = 24 * 3600 * 1000;
const DEFAULT_PAGE = 1000;
const FILE_KEY = /^files\/([1-9][0-9]{0,17})$/;
// The token is a UUID's own shape: the query casts it to uuid, and 36 hex digits and dashes in any
// other arrangement (a key put there by hand or by another tool) failed it, the page's orphans with it,
// whenever the walk came round to that key under a run that exists.
const OUTPUT_KEY =
  /^outputs\/([1-9][0-9]{0,17})\/(([1-9][0-9]{0,17})(?:\.[0-9]+\.([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}))?)\/[^/]+$/;

/**
 * A random point among the keys under `prefix`, for a walk to start after. Keys there begin with a
 * decimal id (`files/<id>`, `outputs/<taskId>/…`) and are listed in byte order, where an id sorts by
 * its digits read as a fraction (0.d₁d₂…): six random digits, the first not 0, pick that fraction
 * evenly: the walk starts anywhere among the keys, whatever the ids' range (though not evenly among
 * them: of ids up to 150,000 two in five begin with 1, where a start falls one time in nine). It goes
 * on from there and wraps around, so one process still looks at every key in turn.
 */
export function randomStartKey(prefix: string, random: () => number = Math.random): string {
  const r = Math.min(Math.max(random(), 0), 1 - Number.EPSILON);
  return `${prefix}${100_000 + Math.floor(r * 900_000)}`;
}

export class StoreSweep extends IntervalService<number> {
  /**
   * Where the next pass resumes, per prefix: at first a random point of the prefix's keys (in memory,
   * so each process starts somewhere else and restarts do not all look at the same first pages),
   * then after the last key looked at; absent after the end, so the walk wraps around to the first key.
   */
  private readonly cursors = new Map<string, string>();

  private readonly o: StoreSweepOptions;

  constructor(o: StoreSweepOptions) {
    super("store sweep", o.intervalMs, o.logger, o.firstPassWithinMs ?? FIRST_PASS_WITHIN_MS);
    this.o = o;
    for (const prefix of KEY_PREFIXES) this.cursors.set(prefix, randomStartKey(prefix, o.random));
  }

  /** Whether the store said it cannot list incomplete uploads (said once, in the log). */
  private uploadsUnsupported = false;

  /**
   * Looks at one page of each prefix; deletes the old objects no row references, and ends uploads
   * that never completed. Returns how many objects and uploads it removed.
   */
  async runOnce(): Promise<number> {
    // Old by the database's clock and by this host's alike: an object's age is judged against the
    // store's clock (S3's LastModified, a file's modification time), and a host whose clock ran days
    // ahead (not yet synced after boot, a VM resumed) swept objects minutes old — an upload whose row
    // was about to be written, an upload still under way. The database's clock is the one every host
    // shares; the earlier of the two only ever keeps an object longer.
    const cutoff = Math.min(this.o.clock?.() ?? Date.now(), await databaseNow(this.o.sql)) - this.minAgeMs;
    let deleted = 0;
    // Each step goes ahead whatever the one before it met, and the pass then ends with the first
    // failure. A prefix whose listing fails (a bucket answering 503, a folder the worker cannot read)
    // fails at the same page every pass — the cursor moves only past a page listed — and it used to end
    // the pass there: the other prefix was never swept and incomplete uploads never ended, for good.
    let failure: { err: unknown } | undefined;
    for (const prefix of KEY_PREFIXES) {
      try {
        deleted += await this.sweep(prefix, cutoff);
      } catch (err) {
        this.o.logger.warn({ err, prefix }, "store sweep could not sweep a prefix");
        failure ??= { err };
      }
      // stop() waits for the pass in progress: it ends at the next step.
      if (this.stopping) break;
    }
    if (deleted > 0)
      this.o.logger.info({ objects: deleted }, "store sweep removed objects no row references");
    let aborted = 0;
    if (!this.stopping) {
      try {
        aborted = await this.abortIncomplete(cutoff);
      } catch (err) {
        this.o.logger.warn({ err }, "store sweep could not end incomplete uploads");
        failure ??= { err };
      }
    }
    if (failure) throw loggedFailure(failure.err);
    return deleted + aborted;
  }

  private get minAgeMs(): number {
    return this.o.minAgeMs ?? DEFAULT_MIN_AGE_MS;
  }

  private async abortIncomplete(cutoff: number): Promise<number> {
    if (this.uploadsUnsupported) return 0;
    try {
      const aborted = await this.o.store.abortIncompleteUploads(new Date(cutoff));
      if (aborted > 0) this.o.logger.info({ uploads: aborted }, "store sweep ended incomplete uploads");
      return aborted;
    } catch (err) {
      // Some uploads left for the next pass: the others' ends are said all the same.
      if (err instanceof IncompleteUploadsError && err.aborted > 0)
        this.o.logger.info({ uploads: err.aborted }, "store sweep ended incomplete uploads");
      // Some S3-compatible services do not list multipart uploads: a bucket lifecycle rule
      // (AbortIncompleteMultipartUpload) must do it there.
      if ((err as { name?: string }).name !== "NotImplemented") throw err;
      this.uploadsUnsupported = true;
      this.o.logger.warn(
        { err },
        "the store cannot list incomplete uploads: add a lifecycle rule that aborts them after a day",
      );
      return 0;
    }
  }

  private async sweep(prefix: (typeof KEY_PREFIXES)[number], cutoff: number): Promise<number> {
    const limit = this.o.pageSize ?? DEFAULT_PAGE;
    const after = this.cursors.get(prefix);
    const page = await this.o.store.list(prefix, { limit, ...(after === undefined ? {} : { after }) });
    const last = page.at(-1)?.key;
    if (page.length < limit || last === undefined) this.cursors.delete(prefix);
    else this.cursors.set(prefix, last);
    const old = page.filter((o) => o.modified.getTime() < cutoff);
    const orphans = prefix === "files/" ? await this.orphanFiles(old) : await this.orphanOutputs(old);
    if (orphans.length > 0) await this.o.store.delete(orphans);
    return orphans.length;
  }

  private async orphanFiles(objects: ObjectInfo[]): Promise<string[]> {
    const ids = new Map<string, string>();
    for (const o of objects) {
      const id = FILE_KEY.exec(o.key)?.[1];
      if (id) ids.set(o.key, id); // a key of another shape is not ours to judge: left alone
    }
    const known = await fileIdsKnown(this.o.sql, [...ids.values()]);
    return [...ids].filter(([, id]) => !known.has(id)).map(([key]) => key);
  }

  private async orphanOutputs(objects: ObjectInfo[]): Promise<string[]> {
    const folders = new Map<string, OutputFolder>();
    const keys: [string, string][] = [];
    for (const o of objects) {
      const m = OUTPUT_KEY.exec(o.key);
      // An object the store would refuse as a key (isStoreKey) failed the delete of the whole page, every
      // time the walk came round to it: left alone, like any key of another shape.
      if (!m || !isStoreKey(o.key)) continue;
      const [, taskId, folder, runId, token] = m as unknown as [string, string, string, string, string?];
      const key = `${taskId}/${folder}`;
      folders.set(key, { key, taskId, runId, token: token ?? null });
      keys.push([o.key, key]);
    }
    const referenced = await outputFoldersReferenced(this.o.sql, [...folders.values()]);
    return keys.filter(([, folder]) => !referenced.has(folder)).map(([key]) => key);
  }
}
