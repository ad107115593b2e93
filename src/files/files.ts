// Uploaded files: metadata rows in `files`, bytes in storage under `files/<id>`.

import { type Readable, Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { Principal } from "../auth/tokens.ts";
import { isoTime, type Sql } from "../db/client.ts";
import { meter, type ObjectStore, type PutResult, watchPut } from "../storage/store.ts";

export interface FileRecord {
  fileId: string;
  name: string;
  /** The owner's user name. */
  owner: string;
  contentType: string;
  sizeBytes: number;
  sha256: string;
  /** ISO 8601. */
  createdAt: string;
}

export type FileCreateResult =
  | { kind: "created"; file: FileRecord }
  /** The upload's Idempotency-Key already made this file, of the same bytes: a retry's answer. */
  | { kind: "existing"; file: FileRecord }
  /** The key already made a file of other bytes. */
  | { kind: "idempotency-conflict" };

/**
 * Stores an upload under `files/<id>` and records it. The id is taken first, the bytes are streamed to
 * the store (hashed and counted, never whole in memory; over `maxBytes` nothing is left), and only then
 * is the row inserted: a row never names bytes that are not there. If the server refuses the insert, the
 * object is deleted; a crash in between, or a connection lost with the insert's answer (it may have
 * committed), leaves an object no row may name, which the store sweep removes a day later if none does.
 *
 * With an `idempotencyKey`, the row carries it (unique per owner). When the key already made a file
 * (the first try of a retried upload committed), the body is read through the meter without being
 * stored — a replayed 1 GB upload was stored whole, on S3 uploaded, to be deleted again — and that
 * file is the answer if its bytes are these (same SHA-256 and size), a conflict if not; the limit
 * still applies. When the key's file commits only after that look-up (a concurrent first try), the
 * insert's conflict says so: the bytes just stored are deleted and the same comparison answers; when
 * that file is deleted before it is read, the key is free again and this upload is inserted.
 */
export async function fileCreate(
  sql: Sql,
  store: ObjectStore,
  owner: Principal,
  source: Readable,
  meta: { name: string; contentType: string; maxBytes: number; idempotencyKey?: string },
): Promise<FileCreateResult> {
  if (meta.idempotencyKey !== undefined) {
    const existing = await fileByIdempotencyKey(sql, owner, meta.idempotencyKey);
    if (existing) return replayOf(existing, await readThrough(source, meta.maxBytes));
  }
  const [next] = await sql<
    { id: string }[]
  >`select nextval(pg_get_serial_sequence('files', 'id'))::text as id`;
  const id = next?.id as string;
  const key = fileKey(id);
  const stored = await store.put(key, source, meta.maxBytes);
  let rows: FileRecord[];
  for (let tries = 1; ; tries++) {
    try {
      rows = await sql<FileRecord[]>`
        insert into files (id, owner_id, name, content_type, size_bytes, sha256, storage_key, idempotency_key)
        values (${id}, ${owner.userId}, ${meta.name}, ${meta.contentType}, ${stored.sizeBytes},
                ${stored.sha256}, ${key}, ${meta.idempotencyKey ?? null})
        returning id::text as "fileId", name, ${owner.name}::text as owner, content_type as "contentType",
                  size_bytes::float8 as "sizeBytes", sha256, created_at as "createdAt"`;
      break;
    } catch (err) {
      // Only an error the server answered with says the row was not written (the statement is its own
      // transaction, rolled back). A lost connection says nothing: the commit may have happened before
      // its answer was lost — and deleting the object then left a row naming no bytes, an input that
      // failed every run over it. Without a row the sweep removes the object a day later.
      if (!rejectedByServer(err)) throw err;
      if (meta.idempotencyKey !== undefined && isIdempotencyViolation(err)) {
        const existing = await fileByIdempotencyKey(sql, owner, meta.idempotencyKey);
        // The file the key made was deleted since the conflict: the key is free again, and this
        // upload (its bytes still stored) is inserted after all. It used to be a 500, the bytes gone.
        if (!existing && tries < INSERT_TRIES) continue;
        await store.delete([key]).catch(() => {});
        if (!existing) throw err;
        return replayOf(existing, stored);
      }
      await store.delete([key]).catch(() => {});
      throw err;
    }
  }
  const [row] = rows;
  if (!row) throw new Error("file insert returned no row");
  return { kind: "created", file: { ...row, createdAt: isoTime(row.createdAt) } };
}

/** The answer to an upload whose Idempotency-Key made `existing`: it if the bytes are the same. */
const replayOf = (existing: FileRecord, body: PutResult): FileCreateResult =>
  existing.sha256 === body.sha256 && existing.sizeBytes === body.sizeBytes
    ? { kind: "existing", file: existing }
    : { kind: "idempotency-conflict" };

/**
 * Reads `source` to its end through the store's meter (hashed, counted, PayloadTooLargeError past
 * `maxBytes`), keeping nothing. A body that fails by itself is a SourceError, as from a put.
 */
async function readThrough(source: Readable, maxBytes: number): Promise<PutResult> {
  const m = meter(maxBytes);
  const failure = watchPut(source, [m.stream]);
  const discard = new Writable({ write: (_chunk, _enc, done) => done() });
  await pipeline(source, m.stream, discard).catch((err: unknown) => {
    throw failure(err);
  });
  return m.result();
}

/** Inserts of an upload whose key's file keeps being made and deleted by other requests meanwhile. */
const INSERT_TRIES = 3;

const isIdempotencyViolation = (err: unknown) =>
  (err as { code?: string }).code === "23505" &&
  (err as { constraint_name?: string }).constraint_name === "files_owner_idempotency_key";

async function fileByIdempotencyKey(
  sql: Sql,
  owner: Principal,
  idempotencyKey: string,
): Promise<FileRecord | undefined> {
  const [row] = await sql<FileRecord[]>`
    select id::text as "fileId", name, ${owner.name}::text as owner, content_type as "contentType",
           size_bytes::float8 as "sizeBytes", sha256, created_at as "createdAt"
    from files where owner_id = ${owner.userId} and idempotency_key = ${idempotencyKey}`;
  return row && { ...row, createdAt: isoTime(row.createdAt) };
}

/** PostgreSQL answered with an error: the statement failed there (not a socket's or the client's). */
const rejectedByServer = (err: unknown) => err instanceof Error && err.name === "PostgresError";

/** The storage key of an uploaded file. */
export const fileKey = (fileId: string | number) => `files/${fileId}`;

/**
 * The files `principal` may see (its own; an admin: everyone's), newest first, `limit` at a time after
 * `cursor` (a file id); with `sha256`, only files with those bytes (a client that would upload a file it
 * already has asks first).
 */
export async function fileList(
  sql: Sql,
  principal: Principal,
  o: { limit: number; cursor?: string; sha256?: string },
): Promise<{ items: FileRecord[]; nextCursor: string | null }> {
  const rows = await sql<FileRecord[]>`
    select f.id::text as "fileId", f.name, u.name as owner, f.content_type as "contentType",
           f.size_bytes::float8 as "sizeBytes", f.sha256, f.created_at as "createdAt"
    from files f join users u on u.id = f.owner_id
    where (${principal.role === "admin"} or f.owner_id = ${principal.userId})
      ${o.sha256 ? sql`and f.sha256 = ${o.sha256}` : sql``}
      ${o.cursor ? sql`and f.id < ${o.cursor}` : sql``}
    order by f.id desc
    limit ${o.limit + 1}`;
  const items = rows.slice(0, o.limit).map((r) => ({ ...r, createdAt: isoTime(r.createdAt) }));
  return { items, nextCursor: rows.length > o.limit ? (items.at(-1)?.fileId ?? null) : null };
}

/** A file visible to `principal` (its owner, or any admin), or undefined. */
export async function fileGet(
  sql: Sql,
  principal: Principal,
  fileId: string,
): Promise<FileRecord | undefined> {
  const [row] = await sql<FileRecord[]>`
    select f.id::text as "fileId", f.name, u.name as owner, f.content_type as "contentType",
           f.size_bytes::float8 as "sizeBytes", f.sha256, f.created_at as "createdAt"
    from files f join users u on u.id = f.owner_id
    where f.id = ${fileId} and (${principal.role === "admin"} or f.owner_id = ${principal.userId})`;
  return row && { ...row, createdAt: isoTime(row.createdAt) };
}

/**
 * How long a file's deletion waits for the store to delete its bytes. The row is gone by then: a store
 * that does not answer (a hung gateway) held the request for the S3 client's timeouts and retries,
 * minutes, for bytes the store sweep removes anyway.
 */
export const FILE_BYTES_DELETE_TIMEOUT_MS = 5_000;

/**
 * Deletes a file visible to `principal` (its owner, or any admin): its row, then its bytes. Returns
 * false when there is no such file (or it is someone else's). Runs snapshot the key of their input,
 * so a task made from the file before keeps its outputs; a run of it that has not read its input yet
 * fails ANALYSIS_INPUT_INVALID (the input is not in storage), as the deletion asks. When the bytes
 * cannot be deleted (the store is down) or their delete takes longer than `timeoutMs` (it is ended
 * then), `onLeft` hears why and the store sweep removes them later: an object no row names, older
 * than a day.
 */
export async function fileDelete(
  sql: Sql,
  store: ObjectStore,
  principal: Principal,
  fileId: string,
  onLeft: (err: unknown) => void,
  timeoutMs = FILE_BYTES_DELETE_TIMEOUT_MS,
): Promise<boolean> {
  const [row] = await sql<{ storageKey: string }[]>`
    delete from files f
    where f.id = ${fileId} and (${principal.role === "admin"} or f.owner_id = ${principal.userId})
    returning f.storage_key as "storageKey"`;
  if (!row) return false;
  const stop = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const err = new Error(`the store did not delete ${row.storageKey} within ${timeoutMs} ms`);
      stop.abort(err);
      reject(err);
    }, timeoutMs);
  });
  // Bounded even for a store that does not look at the signal: the delete goes on in the background
  // then, its outcome unheard (the sweep's if it fails).
  const deleting = store.delete([row.storageKey], { signal: stop.signal });
  deleting.catch(() => {});
  await Promise.race([deleting, timedOut])
    .catch(onLeft)
    .finally(() => clearTimeout(timer));
  return true;
}
