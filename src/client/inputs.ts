// The local files a submit sends: the paths given, directories walked (hidden entries skipped), each
// hashed once. Every input keeps the path it is shown and stored under (`label`): a file given by
// itself is its base name, a file found in a directory its path inside that directory (with more
// than one path given, prefixed by the directory's own name). A directory is read as bytes: a name
// that is not UTF-8 (`caf\xE9.csv`, from a Latin-1 system or an old Windows share) is labelled with
// each byte outside UTF-8 as `%XX` (`caf%E9.csv`) and opened by its own bytes (`file`).
import { isUtf8 } from "node:buffer";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { storedFileName } from "../files/file-name.ts";
import { tally } from "../files/folder-names.ts";
import { ClientUsageError } from "./exit.ts";

/** A local file found for a submit. */
export interface ListedInput {
  /** Absolute path, as shown: a name that is not UTF-8 as its label shows it. */
  path: string;
  /** Relative, "/"-separated: where its outputs go under --out. */
  label: string;
  /** What is opened, when not `path`: its bytes (a walked file), which a name that is not UTF-8 needs. */
  file?: Buffer;
}

export interface LocalInput extends ListedInput {
  sizeBytes: number;
  sha256: string;
}

const isHidden = (name: Buffer) => name[0] === 0x2e;

/** A UTF-8 sequence's length by its first byte; 0 for a byte no sequence starts with. */
const sequenceLength = (b: number) =>
  b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;

/**
 * A file name's bytes as text: UTF-8 as it is, each byte outside it as `%XX` (`caf\xE9.csv` is
 * `caf%E9.csv`). Node decodes such a byte as U+FFFD, and a path so decoded names no file (ENOENT),
 * or another file: `caf\xE9.csv`, `caf\xEA.csv` and `caf\uFFFD.csv` were one. Every name keeps its
 * own text, the same on every submit.
 */
export function nameText(name: Buffer): string {
  if (isUtf8(name)) return name.toString("utf8");
  let text = "";
  for (let i = 0; i < name.length; ) {
    const n = sequenceLength(name[i] as number);
    if (n > 0 && i + n <= name.length && isUtf8(name.subarray(i, i + n))) {
      text += name.toString("utf8", i, i + n);
      i += n;
    } else {
      text += `%${(name[i] as number).toString(16).toUpperCase().padStart(2, "0")}`;
      i++;
    }
  }
  return text;
}

const SEP = Buffer.from(path.sep);

/**
 * Files under `dir` (recursively, sorted by name, hidden entries and symlinked directories skipped),
 * read as bytes: `dir` is the directory's own bytes, `shownDir` its path as shown.
 */
function walk(dir: Buffer, shownDir: string, prefix: string, out: ListedInput[], skipped: string[]): void {
  const entries = fs
    .readdirSync(dir, { withFileTypes: true, encoding: "buffer" })
    .map((entry) => ({ entry, text: nameText(entry.name) }))
    .sort((a, b) =>
      a.text < b.text ? -1 : a.text > b.text ? 1 : Buffer.compare(a.entry.name, b.entry.name),
    );
  for (const { entry, text } of entries) {
    if (isHidden(entry.name)) continue;
    const full = Buffer.concat([dir, SEP, entry.name]);
    const shown = path.join(shownDir, text);
    const label = prefix ? `${prefix}/${text}` : text;
    if (entry.isDirectory()) walk(full, shown, label, out, skipped);
    else if (entry.isFile()) out.push({ path: shown, label, file: full });
    else if (entry.isSymbolicLink()) {
      const target = statOrNull(full);
      if (target?.isFile()) out.push({ path: shown, label, file: full });
      // Said, not skipped without a word (until 2026-12-07).
      else if (!target) skipped.push(`${shown} (a link to nothing)`);
      else if (target.isDirectory()) skipped.push(`${shown} (a link to a folder: not followed)`);
    }
  }
}

function statOrNull(p: string | Buffer): fs.Stats | null {
  try {
    return fs.statSync(p);
  } catch {
    return null;
  }
}

/**
 * The files named by `args` (files and directories), each once, in the order given. What a walk
 * skipped (a link to nothing, a link to a folder) and the paths that are one file (a link to a file
 * also found by itself) are told to `note`, a line each, or counted with the first few named.
 */
export function listInputs(args: string[], note: (text: string) => void = () => {}): ListedInput[] {
  if (args.length === 0) throw new ClientUsageError("name at least one file or directory to submit");
  const found: ListedInput[] = [];
  const skipped: string[] = [];
  const merged: string[] = [];
  for (const arg of args) {
    const named = fromCommandLine(arg);
    const stat = named && statOrNull(named.file ?? named.path);
    if (!named || !stat) throw new ClientUsageError(`no such file or directory: ${arg}${notUtf8(arg)}`);
    if (stat.isDirectory())
      walk(
        named.file ?? Buffer.from(named.path),
        named.path,
        args.length > 1 ? named.label : "",
        found,
        skipped,
      );
    else if (stat.isFile()) found.push(named);
    else throw new ClientUsageError(`not a regular file or directory: ${arg}`);
  }
  const seen = new Map<string, string>();
  const inputs = found.filter((f) => {
    // As bytes, by the system's realpath: names that are not UTF-8 differ only there, and
    // fs.realpathSync (not .native) decodes every name on the way as UTF-8 even when asked for bytes.
    const real = fs.realpathSync.native(f.file ?? f.path, { encoding: "buffer" }).toString("latin1");
    const first = seen.get(real);
    if (first !== undefined) {
      // The same path given twice is said once and no more.
      if (f.path !== first) merged.push(`${f.path} (the same file as ${first})`);
      return false;
    }
    seen.set(real, f.path);
    return true;
  });
  tell(note, "skipped", skipped);
  tell(note, "submitted once", merged);
  if (inputs.length === 0) throw new ClientUsageError(`no files found in ${args.join(", ")}`);
  return uniqueLabels(inputs);
}

/** How many entries listed more than one a line are counted, with the first few named. */
const NAMED = 3;

/** `entries` said on `note`: a line each, or, past NAMED + 2, counted with the first NAMED named. */
function tell(note: (text: string) => void, what: string, entries: string[]): void {
  if (entries.length <= NAMED + 2) {
    for (const e of entries) note(`${what}: ${e}`);
    return;
  }
  note(
    `${what}: ${entries.length} entries, ${entries.slice(0, NAMED).join(", ")} and ${entries.length - NAMED} more`,
  );
}

/**
 * The file or directory a path from the command line names. Node reads the command line as UTF-8,
 * so a name that is not (`data/*.csv` passes `caf\xE9.csv` as it is) arrives with U+FFFD in place of
 * its bytes and names nothing: it is then the one name in its folder that Node reads so, labelled
 * as a walk labels it. Two such names are refused: which one was meant cannot be told.
 */
export function fromCommandLine(arg: string): ListedInput | undefined {
  const full = path.resolve(arg);
  if (!arg.includes("\ufffd"))
    return statOrNull(arg) ? { path: full, label: path.basename(full) } : undefined;
  // Looked for among the folder's names first, a name that is U+FFFD itself among them: stat() alone
  // took that file for the one meant, whose name Node reads the same.
  const dir = path.dirname(full);
  let names: Buffer[];
  try {
    names = fs.readdirSync(dir, { encoding: "buffer" });
  } catch {
    return undefined;
  }
  const alike = names.filter((name) => name.toString() === path.basename(full)).sort(Buffer.compare);
  if (alike.length > 1)
    throw new ClientUsageError(
      `${arg} could be any of ${alike.length} files whose names read alike (${alike.map(nameText).join(", ")}): give the folder that holds them`,
    );
  const name = alike[0];
  if (name === undefined) return undefined;
  const label = nameText(name);
  return { path: path.join(dir, label), label, file: Buffer.concat([Buffer.from(dir), SEP, name]) };
}

/** Why a path from the command line with U+FFFD may name nothing (fromCommandLine found no file). */
const notUtf8 = (arg: string) =>
  arg.includes("\ufffd")
    ? " (a folder whose name is not UTF-8 cannot be named on the command line: give the folder that holds it)"
    : "";

/**
 * Inputs with one label (a.csv given from two folders, or data/a.csv from x/data and y/data) are
 * labelled with as many of their folders above the label as make them differ (x/data/a.csv and
 * y/data/a.csv): real paths, as the rest of a label is. Until 2026-12-07 the second got " (2)", a name
 * it had nowhere, which the upload stored as its name ("a.csv (2)") and which depended on the
 * order of the arguments. The stored name is the label's last part, so both are stored as a.csv, as
 * they are named; the zip and `assay download` give each its run's id. Only paths that differ nowhere
 * above the label (not seen: the inputs are distinct files) would still get " (2)".
 */
function uniqueLabels<T extends { path: string; label: string }>(inputs: T[]): T[] {
  const labels = inputs.map((i) => i.label);
  const parents = inputs.map((i) =>
    i.path.split(path.sep).filter(Boolean).slice(0, -i.label.split("/").length),
  );
  for (let above = 1; ; above++) {
    const n = tally(labels);
    const clashing = labels.flatMap((l, i) => ((n.get(l) ?? 0) > 1 ? [i] : []));
    if (clashing.length === 0) break;
    let longer = false;
    for (const i of clashing) {
      const folders = parents[i] as string[];
      if (above > folders.length) continue;
      labels[i] = [...folders.slice(-above), (inputs[i] as T).label].join("/");
      longer = true;
    }
    if (!longer) break;
  }
  const used = new Set<string>();
  return inputs.map((input, i) => {
    const wanted = labels[i] as string;
    let label = wanted;
    for (let n = 2; used.has(label); n++) label = `${wanted} (${n})`;
    used.add(label);
    return { ...input, label };
  });
}

/** Size and SHA-256 of a file: read whole when small, streamed when not. */
export async function hashFile(
  file: string | Buffer,
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
 * copy already there under the same name can be recognised; the upload sends exactly this name (a
 * quote as %22 in the multipart header, as browsers send it, which the server reads back as a quote).
 */
export function serverName(label: string): string {
  return storedFileName(label);
}
