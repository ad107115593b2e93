// Small shared pieces: status badges, progress bars, pagers, errors.
import { STATUS_LABEL, shownName } from "./format.js";
import { html } from "./lib.js";

export function Status({ status }) {
  return html`<span class=${`badge s-${status}`}>${STATUS_LABEL[status] ?? status}</span>`;
}

/** A task's bar: succeeded, failed, timed out and cancelled in their own colours, out of the total. */
export function TaskBar({ task }) {
  const total = Math.max(task.totalCount, 1);
  const parts = [
    ["ok", task.succeededCount],
    ["failed", task.failedCount],
    ["timed_out", task.timedOutCount],
    ["cancelled", task.cancelledCount],
  ];
  const done = parts.reduce((a, [, n]) => a + n, 0);
  const label = `${done} of ${task.totalCount} runs done: ${task.succeededCount} succeeded, ${task.failedCount} failed, ${task.timedOutCount} timed out, ${task.cancelledCount} cancelled`;
  return html`<div class="bar" role="progressbar" aria-label=${label} aria-valuemin="0"
      aria-valuemax=${task.totalCount} aria-valuenow=${done} title=${label}>
    ${parts.map(([kind, n]) => (n > 0 ? html`<span class=${`seg seg-${kind}`} style=${{ width: `${(100 * n) / total}%` }}></span>` : null))}
  </div>`;
}

/** A run's own bar: its progress percent. */
export function RunBar({ percent, status, label }) {
  const p = Math.max(0, Math.min(100, Number(percent) || 0));
  const kind =
    status === "succeeded"
      ? "ok"
      : status === "failed" || status === "timed_out"
        ? "failed"
        : status === "cancelled"
          ? "cancelled"
          : "live";
  return html`<div class="bar small" role="progressbar" aria-label=${label ?? "progress"} aria-valuemin="0"
      aria-valuemax="100" aria-valuenow=${p}>
    <span class=${`seg seg-${kind}`} style=${{ width: `${p}%` }}></span>
  </div>`;
}

export function ErrorNote({ error, id }) {
  if (!error) return null;
  return html`<p class="error" role="alert" id=${id}>${error.code ? html`<code>${error.code}</code> ` : null}${shownName(error.message ?? String(error))}</p>`;
}

/** Cursor paging: the API gives a next cursor; earlier cursors are kept to go back. */
export function Pager({ cursors, next, onPage, labels = ["Newer", "Older"] }) {
  return html`<nav class="pager" aria-label="Pages">
    <button type="button" disabled=${cursors.length === 0} onClick=${() => onPage(cursors.slice(0, -1), cursors.at(-2) ?? null)}>${labels[0]}</button>
    <button type="button" disabled=${!next} onClick=${() => onPage([...cursors, next], next)}>${labels[1]}</button>
  </nav>`;
}

/** Where a queued task stands: the API's estimate of the runs ahead of it, labelled as one. */
export function QueuePlace({ queue }) {
  if (!queue) return null;
  const why = [
    queue.higherPriority > 0 ? `${queue.higherPriority} of a higher priority` : null,
    queue.usersWaiting > 0
      ? `${queue.usersWaiting} other user${queue.usersWaiting === 1 ? "" : "s"} served in turn`
      : null,
  ].filter(Boolean);
  const title = `An estimate${why.length > 0 ? `: ${why.join("; ")}` : ""}. What arrives or finishes meanwhile changes it.`;
  return html`<span class="queue-place" title=${title}>≈ ${queue.runsAhead} run${queue.runsAhead === 1 ? "" : "s"} ahead (estimate)</span>`;
}
