// Per-attempt output folders. Each attempt writes into its own folder,
// `<root>/<taskId>/<runId>.<attempt>.<leaseToken>/`, and nothing ever renames or replaces it: after the
// output check, the attempt's completion names the folder (`runs.output_key`), and only a completion
// that wins the lease fence is recorded. So publication is decided by the fence: an attempt that lost
// its lease can neither replace nor delete the outputs of the attempt that won — it only ever removes
// its own folder. The lease token is in the name because an attempt number can repeat (a refunded
// attempt; a claim lost in a database crash, see runClaim) while the earlier attempt's process may
// still be running: each attempt owns its folder.
import fs from "node:fs";
import fsp from "node:fs/promises";
import path from "node:path";

export const OUTPUT_LIMITS = {
  maxFiles: 16,
  maxFileBytes: 100 * 1024 * 1024,
  maxTotalBytes: 200 * 1024 * 1024,
  extensions: [".json", ".csv", ".html", ".png", ".svg", ".txt", ".md"],
};

/** Names a script may give its outputs: a plain file name, no path, no leading dot. */
export const SAFE_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export interface AttemptOutput {
  /** The folder the attempt writes into. */
  dir: string;
  /** The folder relative to the outputs root: what the run records when this attempt's completion wins. */
  key: string;
}

export function attemptOutput(
  root: string,
  taskId: number,
  runId: number,
  attempt: number,
  token: string,
): AttemptOutput {
  const key = `${taskId}/${runId}.${attempt}.${token}`;
  return { dir: path.join(root, key), key };
}

export type OutputCheck = { ok: true; files: string[] } | { ok: false; message: string };

/**
 * Validates an attempt's directory against the result event and the limits. Synchronous, like the
 * rest of the success path: a few metadata calls on the local disk cost less than their thread-pool
 * round trips (measured: 0.07 against 0.32 ms of CPU per run for check and publish), and reading the
 * directory stops at the file limit, so a program that wrote a million files cannot stall the loop.
 */
export function checkOutputs(dir: string, resultName: string): OutputCheck {
  if (!SAFE_NAME.test(resultName) || path.basename(resultName) !== resultName) {
    return { ok: false, message: "the result names a file outside the output directory" };
  }
  const names: string[] = [];
  let total = 0;
  const listing = fs.opendirSync(dir);
  try {
    for (let entry = listing.readSync(); entry; entry = listing.readSync()) {
      if (names.length === OUTPUT_LIMITS.maxFiles) return { ok: false, message: "too many output files" };
      if (!entry.isFile())
        return { ok: false, message: "outputs must be regular files (no links or folders)" };
      if (!SAFE_NAME.test(entry.name)) return { ok: false, message: "an output file has an unsafe name" };
      if (!OUTPUT_LIMITS.extensions.includes(path.extname(entry.name).toLowerCase())) {
        return { ok: false, message: "an output file has a type that is not allowed" };
      }
      const { size } = fs.lstatSync(path.join(dir, entry.name));
      if (size > OUTPUT_LIMITS.maxFileBytes) return { ok: false, message: "an output file is too large" };
      total += size;
      names.push(entry.name);
    }
  } finally {
    listing.closeSync();
  }
  if (total > OUTPUT_LIMITS.maxTotalBytes)
    return { ok: false, message: "the outputs are too large together" };
  if (!names.includes(resultName)) {
    return { ok: false, message: "the file named by the result does not exist" };
  }
  return { ok: true, files: names.sort() };
}

/** Removes an attempt's folder: it failed, was cancelled or shut down, or its completion was fenced off. */
export async function discardOutputs(output: AttemptOutput): Promise<void> {
  await fsp.rm(output.dir, { recursive: true, force: true });
}

/**
 * Removes the folders of run `runId`'s other attempts, once an outcome of the run has been recorded
 * (no other attempt can win any more): what a killed worker left behind. `keep` is the recorded
 * attempt's folder, if it has one. Reads the task's folder, so callers only call it for runs that had
 * an earlier attempt.
 */
export async function removeOtherAttempts(
  root: string,
  taskId: number,
  runId: number,
  keep: string | null,
): Promise<void> {
  const taskDir = path.join(root, String(taskId));
  const names = await fsp.readdir(taskDir).catch(() => [] as string[]);
  const prefix = `${runId}.`;
  for (const name of names) {
    if (!name.startsWith(prefix) || `${taskId}/${name}` === keep) continue;
    if (!/^\d+\.\d+\.[0-9a-f-]+$/.test(name)) continue;
    await fsp.rm(path.join(taskDir, name), { recursive: true, force: true });
  }
}
