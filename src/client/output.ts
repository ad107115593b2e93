// Where a client command writes. On a terminal (and without --json) it draws and prints text for
// people; otherwise nothing draws and every result is one JSON line on stdout, for scripts. Notes
// for people (reconnecting, warnings) go to stderr in both modes. Text from the server (file names,
// messages) is shown with control characters replaced: a file name must not drive the terminal.

import { showUnseen, UNSEEN } from "../../web/unseen.js";
import {
  ClientUsageError,
  EXIT,
  errorCodeOf,
  exitCodeOf,
  Interrupted,
  messageOf,
  Terminated,
} from "./exit.ts";

export class Output {
  readonly json: boolean;
  readonly #out: NodeJS.WriteStream;
  readonly #err: NodeJS.WriteStream;
  /** While bars are drawn on the terminal stderr shares: what prints a line above them. */
  #above: ((line: string) => void) | undefined;
  /** What stopped the command (Ctrl-C, SIGTERM, SIGHUP, its reader gone), once something has. */
  stoppedBy: Interrupted | undefined;

  constructor(o: { json: boolean; stdout?: NodeJS.WriteStream; stderr?: NodeJS.WriteStream }) {
    this.#out = o.stdout ?? process.stdout;
    this.#err = o.stderr ?? process.stderr;
    this.json = o.json || !this.#out.isTTY;
  }

  /** True when bars may be drawn. */
  get tty(): boolean {
    return !this.json;
  }

  get stream(): NodeJS.WriteStream {
    return this.#out;
  }

  /** One JSON line (scripts). */
  line(kind: string, fields: object): void {
    if (this.json) this.#out.write(`${jsonLine({ kind, ...fields })}\n`);
  }

  /** Text for people; nothing in JSON mode. */
  say(text: string): void {
    if (!this.json) this.#out.write(`${text}\n`);
  }

  /**
   * A note on stderr, in either mode, with control characters replaced: it often carries a local
   * file's name or the server's words (an error message), and stderr is usually a terminal.
   */
  note(text: string): void {
    this.#stderrLine(`assay: ${shown(text)}`);
  }

  /**
   * The client's own words of several lines (a usage error of the argument parser's), each line
   * shown on a line of its own (a line's control characters still replaced).
   */
  noteLines(text: string): void {
    const [first = "", ...rest] = text.split(/\r?\n/);
    this.#stderrLine([`assay: ${shown(first)}`, ...rest.map((l) => `  ${shown(l)}`)].join("\n"));
  }

  /**
   * While bars are drawn (`log`, what prints a line above them; undefined when they stop), notes go
   * above the bars: written to the terminal under them, a note left stale copies of the bars in the
   * scrollback. Only when stderr is that terminal: a stderr sent elsewhere (`2>log`) keeps its notes.
   */
  drawing(log: ((line: string) => void) | undefined): void {
    this.#above = log && this.#err.isTTY && this.#out.isTTY ? log : undefined;
  }

  #stderrLine(line: string): void {
    if (this.#above) this.#above(line);
    else this.#err.write(`${line}\n`);
  }

  /**
   * The error a command ends with, as a JSON line (scripts) and a line on stderr (people). Ctrl-C is
   * no error: it is an `interrupted` line, as where a command says more (submit, follow).
   */
  /**
   * A command stopped by Ctrl-C, SIGTERM or SIGHUP (or its reader): an "interrupted" line (with the
   * `signal` when not Ctrl-C), the note; the exit code (130, 143, 129).
   */
  interrupted(message: string, fields: Record<string, unknown> = {}): number {
    const by = this.stoppedBy;
    const signal = by instanceof Terminated ? { signal: by.signal } : {};
    this.line("interrupted", { ...fields, ...signal, message });
    this.note(by instanceof Terminated ? `${by.signal}: ${message}` : message);
    return by ? exitCodeOf(by) : EXIT.INTERRUPTED;
  }

  fail(err: unknown): number {
    const code = exitCodeOf(err);
    if (err instanceof Interrupted)
      this.line("interrupted", {
        ...(err instanceof Terminated ? { signal: err.signal } : {}),
        message: messageOf(err),
      });
    else this.line("error", { code: errorCodeOf(err), message: messageOf(err), exitCode: code });
    if (err instanceof ClientUsageError && err.ownLines) this.noteLines(messageOf(err));
    else this.note(messageOf(err));
    return code;
  }
}

/**
 * Server text (a name, a program's message, an error message) or a local file's name made safe to
 * print on a terminal: a character that is not seen as itself (a control, which drives the terminal:
 * ESC starts an escape sequence, CR and BS overwrite what was printed; a bidi override; a zero-width
 * space) as its code point, ⟨U+202E⟩, by the dashboard's rule (web/unseen.js).
 */
export const shown = (s: string | null | undefined) => showUnseen(s ?? "");

/**
 * A value as one line of JSON safe to print on a terminal (`--json` on a terminal shows it as is):
 * UNSEEN's characters JSON.stringify leaves as they are (DEL, the C1 controls — U+009B is CSI —, the
 * line and paragraph separators, bidirectional controls, zero-width characters) escaped. They can
 * only be inside strings, where an escape means the same.
 */
export const jsonLine = (value: unknown) => JSON.stringify(value).replace(UNSEEN, jsonEscape);

/** A character as JSON escapes, one for each of its UTF-16 code units (two past U+FFFF). */
function jsonEscape(c: string): string {
  let out = "";
  for (let i = 0; i < c.length; i++) out += `\\u${c.charCodeAt(i).toString(16).padStart(4, "0")}`;
  return out;
}

const graphemes = new Intl.Segmenter("en", { granularity: "grapheme" });

/** A character cluster that takes no column: combining marks, joiners, variation selectors, controls. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: controls take no column
const ZERO_WIDTH = /^[\p{Mark}\p{Default_Ignorable_Code_Point}\u0000-\u001f\u007f-\u009f]+$/u;

/**
 * Characters a terminal draws two columns wide: East Asian wide and fullwidth (Hangul Jamo, CJK,
 * kana, Hangul syllables, fullwidth forms), and emoji shown as emoji.
 */
const WIDE =
  /^(?:[\u1100-\u115f\u2e80-\u303e\u3041-\u33ff\u3400-\u4dbf\u4e00-\u9fff\ua000-\ua4cf\ua960-\ua97f\uac00-\ud7a3\uf900-\ufaff\ufe10-\ufe19\ufe30-\ufe6f\uff00-\uff60\uffe0-\uffe6\u{16fe0}-\u{16fe4}\u{17000}-\u{18aff}\u{1b000}-\u{1b2ff}\u{1f200}-\u{1f2ff}\u{20000}-\u{2fffd}\u{30000}-\u{3fffd}]|\p{Emoji_Presentation}|\p{Extended_Pictographic}\ufe0f)/u;

const clusterWidth = (g: string) => (ZERO_WIDTH.test(g) ? 0 : WIDE.test(g) ? 2 : 1);

/** The columns `s` takes on a terminal (a wide character two, a combining mark none). */
export function displayWidth(s: string): number {
  // ASCII, the usual case: one column a character.
  if (/^[\x20-\x7e]*$/.test(s)) return s.length;
  let width = 0;
  for (const { segment } of graphemes.segment(s)) width += clusterWidth(segment);
  return width;
}

/**
 * `s` cut to at most `width` terminal columns, with an ellipsis when cut: whole characters only
 * (never half an emoji's surrogate pair, nor a letter without its accent), wide ones counted twice.
 */
export function fit(s: string, width: number): string {
  if (width <= 0) return "";
  if (displayWidth(s) <= width) return s;
  let out = "";
  let used = 0;
  for (const { segment } of graphemes.segment(s)) {
    const w = clusterWidth(segment);
    if (used + w > width - 1) break;
    out += segment;
    used += w;
  }
  return `${out}…`;
}

/**
 * A name cut to at most `width` terminal columns as `fit` cuts, but in its middle: its end — the
 * extension, the part that tells `report-2026-final.csv` from `report-2026-final.csv.exe` — stays in
 * view (`very long na…end.csv`).
 */
export function fitName(s: string, width: number): string {
  if (width <= 2 || displayWidth(s) <= width) return fit(s, width);
  const clusters = Array.from(graphemes.segment(s), ({ segment }) => segment);
  let tail = "";
  let used = 0;
  const tailWidth = Math.floor((width - 1) / 2);
  for (let i = clusters.length - 1; i >= 0; i--) {
    const segment = clusters[i] as string;
    const w = clusterWidth(segment);
    if (used + w > tailWidth) break;
    tail = segment + tail;
    used += w;
  }
  return `${fit(s, width - used).slice(0, -1)}…${tail}`;
}

/** `s` padded with spaces to `width` terminal columns (as String#padEnd, counting columns). */
export const pad = (s: string, width: number) => s + " ".repeat(Math.max(0, width - displayWidth(s)));

/** A table for people: columns padded to their widest cell, in terminal columns. */
export function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) =>
    Math.max(displayWidth(h), ...rows.map((r) => displayWidth(r[i] ?? ""))),
  );
  const lineOf = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : pad(c, widths[i] ?? 0)))
      .join("  ")
      .trimEnd();
  return [lineOf(header), ...rows.map(lineOf)].join("\n");
}

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  for (let u = 0; ; u++) {
    // Rounded as shown: 1023.7 KiB is "1.0 MiB", not "1024 KiB"; 9.97 KiB is "10 KiB".
    const text = v.toFixed(v < 9.95 ? 1 : 0);
    if (Number(text) < 1024 || u === units.length - 1) return `${text} ${units[u]}`;
    v /= 1024;
  }
}

/** A duration for people: "12.3 s", or "2 min 5 s" from a minute on (rounded first: never "60 s"). */
export function seconds(ms: number): string {
  const tenths = Math.round(ms / 100);
  if (tenths < 600) return `${(tenths / 10).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  return `${Math.floor(s / 60)} min ${s % 60} s`;
}
