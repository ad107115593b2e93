// Downloads: one run's output file, or a streamed zip of every succeeded run's outputs.
import fs from "node:fs";
import path from "node:path";
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

async function send(plan: DownloadPlan, reply: FastifyReply) {
  if (plan.kind === "not-found") throw notFound("ANALYSIS_TASK_NOT_FOUND");
  if (plan.kind === "not-ready") throw new ApiError(409, "ANALYSIS_TASK_NOT_READY");
  reply.header("x-content-type-options", "nosniff");
  if (plan.kind === "single") {
    const file = path.join(plan.output.dir, plan.output.outputFileName);
    const stat = await fs.promises.stat(file).catch(() => undefined);
    if (!stat?.isFile()) throw new ApiError(409, "ANALYSIS_TASK_NOT_READY");
    reply.header(
      "content-type",
      CONTENT_TYPES[path.extname(file).toLowerCase()] ?? "application/octet-stream",
    );
    reply.header("content-length", stat.size);
    reply.header("content-disposition", contentDisposition(plan.output.outputFileName));
    return reply.send(fs.createReadStream(file));
  }
  const zip = new ZipFile();
  const folders = folderNames(plan.outputs);
  for (const output of plan.outputs) {
    for (const name of await outputFiles(output.dir)) {
      zip.addFile(path.join(output.dir, name), `${folders.get(output.runId)}/${name}`);
    }
  }
  zip.end();
  reply.header("content-type", "application/zip");
  reply.header("content-disposition", contentDisposition(`task-${plan.taskId}.zip`));
  return reply.send(zip.outputStream);
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
