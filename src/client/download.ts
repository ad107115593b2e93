// A finished task's outputs on disk: a folder per input file holding that run's output files, and
// the task's results.csv at the top. Each file is written under a temporary name and renamed when
// complete, so a file under its own name is whole; names from the server are used only as single
// path segments inside the chosen directory.
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { Run } from "../http/api-types.ts";
import { fetchBody, outputPath, resultsCsvPath, runOutputs } from "./api.ts";
import type { ApiClient } from "./http.ts";
import { mapLimit } from "./pool.ts";

export const RESULTS_FILE = "results.csv";

export interface Downloaded {
  runId: string;
  fileName: string;
  /** The run's folder, relative to the output directory. */
  folder: string;
  files: string[];
  bytes: number;
}

/** A name from the server as one path segment: no separators, no leading dots, no controls. */
export function safeSegment(name: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: dropping control characters is the point
  const clean = name.replace(/[\u0000-\u001f\u007f]/g, "").replace(/[/\\]/g, "_");
  return clean.replace(/^\.+/, "_") || "input";
}

/**
 * A folder per run named after its input file, as in the task's zip: repeated names, and the name of
 * the results table at the top, get " (run <id>)".
 */
export function folderNames(runs: Pick<Run, "runId" | "fileName">[]): Map<string, string> {
  const counts = new Map<string, number>([[RESULTS_FILE, 1]]);
  for (const r of runs) counts.set(safeSegment(r.fileName), (counts.get(safeSegment(r.fileName)) ?? 0) + 1);
  return new Map(
    runs.map((r) => {
      const name = safeSegment(r.fileName);
      return [r.runId, (counts.get(name) ?? 0) > 1 ? `${name} (run ${r.runId})` : name];
    }),
  );
}

/**
 * Folders from the local inputs' labels ("sub/a.csv"): the input tree mirrored, every segment made
 * safe; a top folder named like the results table gets " (run <id>)".
 */
export function folderFromLabel(label: string, runId: string): string {
  const segments = label.split("/").map(safeSegment);
  if (segments[0] === RESULTS_FILE) {
    segments[0] = segments.length === 1 ? `${RESULTS_FILE} (run ${runId})` : `${RESULTS_FILE} (folder)`;
  }
  return segments.join("/");
}

/** `rel` under `root`, refusing anything that would land outside it. */
function inside(root: string, rel: string): string {
  const full = path.resolve(root, rel);
  if (full !== root && !full.startsWith(root + path.sep))
    throw new Error(`refusing to write outside ${root}: ${rel}`);
  return full;
}

async function saveBody(res: Response, target: string): Promise<number> {
  const tmp = `${target}.partial-${process.pid}`;
  let written = 0;
  try {
    const body = Readable.fromWeb(res.body as never);
    body.on("data", (chunk: Buffer) => {
      written += chunk.length;
    });
    await pipeline(body, fs.createWriteStream(tmp));
    fs.renameSync(tmp, target);
    return written;
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    throw err;
  }
}

export interface DownloadOptions {
  concurrency: number;
  signal: AbortSignal;
  onRun?: (d: Downloaded) => void;
}

/** Downloads the outputs of `runs` (the succeeded ones) into `outDir/<folder of run>/`, and results.csv. */
export async function downloadOutputs(
  c: ApiClient,
  taskId: string,
  runs: { run: Run; folder: string }[],
  outDir: string,
  o: DownloadOptions,
): Promise<{ runs: Downloaded[]; resultsCsv: string }> {
  const root = path.resolve(outDir);
  fs.mkdirSync(root, { recursive: true });
  const done = await mapLimit(runs, o.concurrency, async ({ run, folder }) => {
    const dir = inside(root, folder);
    fs.mkdirSync(dir, { recursive: true });
    const outputs = await runOutputs(c, taskId, run.runId);
    const files: string[] = [];
    let total = 0;
    for (const output of outputs) {
      const name = safeSegment(output.name);
      const res = await fetchBody(c, outputPath(taskId, run.runId, output.name), o.signal);
      const size = await saveBody(res, inside(dir, name));
      if (size !== output.sizeBytes)
        throw new Error(`${output.name} of run ${run.runId}: ${size} of ${output.sizeBytes} bytes`);
      files.push(name);
      total += size;
    }
    const d = { runId: run.runId, fileName: run.fileName, folder, files, bytes: total };
    o.onRun?.(d);
    return d;
  });
  const resultsCsv = inside(root, RESULTS_FILE);
  await saveBody(await fetchBody(c, resultsCsvPath(taskId), o.signal), resultsCsv);
  return { runs: done, resultsCsv };
}
