// The name an uploaded file is stored under: one rule for the server, which applies it to every
// upload's file name (files.ts, sanitizeFileName), and for the command-line client, which predicts
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

const isHighSurrogate = (code: number) => code >= 0xd800 && code <= 0xdbff;

/**
 * The stored name of an upload named `raw`: its base name (either separator), a lone surrogate as
 * U+FFFD (what its UTF-8 on the wire decodes to), without control characters, without white space
 * at either end, at most 255 characters — cut before a character rather than inside one (half a
 * surrogate pair would be stored as U+FFFD) — and `upload` when nothing, `.` or `..` is left.
 *
 * Applied to its own result it changes nothing: the client sends a name it has already passed
 * through this rule, and the server applies it again, so the two must agree (white space at the
 * cut is trimmed too, which a second pass would otherwise remove).
 */
export function storedFileName(raw: string | undefined): string {
  const base = (raw ?? "").split(/[/\\]/).pop() ?? "";
  const clean = base.replace(LONE_SURROGATE, "\ufffd").replace(CONTROL, "").trim();
  let end = Math.min(clean.length, MAX_FILE_NAME_LENGTH);
  // A high surrogate at the cut: its pair would be cut off.
  if (end < clean.length && isHighSurrogate(clean.charCodeAt(end - 1))) end--;
  const name = clean.slice(0, end).trimEnd();
  return name === "" || name === "." || name === ".." ? "upload" : name;
}
