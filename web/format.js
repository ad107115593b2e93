// Formatting helpers: sizes, dates, durations, statuses.
export function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
}

export function duration(fromIso, toIso) {
  if (!fromIso) return "";
  const ms = (toIso ? new Date(toIso) : new Date()) - new Date(fromIso);
  if (ms < 0) return "";
  if (ms < 1000) return `${ms} ms`;
  const s = Math.round(ms / 100) / 10;
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
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
