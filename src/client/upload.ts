// Getting local files onto the server for a task: hash each, reuse a copy the user already has there
// (GET /api/files?sha256=…), upload the rest with bounded concurrency, counting every byte sent.
// Each local file gets a file id of its own — two local files with the same bytes need two copies, or
// the task would have one run for both.
import { randomBytes, randomUUID } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import type { FileRecord, PageOf } from "../http/api-types.ts";
import { filesBySha256, me } from "./api.ts";
import { ClientUsageError } from "./exit.ts";
import {
  type ApiClient,
  ApiRequestError,
  type BodyWriter,
  envelopeData,
  type Uploader,
  withRetries,
} from "./http.ts";
import { hashFile, type ListedInput, type LocalInput, serverName } from "./inputs.ts";
import { mapLimit } from "./pool.ts";

/** Hashes every input (`onHashed` after each), `concurrency` at a time. */
export async function hashInputs(
  listed: ListedInput[],
  concurrency: number,
  signal: AbortSignal,
  onHashed?: (bytes: number) => void,
): Promise<LocalInput[]> {
  return mapLimit(listed, concurrency, async (f) => {
    const h = await hashFile(f.file ?? f.path, signal);
    onHashed?.(h.sizeBytes);
    return { ...f, ...h };
  });
}

/**
 * The caller's user name, which every file record names as its `owner`. The file lists show an admin
 * everyone's files; a copy is only ever taken from the caller's own, never another user's file that
 * has the same bytes and name (asked once per command: see `me`).
 */
const ownerName = async (c: ApiClient, signal: AbortSignal) => (await me(c, signal)).name;

/**
 * All the caller's files by hash, when there are few: the list read newest first, at most `pages`
 * pages of 100; undefined when it goes on longer (then asking by hash is cheaper). Only `owner`'s.
 */
async function fewFiles(
  c: ApiClient,
  owner: Promise<string>,
  pages: number,
  signal: AbortSignal,
): Promise<Map<string, FileRecord[]> | undefined> {
  const byHash = new Map<string, FileRecord[]>();
  let cursor: string | undefined;
  for (let i = 0; i < pages; i++) {
    const page = await c.get<PageOf<FileRecord>>("/api/files", { limit: 100, cursor }, signal);
    const name = await owner;
    for (const f of page.items)
      if (f.owner === name) byHash.set(f.sha256, [...(byHash.get(f.sha256) ?? []), f]);
    if (page.nextCursor === null) return byHash;
    cursor = page.nextCursor;
  }
  return undefined;
}

/**
 * The server copy each input can use instead of an upload, by index: a file of the same hash (and
 * size) and the name the upload would get, that no other input took. Inputs missing from the map must be
 * uploaded. The copies are found in the caller's list of files when that is short (a page per 100
 * inputs, plus one), else by one GET /api/files?sha256= per distinct hash.
 */
export async function findCopies(
  c: ApiClient,
  inputs: LocalInput[],
  concurrency: number,
  signal: AbortSignal,
): Promise<Map<number, FileRecord>> {
  const byHash = new Map<string, number[]>();
  for (const [i, input] of inputs.entries())
    byHash.set(input.sha256, [...(byHash.get(input.sha256) ?? []), i]);
  // Asked alongside the first page. Either failing fails the command once both have settled, so
  // nothing is left running behind it (as mapLimit).
  const owner = ownerName(c, signal);
  const [name, listed] = await Promise.allSettled([
    owner,
    fewFiles(c, owner, Math.ceil(inputs.length / 100) + 1, signal),
  ]).then(([a, b]) => {
    if (a.status === "rejected") throw a.reason;
    if (b.status === "rejected") throw b.reason;
    return [a.value, b.value] as const;
  });
  const found = new Map<number, FileRecord>();
  await mapLimit([...byHash], concurrency, async ([sha256, indexes]) => {
    const candidates = listed ? (listed.get(sha256) ?? []) : await filesBySha256(c, sha256, signal);
    const size = inputs[indexes[0] as number]?.sizeBytes;
    assignCopies(
      inputs,
      indexes,
      candidates.filter((f) => f.sizeBytes === size && f.owner === name),
      found,
    );
  });
  return found;
}

function assignCopies(
  inputs: LocalInput[],
  indexes: number[],
  copies: FileRecord[],
  found: Map<number, FileRecord>,
) {
  const free = [...copies];
  const take = (i: number, pick: (f: FileRecord) => boolean) => {
    const at = free.findIndex(pick);
    if (at < 0) return;
    found.set(i, free[at] as FileRecord);
    free.splice(at, 1);
  };
  // Only a copy stored under the name the upload would get: a run's name is its file's, so a copy
  // under another name labelled the results (results.csv, the zip's folders, the dashboard) with that
  // name (until 2026-12-07: apr.csv's results said jan.csv, a data analyst's trial).
  for (const i of indexes) take(i, (f) => f.name === serverName(inputs[i]?.label ?? ""));
}

const SMALL_FILE = 1024 * 1024;

const CONTENT_TYPES: Record<string, string> = {
  ".csv": "text/csv",
  ".tsv": "text/tab-separated-values",
  ".txt": "text/plain",
  ".json": "application/json",
};

/**
 * A name in a quoted `filename`: a backslash escaped (the server's multipart parser reads `\\` as one
 * and `\"` as a quote: `a\\b.csv` was stored as `a\b.csv`, `x\` as `x"`), a quote as %22, as browsers
 * send it.
 */
const quoted = (name: string) => name.replace(/\\/g, "\\\\").replace(/"/g, "%22");

/**
 * The multipart head of a file part. The name goes as browsers send it: UTF-8 in the quoted
 * `filename` (quoted()); control characters were dropped by serverName already.
 */
function partHead(boundary: string, name: string): Buffer {
  const type = CONTENT_TYPES[path.extname(name).toLowerCase()] ?? "application/octet-stream";
  return Buffer.from(
    `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${quoted(name)}"\r\n` +
      `Content-Type: ${type}\r\n\r\n`,
  );
}

/**
 * The file an upload of `input` whose answer never came made, if it did: a file with its bytes and
 * the name the server gives it that no other input has (`claimed`: the copies found and the files
 * uploaded so far). The caller uploads each hash's inputs one after another, so no upload of these
 * bytes from this command is in flight meanwhile to be taken for this one.
 */
async function arrivedWhole(
  c: ApiClient,
  input: LocalInput,
  claimed: Set<string>,
  signal: AbortSignal,
): Promise<FileRecord | undefined> {
  const name = serverName(input.label);
  const owner = await ownerName(c, signal);
  const mine = (await filesBySha256(c, input.sha256, signal)).filter(
    (f) => f.owner === owner && f.sizeBytes === input.sizeBytes && f.name === name && !claimed.has(f.fileId),
  );
  // The newest: a copy made before this command started was claimed by findCopies already.
  return mine.sort((a, b) => (BigInt(a.fileId) < BigInt(b.fileId) ? 1 : -1))[0];
}

/**
 * Uploads one file (POST /api/files), streamed from disk (uploadOnce), every try with the same random
 * Idempotency-Key. An upload whose connection fails or breaks off, or that a gateway answers 502, 503
 * or 504 (the API restarting, a proxy that stopped waiting), is retried (withRetries) by sending it
 * again: when an earlier try committed after all (its answer lost, or still being stored when the
 * retry came), the server answers with that try's file instead of making a second. Before each resend
 * the server is still asked for it by hash (arrivedWhole): a server older than the key ignores it,
 * and a file found then is taken instead of sent twice. Every file taken goes into `claimed`. A 4xx,
 * a 500 or a file that changed is not retried.
 */
export async function uploadFile(
  uploader: Uploader,
  input: LocalInput,
  signal: AbortSignal,
  onBytes: (n: number) => void,
  claimed: Set<string> = new Set(),
): Promise<FileRecord> {
  const c = uploader.client;
  const idempotencyKey = randomUUID();
  const record = await withRetries(
    input.label,
    {
      signal,
      note: c.onRetry,
      again: "asking the server whether it arrived, else uploading it again",
      beforeRetry: async () => {
        const arrived = await arrivedWhole(c, input, claimed, signal);
        if (arrived) {
          c.onRetry?.(`${input.label}: it had arrived whole (file ${arrived.fileId}); not sent again`);
          onBytes(input.sizeBytes);
        }
        return arrived;
      },
    },
    () => uploadOnce(uploader, input, idempotencyKey, signal, onBytes),
  );
  claimed.add(record.fileId);
  return record;
}

/**
 * One upload of a file, streamed from disk; `onBytes(n)` as the connection takes each chunk, and
 * once with minus everything counted when the upload fails. An abort cancels the request: the
 * server keeps nothing of a body that did not end.
 */
async function uploadOnce(
  uploader: Uploader,
  input: LocalInput,
  idempotencyKey: string,
  signal: AbortSignal,
  onBytes: (n: number) => void,
): Promise<FileRecord> {
  const boundary = `assay-${randomBytes(16).toString("hex")}`;
  const head = partHead(boundary, serverName(input.label));
  const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
  let counted = 0;
  const send = async (write: (chunk: Buffer) => Promise<void>, chunk: Buffer) => {
    await write(chunk);
    counted += chunk.length;
    onBytes(chunk.length);
  };
  // The request declares the size the file had when it was hashed. A file that has shrunk since
  // would leave the server waiting for bytes that never come, and one that grew would overrun the
  // declared length: either is refused here, before the tail, and the failed body aborts the request.
  const changed = () => new ClientUsageError(`${input.label} changed while it was uploaded`);
  const body: BodyWriter = async (write) => {
    await write(head);
    // A small file in one read (one request to the thread pool instead of open, reads and close).
    if (input.sizeBytes <= SMALL_FILE) {
      const bytes = await fs.promises.readFile(input.file ?? input.path, { signal });
      if (bytes.length !== input.sizeBytes) throw changed();
      await send(write, bytes);
    } else {
      let read = 0;
      // `end` is inclusive: at most one byte past the hashed size is read, enough to see growth.
      const stream = fs.createReadStream(input.file ?? input.path, {
        highWaterMark: 256 * 1024,
        signal,
        end: input.sizeBytes,
      });
      for await (const chunk of stream) {
        read += (chunk as Buffer).length;
        if (read > input.sizeBytes) throw changed();
        await send(write, chunk as Buffer);
      }
      if (read !== input.sizeBytes) throw changed();
    }
    await write(tail);
  };
  try {
    const res = await uploader.post(
      "/api/files",
      {
        "content-type": `multipart/form-data; boundary=${boundary}`,
        "content-length": String(head.length + input.sizeBytes + tail.length),
        "idempotency-key": idempotencyKey,
      },
      body,
      signal,
    );
    const record = envelopeData<FileRecord>(res.text, uploader.shownUrl);
    if (record.sha256 !== input.sha256) throw changed();
    return record;
  } catch (err) {
    onBytes(-counted);
    if (err instanceof ApiRequestError)
      throw new ApiRequestError(err.status, err.code, `${input.label}: ${err.message}`);
    throw err;
  }
}
