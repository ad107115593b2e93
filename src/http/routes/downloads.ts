// Downloads: one run's output file, or a streamed zip of every succeeded run's outputs.
import path from "node:path";
import type { Readable } from "node:stream";
import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import type { FastifyReply } from "fastify";
import { Type } from "typebox";
import { ZipFile } from "yazl";
import { SAFE_NAME } from "../../runner/outputs.ts";
import { ObjectMissingError, type ObjectStore, taskOutputsPrefix } from "../../storage/store.ts";
import {
  type DownloadPlan,
  outputKeyOf,
  type RunOutput,
  runDownloadPlan,
  taskDownloadPlan,
} from "../../tasks/outputs.ts";
import { principalOf } from "../auth.ts";
import { ApiError, notFound } from "../errors.ts";
import { ErrorBody, errorResponses, IdParam, isId } from "../schemas.ts";

const CONTENT_TYPES: Record<string, string> = {
  ".json": "application/json",
  ".csv": "text/csv; charset=utf-8",
  ".html": "text/html; charset=utf-8",
  ".png": "image/png",
  ".svg": "image/svg+xml",
  ".txt": "text/plain; charset=utf-8",
  ".md": "text/markdown; charset=utf-8",
};

/** `attachment` with an ASCII fallback and the exact UTF-8 name (RFC 6266 / 5987). */
export function contentDisposition(name: string): string {
  const ascii = name.replace(/[^\x20-\x7e]|["\\]/g, "_");
  return `attachment; filename="${ascii}"; filename*=UTF-8''${encodeURIComponent(name)}`;
}

/** Folder names inside the zip: the input file's name, made unique with the run id when repeated. */
function folderNames(outputs: RunOutput[]): Map<string, string> {
  const counts = new Map<string, number>();
  for (const o of outputs) counts.set(o.inputName, (counts.get(o.inputName) ?? 0) + 1);
  // Input names were sanitised at upload (a base name, no control characters); be strict anyway.
  const safe = (s: string) => s.replace(/[/\\]/g, "_").replace(/^\.+/, "_") || "input";
  return new Map(
    outputs.map((o) => [
      o.runId,
      (counts.get(o.inputName) ?? 0) > 1 ? `${safe(o.inputName)} (run ${o.runId})` : safe(o.inputName),
    ]),
  );
}

/** A recorded output that is not there: the store lost it. A logged 500, before any byte is sent. */
function outputMissing(reply: FastifyReply, output: RunOutput, err?: unknown): ApiError {
  reply.log.error(
    { err, runId: output.runId, outputKey: output.outputKey },
    "a succeeded run's output is missing",
  );
  return new ApiError(500, "INTERNAL_ERROR");
}

async function send(store: ObjectStore, plan: DownloadPlan, reply: FastifyReply) {
  if (plan.kind === "not-found") throw notFound("ANALYSIS_TASK_NOT_FOUND");
  if (plan.kind === "not-ready") throw new ApiError(409, "ANALYSIS_TASK_NOT_READY");
  reply.header("x-content-type-options", "nosniff");
  if (plan.kind === "single") return sendObject(store, plan.output, reply);
  const stored = await storedOutputs(store, plan.taskId);
  const entries: ZipEntry[] = [];
  const folders = folderNames(plan.outputs);
  for (const output of plan.outputs) {
    const names = output.usable ? (stored.get(output.outputKey) ?? []) : [];
    if (!names.includes(output.outputFileName)) throw outputMissing(reply, output);
    for (const name of names) {
      entries.push({ key: outputKeyOf(output, name), name: `${folders.get(output.runId)}/${name}` });
    }
  }
  reply.header("content-type", "application/zip");
  reply.header("content-disposition", contentDisposition(`task-${plan.taskId}.zip`));
  return reply.send(zipStream(store, entries, reply));
}

/**
 * Every output object of a task, by output key → file names (safe names only), read from the store in
 * pages of 1,000 before anything is sent: a recorded output that is missing is a 500, not a zip without
 * it. One listing for the whole task, not one request per run.
 */
async function storedOutputs(store: ObjectStore, taskId: string): Promise<Map<string, string[]>> {
  const byKey = new Map<string, string[]>();
  const prefix = taskOutputsPrefix(taskId);
  for (let after: string | undefined; ; ) {
    const page = await store.list(prefix, after === undefined ? {} : { after });
    for (const o of page) {
      const rest = o.key.slice("outputs/".length);
      const slash = rest.lastIndexOf("/");
      const name = rest.slice(slash + 1);
      if (slash === -1 || !SAFE_NAME.test(name)) continue;
      const key = rest.slice(0, slash);
      const names = byKey.get(key);
      if (names) names.push(name);
      else byKey.set(key, [name]);
    }
    if (page.length < 1000) return byKey;
    after = page.at(-1)?.key;
  }
}

/**
 * One output, opened before the headers are sent: an object that is gone is a logged 500. The stream
 * is released when it ends or when Fastify destroys it because the client left.
 */
async function sendObject(store: ObjectStore, output: RunOutput, reply: FastifyReply) {
  if (!output.usable) throw outputMissing(reply, output);
  const { stream, size } = await store
    .open(outputKeyOf(output, output.outputFileName))
    .catch((err: unknown) => {
      throw err instanceof ObjectMissingError ? outputMissing(reply, output, err) : err;
    });
  reply.header(
    "content-type",
    CONTENT_TYPES[path.extname(output.outputFileName).toLowerCase()] ?? "application/octet-stream",
  );
  reply.header("content-length", size);
  reply.header("content-disposition", contentDisposition(output.outputFileName));
  return reply.send(stream);
}

interface ZipEntry {
  /** The object's storage key. */
  key: string;
  /** Its path inside the zip. */
  name: string;
}

/**
 * A zip of `entries`, streamed: yazl reads one object at a time, opened only when its turn comes, so a
 * zip of any size holds one object stream and a few chunks in memory. Every way it can end is handled
 * here:
 * - an object that cannot be read (deleted by retention mid-download, say) breaks the response off —
 *   the client sees a failed transfer, never a complete-looking truncated zip — and is logged; it never
 *   becomes an uncaught exception;
 * - a client that goes away (Fastify destroys the returned stream) releases the object being read.
 */
function zipStream(store: ObjectStore, entries: ZipEntry[], reply: FastifyReply): Readable {
  const zip = new ZipFile();
  // yazl's typings say ReadableStream; it is a PassThrough.
  const out = zip.outputStream as unknown as Readable;
  let reading: Readable | undefined;
  let failed = false;
  const fail = (err: unknown) => {
    if (failed) return;
    failed = true;
    reply.log.error({ err }, "zip download broken off: an output could not be read");
    reading?.destroy();
    out.destroy(err instanceof Error ? err : new Error(String(err)));
  };
  zip.on("error", fail);
  out.once("close", () => {
    failed = true; // nothing more is opened for a client that is gone
    reading?.destroy();
  });
  for (const entry of entries) {
    zip.addReadStreamLazy(entry.name, (done) => {
      if (failed) return;
      store.open(entry.key).then(({ stream }) => {
        if (failed) {
          stream.destroy();
          return;
        }
        reading = stream;
        stream.once("error", fail);
        stream.once("close", () => {
          if (reading === stream) reading = undefined;
        });
        done(null, stream);
      }, fail);
    });
  }
  zip.end();
  return out;
}

export const downloadRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const responses = { 409: ErrorBody, ...errorResponses };

  app.get(
    "/analysis-tasks/:taskId/download",
    {
      schema: {
        summary: "The output: the file itself for a one-file task, else a zip with a folder per input file",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam }),
        response: responses,
      },
    },
    async (request, reply) => {
      const { taskId } = request.params;
      if (!isId(taskId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      return send(
        app.services.storage,
        await taskDownloadPlan(app.services.database.sql, principalOf(request), taskId),
        reply,
      );
    },
  );

  app.get(
    "/analysis-tasks/:taskId/runs/:runId/download",
    {
      schema: {
        summary: "One succeeded run's output file",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        params: Type.Object({ taskId: IdParam, runId: IdParam }),
        response: responses,
      },
    },
    async (request, reply) => {
      const { taskId, runId } = request.params;
      if (!isId(taskId) || !isId(runId)) throw notFound("ANALYSIS_TASK_NOT_FOUND");
      return send(
        app.services.storage,
        await runDownloadPlan(app.services.database.sql, principalOf(request), taskId, runId),
        reply,
      );
    },
  );
};
