// What a finished task offers for download: the succeeded runs' recorded outputs in the object store.
import type { Principal } from "../auth/tokens.ts";
import type { Sql } from "../db/client.ts";
import { type OutputFile, SAFE_NAME } from "../runner/outputs.ts";
import { type ObjectStore, outputObjectKey } from "../storage/store.ts";
import { taskVisible, visible } from "./read.ts";
import { TERMINAL_TASK_STATUSES } from "./states.ts";

export interface RunOutput {
  runId: string;
  inputName: string;
  outputFileName: string;
  /** The recorded output key (runs.output_key), relative to `outputs/`. */
  outputKey: string;
  /** The output files as the run's result recorded them; null for runs from before that was kept. */
  files: OutputFile[] | null;
  /**
   * False when the row names no safe result file or no valid output key: the run's outputs cannot be
   * served, and a download says so (a logged 500) instead of leaving the run out.
   */
  usable: boolean;
}

export type DownloadPlan =
  | { kind: "not-found" }
  | { kind: "not-ready" }
  | { kind: "single"; taskId: string; output: RunOutput }
  | { kind: "zip"; taskId: string; outputs: RunOutput[] };

/** What an output key may look like (see runner/outputs.ts): never anything that leaves `outputs/`. */
const OUTPUT_KEY = /^[0-9]+\/[0-9]+(\.[0-9]+\.[0-9a-f-]+)?$/;

export const outputKeyOf = (output: RunOutput, name: string) => outputObjectKey(output.outputKey, name);

async function succeededOutputs(sql: Sql, taskId: string, runId?: string): Promise<RunOutput[]> {
  // A run that succeeded before runs.output_key existed published to `<taskId>/<runId>`.
  const rows = await sql<
    {
      runId: string;
      inputName: string;
      outputFileName: string | null;
      outputKey: string;
      files: OutputFile[] | null;
    }[]
  >`
    select r.id::text as "runId", r.input_name as "inputName", r.result ->> 'outputFileName' as "outputFileName",
           coalesce(r.output_key, r.task_id::text || '/' || r.id::text) as "outputKey",
           r.result -> 'files' as files
    from runs r
    where r.task_id = ${taskId} and r.status = 'succeeded' ${runId ? sql`and r.id = ${runId}` : sql``}
    order by r.id`;
  return rows.map((r) => {
    const usable = SAFE_NAME.test(r.outputFileName ?? "") && OUTPUT_KEY.test(r.outputKey);
    return {
      runId: r.runId,
      inputName: r.inputName,
      outputFileName: usable ? (r.outputFileName as string) : "",
      outputKey: r.outputKey,
      files: Array.isArray(r.files) ? r.files : null,
      usable,
    };
  });
}

/** Owner or admin; terminal with at least one success (DESIGN §7). */
export async function taskDownloadPlan(sql: Sql, p: Principal, taskId: string): Promise<DownloadPlan> {
  const [task] = await sql<{ status: string; total: number }[]>`
    select t.status, t.total_count as total from tasks t where t.id = ${taskId} and ${visible(sql, p)}`;
  if (!task) return { kind: "not-found" };
  if (!(TERMINAL_TASK_STATUSES as readonly string[]).includes(task.status)) return { kind: "not-ready" };
  const outputs = await succeededOutputs(sql, taskId);
  if (outputs.length === 0) return { kind: "not-ready" };
  return task.total === 1
    ? { kind: "single", taskId, output: outputs[0] as RunOutput }
    : { kind: "zip", taskId, outputs };
}

/** Whether the task still exists (retention may delete it while its outputs are read). */
export async function taskExists(sql: Sql, taskId: string): Promise<boolean> {
  const [row] = await sql`select 1 from tasks t where t.id = ${taskId}`;
  return row !== undefined;
}

/** One run's output: the run must have succeeded (its task need not be finished). */
export async function runDownloadPlan(
  sql: Sql,
  p: Principal,
  taskId: string,
  runId: string,
): Promise<DownloadPlan> {
  if (!(await taskVisible(sql, p, taskId))) return { kind: "not-found" };
  const [run] = await sql`select 1 from runs where id = ${runId} and task_id = ${taskId}`;
  if (!run) return { kind: "not-found" };
  const [output] = await succeededOutputs(sql, taskId, runId);
  return output ? { kind: "single", taskId, output } : { kind: "not-ready" };
}

export type RunOutputsPlan =
  | { kind: "not-found" }
  /** The run exists but did not succeed (yet): it has no outputs. */
  | { kind: "none" }
  | { kind: "outputs"; output: RunOutput };

/** One run's outputs, for listing and serving one by one: any run of a visible task, finished or not. */
export async function runOutputsPlan(
  sql: Sql,
  p: Principal,
  taskId: string,
  runId: string,
): Promise<RunOutputsPlan> {
  if (!(await taskVisible(sql, p, taskId))) return { kind: "not-found" };
  const [run] = await sql`select 1 from runs where id = ${runId} and task_id = ${taskId}`;
  if (!run) return { kind: "not-found" };
  const [output] = await succeededOutputs(sql, taskId, runId);
  return output ? { kind: "outputs", output } : { kind: "none" };
}

/**
 * The files of a succeeded run: as its completion recorded them (`runs.result.files`), or — for runs
 * from before that was kept — as the store lists them under the run's output key (safe names only).
 */
export async function runOutputFiles(store: ObjectStore, output: RunOutput): Promise<OutputFile[]> {
  if (output.files) return output.files.filter((f) => SAFE_NAME.test(f.name));
  const prefix = outputObjectKey(output.outputKey, "");
  const files: OutputFile[] = [];
  for (let after: string | undefined; ; ) {
    const page = await store.list(prefix, after === undefined ? {} : { after });
    for (const o of page) {
      const name = o.key.slice(prefix.length);
      if (SAFE_NAME.test(name)) files.push({ name, size: o.size });
    }
    if (page.length < 1000) return files;
    after = page.at(-1)?.key;
  }
}
