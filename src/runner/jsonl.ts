// A JSON Lines reader for a child's stdout: keeps a partial line across chunks, bounds the line
// length and the total, and accepts only the protocol's events, in UTF-8. Pure: no I/O.
import { isUtf8 } from "node:buffer";

export interface ProgressEvent {
  type: "progress";
  percent: number;
  message?: string;
}

export interface ResultEvent {
  type: "result";
  outputFileName: string;
  metrics: Record<string, number>;
}

/**
 * Why the program is about to fail (exit 2–5), in words for the user whose data it is: "column
 * \"score\" is not in the header". Shown after the exit code's own message (outcomeOf).
 */
export interface ErrorEvent {
  type: "error";
  message: string;
}

export type ProtocolEvent = ProgressEvent | ResultEvent | ErrorEvent;

export class ProtocolError extends Error {
  readonly reason: "line-too-long" | "output-too-large" | "invalid-json" | "invalid-event";

  constructor(reason: ProtocolError["reason"], detail: string) {
    super(detail);
    this.name = "ProtocolError";
    this.reason = reason;
  }
}

export interface JsonLinesLimits {
  /** Longest accepted line in bytes, without its newline (64 KiB). */
  maxLineBytes: number;
  /** Most bytes accepted in total (8 MiB). */
  maxTotalBytes: number;
}

export const DEFAULT_JSONL_LIMITS: JsonLinesLimits = {
  maxLineBytes: 64 * 1024,
  maxTotalBytes: 8 * 1024 * 1024,
};

const MAX_MESSAGE_CHARS = 500;

/** `s` cut to MAX_MESSAGE_CHARS UTF-16 units, never between the two halves of a character. */
function cut(s: string): string {
  const head = s.slice(0, MAX_MESSAGE_CHARS);
  return /[\uD800-\uDBFF]$/.test(head) ? head.slice(0, -1) : head;
}

/**
 * A line's text. Bytes that are not UTF-8 break the protocol like any other bad line: decoded, they
 * would become U+FFFD in a message or a file name, and the program's fault would pass unseen.
 */
function decode(bytes: Buffer): string {
  if (!isUtf8(bytes)) throw new ProtocolError("invalid-json", "a stdout line is not valid UTF-8");
  return bytes.toString("utf8");
}

function parseEvent(line: string): ProtocolEvent {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    throw new ProtocolError("invalid-json", `not JSON: ${line.slice(0, 80)}`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ProtocolError("invalid-event", "an event must be a JSON object");
  }
  const e = value as Record<string, unknown>;
  if (e.type === "progress") {
    if (typeof e.percent !== "number" || !Number.isFinite(e.percent) || e.percent < 0 || e.percent > 100) {
      throw new ProtocolError("invalid-event", "progress.percent must be a number from 0 to 100");
    }
    if (e.message !== undefined && typeof e.message !== "string") {
      throw new ProtocolError("invalid-event", "progress.message must be a string");
    }
    return e.message === undefined
      ? { type: "progress", percent: e.percent }
      : { type: "progress", percent: e.percent, message: cut(e.message) };
  }
  if (e.type === "result") {
    if (typeof e.outputFileName !== "string" || e.outputFileName.length === 0) {
      throw new ProtocolError("invalid-event", "result.outputFileName must be a non-empty string");
    }
    const metrics = e.metrics ?? {};
    if (typeof metrics !== "object" || metrics === null || Array.isArray(metrics)) {
      throw new ProtocolError("invalid-event", "result.metrics must be an object");
    }
    for (const [k, v] of Object.entries(metrics)) {
      if (typeof v !== "number" || !Number.isFinite(v)) {
        throw new ProtocolError("invalid-event", `result.metrics.${k} must be a finite number`);
      }
    }
    return { type: "result", outputFileName: e.outputFileName, metrics: metrics as Record<string, number> };
  }
  if (e.type === "error") {
    if (typeof e.message !== "string" || e.message.trim() === "") {
      throw new ProtocolError("invalid-event", "error.message must be a non-empty string");
    }
    return { type: "error", message: cut(e.message.trim()) };
  }
  throw new ProtocolError("invalid-event", `unknown event type: ${JSON.stringify(e.type)?.slice(0, 40)}`);
}

export class JsonLinesReader {
  private partial: Buffer[] = [];
  private partialBytes = 0;
  private total = 0;

  private readonly limits: JsonLinesLimits;

  constructor(limits: JsonLinesLimits = DEFAULT_JSONL_LIMITS) {
    this.limits = limits;
  }

  /** Feeds a chunk; returns the complete events in it. Throws ProtocolError on the first violation. */
  push(chunk: Buffer): ProtocolEvent[] {
    this.total += chunk.length;
    if (this.total > this.limits.maxTotalBytes) {
      throw new ProtocolError("output-too-large", `stdout exceeded ${this.limits.maxTotalBytes} bytes`);
    }
    const events: ProtocolEvent[] = [];
    let start = 0;
    for (let nl = chunk.indexOf(10, start); nl !== -1; nl = chunk.indexOf(10, start)) {
      const piece = chunk.subarray(start, nl);
      this.checkLength(this.partialBytes + piece.length);
      const line = decode(Buffer.concat([...this.partial, piece])).replace(/\r$/, "");
      this.partial = [];
      this.partialBytes = 0;
      if (line.trim() !== "") events.push(parseEvent(line));
      start = nl + 1;
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      this.checkLength(this.partialBytes + rest.length);
      this.partial.push(Buffer.from(rest));
      this.partialBytes += rest.length;
    }
    return events;
  }

  /** At end of stream: a last line without a newline still counts. */
  end(): ProtocolEvent[] {
    if (this.partialBytes === 0) return [];
    const line = decode(Buffer.concat(this.partial));
    this.partial = [];
    this.partialBytes = 0;
    return line.trim() === "" ? [] : [parseEvent(line)];
  }

  private checkLength(n: number): void {
    if (n > this.limits.maxLineBytes) {
      throw new ProtocolError("line-too-long", `a stdout line exceeded ${this.limits.maxLineBytes} bytes`);
    }
  }
}
