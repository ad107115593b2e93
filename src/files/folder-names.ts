// The folder a run's outputs get, named after its input file: one set of rules for the task's zip
// (tasks/outputs.ts, zipPages) and for the command-line client's downloads (client/download.ts:
// `assay download`, `submit --out`), so that a run's folder in the zip is its folder in a download.
//
// Pure, and imports nothing: the client loads this module, and a client command must load nothing of
// the server (test/e2e/client.test.ts and test/unit/bundle.test.ts trace what `assay status` and
// `assay tasks` load).

/** The task's results table, at the root of a zip and of a download: no run's folder may be it. */
export const RESULTS_FILE = "results.csv";

/**
 * What may not be in a path segment: the separators, the characters Windows refuses in a name
 * (`<>:"|?*`), control characters (U+0000–U+001F, which Windows refuses too, and U+007F), and the
 * bidirectional embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069), with which a folder
 * shown in a file manager or an archive tool reads other than it is (`x\u202Efdp.exe` shows as
 * `xexe.pdf`); an input's stored name may hold them, its folder may not.
 */
// biome-ignore lint/suspicious/noControlCharactersInRegex: replacing control characters is the point
const UNSAFE = /[\u0000-\u001f\u007f\u202a-\u202e\u2066-\u2069/\\<>:"|?*]/g;

/**
 * Windows' device names: a file whose name up to the first dot is one of them, also with spaces
 * after it (`CON.csv`, `nul .txt`, `LPT1`), cannot be created or opened as a file there. Windows also
 * takes the superscript digits ¹²³ for digits in COM and LPT.
 */
const RESERVED = /^(con|prn|aux|nul|com[1-9¹²³]|lpt[1-9¹²³]) *$/i;

/** Whether `name` is a Windows device name up to its first dot (`CON.csv`, `nul .txt`, `LPT1`). */
export const isDeviceName = (name: string) => RESERVED.test(name.split(".", 1)[0] as string);

/**
 * The longest name, in UTF-8 bytes, that Linux's file systems hold (ext4, XFS, Btrfs: 255 bytes;
 * macOS and Windows count 255 UTF-16 units, which this never exceeds). An upload's name may be 255
 * characters, up to 765 bytes in a script such as Chinese.
 */
const MAX_SEGMENT_BYTES = 255;

const utf8Length = (codePoint: number) =>
  codePoint < 0x80 ? 1 : codePoint < 0x800 ? 2 : codePoint < 0x10000 ? 3 : 4;

/** The longest start of `text` of at most `max` UTF-8 bytes, never splitting a character. */
function fitBytes(text: string, max: number): string {
  let bytes = 0;
  let end = 0;
  for (const ch of text) {
    bytes += utf8Length(ch.codePointAt(0) as number);
    if (bytes > max) return text.slice(0, end);
    end += ch.length;
  }
  return text;
}

/**
 * `name` + `suffix`, the name's last segment cut short (safeSegment's limit) so that the two fit in one
 * segment. What the suffix says (a run's id) keeps the cut name apart from every other.
 */
export function withSuffix(name: string, suffix: string): string {
  const slash = name.lastIndexOf("/");
  const last = name.slice(slash + 1);
  let room = MAX_SEGMENT_BYTES;
  for (const ch of suffix) room -= utf8Length(ch.codePointAt(0) as number);
  return `${name.slice(0, slash + 1)}${fitBytes(last, room)}${suffix}`;
}

/**
 * A name (an input's, an output's, a segment of a local path) as one path segment that means the same
 * folder or file on Linux, macOS and Windows: separators, `<>:"|?*`, control characters and bidi
 * overrides become `_`;
 * leading dots become one `_` (no `.`, `..` or hidden file); each trailing dot or space becomes `_`
 * (Windows drops them, so `x.` would be `x` there); a Windows device name gets a `_` before it
 * (`CON.csv` → `_CON.csv`); a name over 255 UTF-8 bytes is cut there (at a character); nothing left
 * is `input`. Applied twice it changes nothing more.
 */
export function safeSegment(name: string): string {
  const trailing = (text: string) => text.replace(/[. ]+$/, (tail) => "_".repeat(tail.length));
  const clean = trailing(name.replace(UNSAFE, "_").replace(/^\.+/, "_"));
  if (clean === "") return "input";
  // The device name's `_` first, then the cut: the `_` counts towards the limit (added after, a name
  // cut to 255 bytes became 256). A cut may leave a dot or a space at the end again.
  const named = isDeviceName(clean) ? `_${clean}` : clean;
  return trailing(fitBytes(named, MAX_SEGMENT_BYTES));
}

/**
 * How a folder compares where outputs land: macOS and Windows fold case, and macOS stores names
 * decomposed, so `A.csv` and `a.csv`, or a composed and a decomposed `é.csv`, are one folder there.
 * The fold is lower case of upper case of lower case, not lower case alone: macOS (APFS) compares by
 * Unicode's case folding and Windows by upper case, under which `ſ` is `s`, `ς` is `σ`, `ϐ` is `β`,
 * `ı` is `i` and `ẞ` is `ss`, letters toLowerCase() alone keeps apart. For every single character this
 * equates what Unicode's full case folding equates and what simple upper-casing equates (checked
 * against both tables); what it equates beyond them (`ß.csv` and `ss.csv` on Windows) only adds a
 * suffix. NFC again after the fold, whose upper case decomposes a few letters (`ǰ` → `J` + U+030C).
 * Computed in JS, not in SQL: PostgreSQL's lower() follows the database's collation (ASCII only under
 * C, which the embedded cluster uses).
 */
export const folderKey = (folder: string) =>
  folder.normalize("NFC").toLowerCase().toUpperCase().toLowerCase().normalize("NFC");

/** The key of the folder a run of this input gets before any suffix: that of its safe name. */
export const inputFolderKey = (inputName: string) => folderKey(safeSegment(inputName));

/**
 * What every folder made unique ends with. A folder whose key ends so is made unique too: else an
 * input named `a.csv (run 12)` and run 12 of two runs named `a.csv` would share a folder. With it, a
 * made-unique folder's key ends with its own run's id and a plain one's never does, so no two folders
 * share a key.
 */
export const RUN_SUFFIX = / \(run [0-9]+\)$/;

/** A folder made unique by its run's id. */
export const withRunSuffix = (folder: string, runId: string) => withSuffix(folder, ` (run ${runId})`);

/**
 * Whether a folder (by its key) gets ` (run <id>)`: when it is `shared` (another run's folder has the
 * same key), when it is the results table's name, or when it already ends like a made-unique folder.
 */
export const needsRunSuffix = (key: string, shared: boolean) =>
  shared || key === RESULTS_FILE || RUN_SUFFIX.test(key);

/**
 * The folder of a run of the input `inputName`: its safe name, with ` (run <runId>)` when
 * needsRunSuffix says so. `shared`: another run of the same task (of those that get a folder) has
 * the same inputFolderKey.
 */
export function runFolder(inputName: string, runId: string, shared: boolean): string {
  const base = safeSegment(inputName);
  return needsRunSuffix(folderKey(base), shared) ? withRunSuffix(base, runId) : base;
}

/**
 * The names a run's output files are saved under, by index of `names`: one name each where macOS and
 * Windows see one file (folderKey: case, Unicode normalization). A program could give its outputs
 * `Report.json` and `report.json` until the runner refused them (runner/outputs.ts, checkOutputs):
 * runs recorded before may have both, and whichever was extracted or saved second replaced the first
 * there. Of names that compare alike, the first in code-unit order keeps its name and the others get
 * ` (2)`, ` (3)`… before their extension, so the outcome depends on the set of names, not on the order
 * they were listed in: the task's zip (tasks/outputs.ts) and `assay download` (client/download.ts)
 * name a run's files alike. A space and brackets are in no output name the runner accepts
 * (SAFE_NAME), so a new name never meets another output's.
 */
export function distinctFileNames(names: readonly string[]): string[] {
  const order = names.map((_, i) => i);
  order.sort((a, b) => {
    const x = names[a] as string;
    const y = names[b] as string;
    return x < y ? -1 : x > y ? 1 : a - b;
  });
  const out = [...names];
  const used = new Set<string>();
  const repeated: number[] = [];
  // Every name that keeps its own first, so that a renamed one cannot take a later one's name.
  for (const i of order) {
    const key = folderKey(names[i] as string);
    if (used.has(key)) repeated.push(i);
    else used.add(key);
  }
  for (const i of repeated) {
    const name = names[i] as string;
    // The extension as path.extname takes it (this module imports nothing): from the last dot, unless
    // that dot begins the name.
    const dot = name.lastIndexOf(".");
    const ext = dot > 0 ? name.slice(dot) : "";
    const stem = name.slice(0, name.length - ext.length);
    let saved = name;
    for (let n = 2; used.has(folderKey(saved)); n++) saved = withSuffix(stem, ` (${n})${ext}`);
    used.add(folderKey(saved));
    out[i] = saved;
  }
  return out;
}

/** How many of `keys` are each key. */
export function tally(keys: readonly string[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const k of keys) counts.set(k, (counts.get(k) ?? 0) + 1);
  return counts;
}
