// The local files a submit sends: the paths given, directories walked (hidden entries skipped), each
// hashed once. Every input keeps the path it is shown and stored under (`label`): a file given by
// itself is its base name, a file found in a directory its path inside that directory (with more
// than one path given, prefixed by the directory's own name).
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { storedFileName } from "../files/file-name.ts";
import { ClientUsageError } from "./exit.ts";

export interface LocalInput {
  /** Absolute path on disk. */
  path: string;
  /** Relative, "/"-separated: where its outputs go under --out. */
  label: string;
  sizeBytes: number;
  sha256: string;
}

const isHidden = (name: string) => name.startsWith(".");

/** Files under `dir` (recursively, sorted by name, hidden entries and symlinked directories skipped). */
function walk(dir: string, prefix: string, out: { path: string; label: string }[]): void {
  const entries = fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1));
  for (const entry of entries) {
    if (isHidden(entry.name)) continue;
    const full = path.join(dir, entry.name);
    const label = prefix ? `${prefix}/${entry.name}` : entry.name;
    if (entry.isDirectory()) walk(full, label, out);
    else if (entry.isFile() || (entry.isSymbolicLink() && statOrNull(full)?.isFile())) {
      out.push({ path: full, label });
    }
  }
}

function statOrNull(p: string): fs.Stats | null {
  try {
    return fs.statSync(p);
  } catch {
    return null;
  }
}

/** The files named by `args` (files and directories), each once, in the order given. */
export function listInputs(args: string[]): { path: string; label: string }[] {
  if (args.length === 0) throw new ClientUsageError("name at least one file or directory to submit");
  const found: { path: string; label: string }[] = [];
  for (const arg of args) {
    const stat = statOrNull(arg);
    if (!stat) throw new ClientUsageError(`no such file or directory: ${arg}`);
    const dir = path.resolve(arg);
    if (stat.isDirectory()) walk(dir, args.length > 1 ? path.basename(dir) : "", found);
    else if (stat.isFile()) found.push({ path: path.resolve(arg), label: path.basename(arg) });
    else throw new ClientUsageError(`not a regular file or directory: ${arg}`);
  }
  const seen = new Set<string>();
  const inputs = found.filter((f) => {
    const real = fs.realpathSync(f.path);
    if (seen.has(real)) return false;
    seen.add(real);
    return true;
  });
  if (inputs.length === 0) throw new ClientUsageError(`no files found in ${args.join(", ")}`);
  return uniqueLabels(inputs);
}

/** Two inputs with one label (a.csv from two directories) get " (2)", " (3)"… after the second. */
function uniqueLabels<T extends { label: string }>(inputs: T[]): T[] {
  const used = new Set<string>();
  return inputs.map((input) => {
    let label = input.label;
    for (let n = 2; used.has(label); n++) label = `${input.label} (${n})`;
    used.add(label);
    return { ...input, label };
  });
}

/** Size and SHA-256 of a file: read whole when small, streamed when not. */
export async function hashFile(
  file: string,
  signal?: AbortSignal,
): Promise<{ sizeBytes: number; sha256: string }> {
  const hash = createHash("sha256");
  const stat = await fs.promises.stat(file);
  if (stat.size <= 1024 * 1024) {
    const bytes = await fs.promises.readFile(file, signal ? { signal } : {});
    return { sizeBytes: bytes.length, sha256: hash.update(bytes).digest("hex") };
  }
  let sizeBytes = 0;
  for await (const chunk of fs.createReadStream(file, signal ? { signal } : {})) {
    hash.update(chunk as Buffer);
    sizeBytes += (chunk as Buffer).length;
  }
  return { sizeBytes, sha256: hash.digest("hex") };
}

/**
 * The name the server will store for a local file (the server's own rule, files/file-name.ts), so a
 * copy already there under the same name can be recognised. A quote travels as %22 in the multipart
 * header (as browsers send it) and is stored so; the upload sends exactly this name.
 */
export function serverName(label: string): string {
  return storedFileName(label.replace(/"/g, "%22"));
}
