// Downloads: one run's output file, or a streamed zip of every succeeded run's outputs.
import fs from "node:fs";
import fsp from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import type { FastifyReply } from "fastify";
import { Type } from "typebox";
import { ZipFile } from "yazl";
import {
  type DownloadPlan,
  outputFiles,
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
  reply.log.error({ err, runId: output.runId, dir: output.dir }, "a succeeded run's output is missing");
  return new ApiError(500, "INTERNAL_ERROR");
}

async function send(plan: DownloadPlan, reply: FastifyReply) {
  if (plan.kind === "not-found") throw notFound("ANALYSIS_TASK_NOT_FOUND");
  if (plan.kind === "not-ready") throw new ApiError(409, "ANALYSIS_TASK_NOT_READY");
  reply.header("x-content-type-options", "nosniff");
  if (plan.kind === "single") return sendFile(plan.output, reply);
  const entries: { file: string; name: string }[] = [];
  const folders = folderNames(plan.outputs);
  for (const output of plan.outputs) {
    const names = output.usable ? await outputFiles(output.dir) : [];
    if (!names.includes(output.outputFileName)) throw outputMissing(reply, output);
    for (const name of names) {
      entries.push({ file: path.join(output.dir, name), name: `${folders.get(output.runId)}/${name}` });
    }
  }
  reply.header("content-type", "application/zip");
  reply.header("content-disposition", contentDisposition(`task-${plan.taskId}.zip`));
  return reply.send(zipStream(entries, reply));
}

/**
 * One file, opened before the headers are sent: a file that is gone is a logged 500, and one that goes
 * while it is sent cannot cut the response short (the open descriptor keeps it). The stream closes the
 * descriptor when it ends or when Fastify destroys it because the client left.
 */
async function sendFile(output: RunOutput, reply: FastifyReply) {
  if (!output.usable) throw outputMissing(reply, output);
  const file = path.join(output.dir, output.outputFileName);
  const handle = await fsp.open(file, "r").catch((err: unknown) => {
    throw outputMissing(reply, output, err);
  });
  let stat: fs.Stats;
  try {
    stat = await handle.stat();
    if (!stat.isFile()) throw new Error("not a regular file");
  } catch (err) {
    await handle.close();
    throw outputMissing(reply, output, err);
  }
  reply.header("content-type", CONTENT_TYPES[path.extname(file).toLowerCase()] ?? "application/octet-stream");
  reply.header("content-length", stat.size);
  reply.header("content-disposition", contentDisposition(output.outputFileName));
  return reply.send(handle.createReadStream());
}

/**
 * A zip of `entries`, streamed: yazl reads one file at a time, opened only when its turn comes, so a
 * zip of any size holds one descriptor and a few chunks. Every way it can end is handled here:
 * - a file that cannot be read (deleted by retention mid-download, say) breaks the response off — the
 *   client sees a failed transfer, never a complete-looking truncated zip — and is logged; it never
 *   becomes an uncaught exception;
 * - a client that goes away (Fastify destroys the returned stream) closes the file being read.
 */
function zipStream(entries: { file: string; name: string }[], reply: FastifyReply): Readable {
  const zip = new ZipFile();
  // yazl's typings say ReadableStream; it is a PassThrough.
  const out = zip.outputStream as unknown as Readable;
  let reading: fs.ReadStream | undefined;
  let failed = false;
  const fail = (err: unknown) => {
    if (failed) return;
    failed = true;
    reply.log.error({ err }, "zip download broken off: an output could not be read");
    reading?.destroy();
    out.destroy(err instanceof Error ? err : new Error(String(err)));
  };
  zip.on("error", fail);
  out.once("close", () => reading?.destroy());
  for (const entry of entries) {
    zip.addReadStreamLazy(entry.name, (done) => {
      const stream = fs.createReadStream(entry.file);
      reading = stream;
      stream.once("error", fail);
      stream.once("close", () => {
        if (reading === stream) reading = undefined;
      });
      done(null, stream);
    });
  }
  zip.end();
  return out;
}

export const downloadRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const outputsRoot = path.join(app.services.config.dataDir, "outputs");
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
        await taskDownloadPlan(app.services.database.sql, principalOf(request), outputsRoot, taskId),
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
        await runDownloadPlan(app.services.database.sql, principalOf(request), outputsRoot, taskId, runId),
        reply,
      );
    },
  );
};
