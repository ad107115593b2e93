// Formatting helpers: sizes, dates, durations, statuses.
import { serverNow } from "./clock.js";
import { showUnseen } from "./unseen.js";

export function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n);
  let i = 0;
  // Shown rounded (to a tenth below 10, else whole): a value that rounds to 1024 is one of the next
  // unit (1,048,575 bytes is "1.0 MiB", never "1024 KiB").
  while (Math.round(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  if (i === 0) return `${v} ${units[i]}`;
  const tenths = Math.round(v * 10);
  return `${tenths < 100 ? (tenths / 10).toFixed(1) : Math.round(v)} ${units[i]}`;
}

export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
}

/**
 * From `fromIso` to `toIso` (or now): "850 ms", "12.3 s", "4 min 5 s", "2 h 7 min". Rounded once, to
 * the smallest unit shown, and split after: 119.5 s is "2 min 0 s", never "1 min 60 s".
 */
export function duration(fromIso, toIso) {
  if (!fromIso) return "";
  // A running one's against the server's clock (clock.js), which made its start time.
  const ms = (toIso ? Date.parse(toIso) : serverNow()) - Date.parse(fromIso);
  if (!(ms >= 0)) return "";
  if (ms < 1000) return `${ms} ms`;
  const tenths = Math.round(ms / 100);
  if (tenths < 600) return `${tenths / 10} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  const m = Math.round(ms / 60_000);
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

export const STATUS_LABEL = {
  queued: "queued",
  starting: "starting",
  running: "running",
  cancelling: "cancelling",
  succeeded: "succeeded",
  partially_succeeded: "partially succeeded",
  failed: "failed",
  timed_out: "timed out",
  cancelled: "cancelled",
};

export const TASK_STATUSES = [
  "queued",
  "running",
  "cancelling",
  "succeeded",
  "partially_succeeded",
  "failed",
  "timed_out",
  "cancelled",
];

export const RUN_STATUSES = [
  "queued",
  "starting",
  "running",
  "cancelling",
  "succeeded",
  "failed",
  "timed_out",
  "cancelled",
];

/**
 * A name (an upload's, an output's, a user's, a metric's) or a program's text as shown: what is not
 * seen as itself as its code point (`showUnseen`, web/unseen.js; the CLI shows text by the same rule).
 * Names are also isolated by CSS (`.name`), so that their right-to-left letters cannot reorder the
 * text beside them.
 */
export const shownName = (name) => showUnseen(String(name ?? ""));

/**
 * A text of many lines (an output previewed) as shown: each line as `shownName` shows a name, its line
 * breaks and tabs kept (a CRLF is a line break). A column name in a summary.json with an override in
 * it reversed the rest of its line in the preview until 2026-12-06.
 */
export const shownText = (text) =>
  String(text ?? "")
    .replace(/\r\n/g, "\n")
    .replace(/[^\n\t]+/g, (line) => showUnseen(line));

/** An event of the task's log in a few words (the log's detail column). */
export function describeEvent(e) {
  const d = e.data ?? {};
  if (e.type === "run.progress") return `${d.percent ?? ""}%${d.message ? ` ${shownName(d.message)}` : ""}`;
  // Without an error code the worker gave the run back (a shutdown, a full scratch disk, runs claimed
  // ahead): nothing failed, and the attempt is not counted. With one and `refunded`, the attempt could
  // not use the object store (the only such code; events before 2026-12-07 lack `refunded`): not
  // counted either, and `attempt` is already one fewer ("attempt 0 failed" it read).
  if (e.type === "run.retry") {
    if (!d.errorCode) return "put back by its worker (attempt not counted)";
    if (d.refunded === true || d.errorCode === "ANALYSIS_STORAGE_UNAVAILABLE")
      return `${d.errorCode}; back in the queue (attempt not counted)`;
    return `attempt ${d.attempt ?? ""} failed (${d.errorCode}); retry`;
  }
  const parts = [];
  if (d.cancelledQueued > 0)
    parts.push(`${d.cancelledQueued} queued ${d.cancelledQueued === 1 ? "run" : "runs"} cancelled`);
  if (d.attempt !== undefined) parts.push(`attempt ${d.attempt}`);
  if (d.errorCode) parts.push(d.errorCode);
  return parts.join(" · ");
}
