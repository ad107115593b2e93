// Output checks and the keys an attempt's outputs are stored under. Each attempt has its own key,
// `<taskId>/<runId>.<attempt>.<leaseToken>` (relative to `outputs/` in the store), and nothing ever
// renames or replaces another attempt's objects: after the output check, the attempt's completion names
// its key (`runs.output_key`), and only a completion that wins the lease fence is recorded. So
// publication is decided by the fence: an attempt that lost its lease can neither replace nor delete the
// outputs of the attempt that won — it only ever removes its own. The lease token is in the key because
// an attempt number can repeat (a refunded attempt; a claim lost in a database crash, see runClaim)
// while the earlier attempt's process may still be running: each attempt owns its key.
import fs from "node:fs";
import path from "node:path";
import { folderKey, isDeviceName } from "../files/folder-names.ts";

/** The output key of an attempt (see above). */
export const attemptOutputKey = (taskId: number, runId: number, attempt: number, token: string) =>
  `${taskId}/${runId}.${attempt}.${token}`;

/** An output file as the check found it and the run's result records it. */
export interface OutputFile {
  name: string;
  size: number;
}

export const OUTPUT_LIMITS = {
  maxFiles: 16,
  maxFileBytes: 100 * 1024 * 1024,
  maxTotalBytes: 200 * 1024 * 1024,
  extensions: [".json", ".csv", ".html", ".png", ".svg", ".txt", ".md"],
};

/**
 * Names of outputs that may be served: a plain file name, no path, no leading dot. (What a script may
 * name a new output is stricter: newOutputName.)
 */
export const SAFE_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/**
 * Names a script may give its outputs: SAFE_NAME, and none that Windows keeps for a device — a zip or
 * a download of it could not be extracted or written there (the folder names follow the same rules,
 * files/folder-names.ts). Only new outputs are held to this: one recorded before it was refused
 * (`aux.json`) is still served.
 */
export const newOutputName = (name: string) => SAFE_NAME.test(name) && !isDeviceName(name);

const REPLACED = "the output folder was replaced (it must stay a folder)";

export type OutputCheck = { ok: true; files: OutputFile[] } | { ok: false; message: string };

/**
 * Validates an attempt's directory against the result event and the limits. Synchronous, like the
 * rest of the success path: a few metadata calls on the local disk cost less than their thread-pool
 * round trips (measured: 0.07 against 0.32 ms of CPU per run for check and publish), and reading the
 * directory stops at the file limit, so a program that wrote a million files cannot stall the loop.
 */
/** This process may read `file` (root always may: checkOutputs checks the mode bits too). */
function readable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.R_OK);
    return true;
  } catch {
    return false;
  }
}

export function checkOutputs(dir: string, resultName: string): OutputCheck {
  if (path.basename(resultName) !== resultName) {
    return { ok: false, message: "the result names a file outside the output directory" };
  }
  if (!newOutputName(resultName)) return { ok: false, message: "the result names an unsafe output file" };
  // The folder itself first: the program may have removed it or put something else in its place. A
  // link to a folder elsewhere passed the check with what it pointed at, and the link itself was then
  // published (renamed into the store, or uploaded through): a stored output that points out of the
  // store, whose content can change after the check. Nothing of the program lives any more (the run
  // settled after its group was killed), so what is looked at here is what would be published.
  let folder: fs.Stats | undefined;
  try {
    folder = fs.lstatSync(dir);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== "ENOENT" && code !== "ENOTDIR") throw err;
  }
  if (!folder?.isDirectory()) return { ok: false, message: REPLACED };
  const files: OutputFile[] = [];
  let total = 0;
  let listing: fs.Dir;
  try {
    listing = fs.opendirSync(dir);
  } catch (err) {
    // The program's doing too (it took its own folder's permissions away): a failed run, not a
    // worker's error to retry.
    if ((err as NodeJS.ErrnoException).code !== "EACCES") throw err;
    return { ok: false, message: "the output folder cannot be read" };
  }
  try {
    for (let entry = listing.readSync(); entry; entry = listing.readSync()) {
      if (files.length === OUTPUT_LIMITS.maxFiles) return { ok: false, message: "too many output files" };
      if (!entry.isFile())
        return { ok: false, message: "outputs must be regular files (no links or folders)" };
      if (!newOutputName(entry.name)) return { ok: false, message: "an output file has an unsafe name" };
      if (!OUTPUT_LIMITS.extensions.includes(path.extname(entry.name).toLowerCase())) {
        return { ok: false, message: "an output file has a type that is not allowed" };
      }
      const stat = fs.lstatSync(path.join(dir, entry.name));
      // A file with another name as well is a hard link, maybe to what the program did not write
      // (/etc/passwd, a stored input): a file the program made has only its own name.
      if (!stat.isFile() || stat.nlink !== 1)
        return { ok: false, message: "outputs must be regular files (no links or folders)" };
      if (stat.size > OUTPUT_LIMITS.maxFileBytes)
        return { ok: false, message: "an output file is too large" };
      // Readable by nobody (the program's chmod 000): it could be neither flushed nor uploaded nor
      // served (the handler threw, a worker's error), and root reads it anyway (no access() here).
      if ((stat.mode & 0o444) === 0 || !readable(path.join(dir, entry.name)))
        return { ok: false, message: "an output file cannot be read" };
      total += stat.size;
      files.push({ name: entry.name, size: stat.size });
    }
  } finally {
    listing.closeSync();
  }
  if (total > OUTPUT_LIMITS.maxTotalBytes)
    return { ok: false, message: "the outputs are too large together" };
  if (!files.some((f) => f.name === resultName)) {
    return { ok: false, message: "the file named by the result does not exist" };
  }
  files.sort((a, b) => (a.name < b.name ? -1 : 1));
  // Names macOS and Windows take for one file (folderKey: case; SAFE_NAME leaves nothing else to
  // fold): extracted from the zip or saved by `assay download` there, one would replace the other.
  // Outputs recorded before this was refused are still given names apart (distinctFileNames).
  const seen = new Map<string, string>();
  for (const f of files) {
    const key = folderKey(f.name);
    const first = seen.get(key);
    if (first !== undefined) {
      return {
        ok: false,
        message: `output files whose names differ only in case (${first}, ${f.name}) are one file on macOS and Windows`,
      };
    }
    seen.set(key, f.name);
  }
  return { ok: true, files };
}
