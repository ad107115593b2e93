// Where a client command writes. On a terminal (and without --json) it draws and prints text for
// people; otherwise nothing draws and every result is one JSON line on stdout, for scripts. Notes
// for people (reconnecting, warnings) go to stderr in both modes. Text from the server (file names,
// messages) is shown with control characters replaced: a file name must not drive the terminal.
import { errorCodeOf, exitCodeOf, messageOf } from "./exit.ts";

export class Output {
  readonly json: boolean;
  readonly #out: NodeJS.WriteStream;
  readonly #err: NodeJS.WriteStream;

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
    if (this.json) this.#out.write(`${JSON.stringify({ kind, ...fields })}\n`);
  }

  /** Text for people; nothing in JSON mode. */
  say(text: string): void {
    if (!this.json) this.#out.write(`${text}\n`);
  }

  /** A note on stderr, in either mode. */
  note(text: string): void {
    this.#err.write(`assay: ${text}\n`);
  }

  /** The error a command ends with, as a JSON line (scripts) and a line on stderr (people). */
  fail(err: unknown): number {
    const code = exitCodeOf(err);
    this.line("error", { code: errorCodeOf(err), message: messageOf(err), exitCode: code });
    this.note(messageOf(err));
    return code;
  }
}

// C0 and C1 controls, DEL, and the bidirectional overrides that can make a name read backwards.
// biome-ignore lint/suspicious/noControlCharactersInRegex: replacing control characters is the point
const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/g;

/** Server text made safe to print on a terminal. */
export const shown = (s: string | null | undefined) => (s ?? "").replace(UNSAFE, "?");

/** `s` cut to `width` characters with an ellipsis. */
export function fit(s: string, width: number): string {
  if (width <= 0) return "";
  return s.length <= width ? s : `${s.slice(0, Math.max(0, width - 1))}…`;
}

/** A table for people: columns padded to their widest cell. */
export function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const lineOf = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join("  ")
      .trimEnd();
  return [lineOf(header), ...rows.map(lineOf)].join("\n");
}

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[u]}`;
}

export function seconds(ms: number): string {
  return ms < 60_000
    ? `${(ms / 1000).toFixed(1)} s`
    : `${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`;
}
