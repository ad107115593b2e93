// Uploaded files: metadata rows in `files`, bytes in storage under `files/<id>`.
import type { Principal } from "../auth/tokens.ts";
import { isoTime, type Sql } from "../db/client.ts";
import type { LocalStorage, StagedObject } from "../storage/local.ts";

export interface FileRecord {
  fileId: string;
  name: string;
  contentType: string;
  sizeBytes: number;
  sha256: string;
  /** ISO 8601. */
  createdAt: string;
}

const MAX_NAME_LENGTH = 255;

/**
 * The user's file name as metadata: its base name (either separator), without control characters,
 * at most 255 characters; `upload` when nothing is left.
 */
export function sanitizeFileName(raw: string | undefined): string {
  const base = (raw ?? "").split(/[/\\]/).pop() ?? "";
  // biome-ignore lint/suspicious/noControlCharactersInRegex: stripping control characters is the point
  const clean = base.replace(/[\u0000-\u001f\u007f]/g, "").trim();
  const name = clean === "." || clean === ".." ? "" : clean;
  return name.slice(0, MAX_NAME_LENGTH) || "upload";
}

/**
 * Records a staged upload and publishes its bytes under `files/<id>`. The row is committed only
 * after the rename succeeded, and the bytes are removed if the commit fails: a crash or an error
 * leaves neither a row without bytes nor (beyond a partial upload swept later) bytes without a row.
 */
export async function fileCreate(
  sql: Sql,
  storage: LocalStorage,
  owner: Principal,
  staged: StagedObject,
  meta: { name: string; contentType: string },
): Promise<FileRecord> {
  let publishedKey: string | undefined;
  try {
    return await sql.begin(async (tx) => {
      const [row] = await tx<(FileRecord & { storageKey: string })[]>`
        with next as (select nextval(pg_get_serial_sequence('files', 'id')) as id)
        insert into files (id, owner_id, name, content_type, size_bytes, sha256, storage_key)
        select id, ${owner.userId}, ${meta.name}, ${meta.contentType}, ${staged.sizeBytes},
               ${staged.sha256}, 'files/' || id from next
        returning id::text as "fileId", name, content_type as "contentType",
                  size_bytes::float8 as "sizeBytes", sha256, created_at as "createdAt",
                  storage_key as "storageKey"`;
      if (!row) throw new Error("file insert returned no row");
      await staged.commit(row.storageKey);
      publishedKey = row.storageKey;
      const { storageKey: _key, ...record } = row;
      return { ...record, createdAt: isoTime(record.createdAt) };
    });
  } catch (err) {
    await staged.discard();
    if (publishedKey) await storage.delete(publishedKey);
    throw err;
  }
}

/** A file visible to `principal` (its owner, or any admin), or undefined. */
export async function fileGet(
  sql: Sql,
  principal: Principal,
  fileId: string,
): Promise<FileRecord | undefined> {
  const [row] = await sql<FileRecord[]>`
    select id::text as "fileId", name, content_type as "contentType", size_bytes::float8 as "sizeBytes",
           sha256, created_at as "createdAt"
    from files
    where id = ${fileId} and (${principal.role === "admin"} or owner_id = ${principal.userId})`;
  return row && { ...row, createdAt: isoTime(row.createdAt) };
}
