// The name an uploaded file is stored under: one rule for the server, which applies it to every
// upload's file name (http/routes/files.ts), and for the command-line client, which predicts
// with it the name its upload will get, to prefer a copy of a file already stored under that name
// (client/inputs.ts, serverName).
//
// Pure, and imports nothing: the client loads this module, and a client command must load nothing
// of the server (test/e2e/client.test.ts and test/unit/bundle.test.ts trace what client commands load).

/** The longest stored name, in UTF-16 code units (what a JavaScript string's length counts). */
export const MAX_FILE_NAME_LENGTH = 255;

/**
 * Control characters: C0, DEL and C1. U+009B is a terminal's CSI (like ESC [), which a CLI printing
 * the name would obey; CR and LF would end a multipart header.
 */
// biome-ignore lint/suspicious/noControlCharactersInRegex: stripping control characters is the point
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/g;

/** Half a surrogate pair without its other half: UTF-8 has no encoding for it. */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/** Whether `s` holds half a surrogate pair (text neither UTF-8 nor PostgreSQL can hold). */
export const hasLoneSurrogate = (s: string) => s.search(LONE_SURROGATE) !== -1;

const isHighSurrogate = (code: number) => code >= 0xd800 && code <= 0xdbff;

/**
 * Grapheme clusters: what a reader takes for one character (a letter with its accents, an emoji with
 * its joiners and modifiers, a flag's two regional indicators). Intl is a global: this module still
 * imports nothing. The rules are UAX #29's, which no locale tailors. A Node whose ICU knows an
 * older Unicode could cut a newest emoji elsewhere, but the client and the server never disagree
 * over it: the client sends a name it has already cut, which the server keeps as it is.
 */
const GRAPHEMES = new Intl.Segmenter("en", { granularity: "grapheme" });

/**
 * Where to cut `s`, longer than `max`: at the last grapheme boundary at or before `max`, so no
 * cluster is split (no family emoji left with a trailing joiner, no letter without its combining
 * accent, no flag halved). Segments are computed lazily, only up to the cut. A first cluster longer
 * than `max` by itself (a letter under hundreds of combining marks) is cut at the last whole code
 * point instead, rather than losing the whole name.
 */
function cutAt(s: string, max: number): number {
  let end = 0;
  for (const { index } of GRAPHEMES.segment(s)) {
    if (index > max) break;
    end = index;
  }
  if (end > 0) return end;
  // A high surrogate at the cut: its pair would be cut off.
  return isHighSurrogate(s.charCodeAt(max - 1)) ? max - 1 : max;
}

/**
 * A Windows path (`C:\…`, `.\…`, `..\…`, or one that starts with a backslash: `\\server\…` arrives as `\server\…`,
 * a quoted `filename`'s `\\` being one backslash to the multipart parser), which old browsers sent
 * whole: its name is after its last backslash. Elsewhere a backslash is part of a name
 * (`back\slash.csv` on Linux was stored as `slash.csv` until 2026-12-07).
 */
const WINDOWS_PATH = /^([A-Za-z]:|\.\.?)?\\/;

/**
 * The stored name of an upload named `raw`: its base name (after the last `/`, or the last `\` of a
 * Windows path), with `%22` as the quote it stands for (browsers, curl and the CLI send a quote in a
 * multipart file name so, as HTML says; it was stored as `%22` until 2026-12-07 — a name that holds
 * `%22` itself is taken for a quote too, which no client can tell apart), a lone surrogate as
 * U+FFFD (what its UTF-8 on the wire decodes to), without control characters, without white space
 * at either end, at most 255 UTF-16 code units — cut between grapheme clusters rather than inside
 * one (half a surrogate pair would be stored as U+FFFD; a family emoji would keep a trailing joiner,
 * a letter lose its combining accent, a flag be halved) — and `upload` when nothing, `.` or `..` is
 * left.
 *
 * Applied to its own result it changes nothing: the client sends a name it has already passed
 * through this rule, and the server applies it again, so the two must agree (white space at the
 * cut is trimmed too, which a second pass would otherwise remove).
 */
export function storedFileName(raw: string | undefined): string {
  const last = (raw ?? "").split("/").pop() ?? "";
  let clean = last.replace(LONE_SURROGATE, "\ufffd").replace(CONTROL, "").replaceAll("%22", '"').trim();
  // A Windows path's last part (decided on the name as cleaned, so a second pass decides alike).
  if (WINDOWS_PATH.test(clean)) clean = clean.slice(clean.lastIndexOf("\\") + 1).trim();
  const end = clean.length > MAX_FILE_NAME_LENGTH ? cutAt(clean, MAX_FILE_NAME_LENGTH) : clean.length;
  const name = clean.slice(0, end).trimEnd();
  return name === "" || name === "." || name === ".." ? "upload" : name;
}
