// Small shared pieces: status badges, progress bars, pagers, errors.
import { duration, STATUS_LABEL, shownName } from "./format.js";
import { html, useEffect, useRef, useState } from "./lib.js";

/**
 * Whether the keyboard's focus is lost: on <body>, on an element no longer in the page, or on the main
 * region itself (where the skip link put it: no control of its own).
 */
export function focusLost() {
  const at = document.activeElement;
  return !at || at === document.body || !at.isConnected || at.id === "main";
}

/**
 * Puts the keyboard's focus on `el` when it was lost (a control it was on removed or disabled by what
 * the user did), not when the user has moved it meanwhile.
 */
export function focusIfLost(el) {
  if (el?.isConnected && focusLost()) el.focus();
}

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

/**
 * The most of one value a list takes from its address: a value longer than any the API takes (a
 * status, a type, a cursor) is still refused by it, with its own error, but a megabyte pasted into the
 * address is not sent on (a request that long is refused before it reaches the API's checks).
 */
const ADDRESS_VALUE_MAX = 200;
/** The most cursors of pages before the one shown an address keeps (for "Newer"). */
const ADDRESS_CURSORS_MAX = 1000;

/** Value `name` of a list's address (`params`, its query), clipped; "" when it has none. */
export const addressValue = (params, name) => (params.get(name) ?? "").slice(0, ADDRESS_VALUE_MAX);

/**
 * A list's page as its address gives it: `cursor`, the page's (none: the first page), and `newer`,
 * the cursors of the pages before it, oldest last, which "Newer" goes back through. `key` is the two
 * as one text, for an effect to depend on.
 */
export function addressPaging(params) {
  const cursor = addressValue(params, "cursor");
  if (!cursor) return { cursors: [], cursor: null, key: "" };
  const newer = params.get("newer") ? params.get("newer").split(",") : [];
  const cursors = [...newer.slice(-ADDRESS_CURSORS_MAX).map((c) => c.slice(0, ADDRESS_VALUE_MAX)), cursor];
  return { cursors, cursor, key: cursors.join(",") };
}

/**
 * The address of the list at `path` with `filters` (those set) on the page the last of `cursors`
 * reaches (none: the first page), as `addressPaging` reads it.
 */
export function listAddress(path, filters, cursors) {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(filters)) if (value) q.set(name, value);
  if (cursors.length > 0) {
    q.set("cursor", cursors.at(-1));
    if (cursors.length > 1) q.set("newer", cursors.slice(0, -1).join(","));
  }
  const query = q.toString();
  return `#${path}${query ? `?${query}` : ""}`;
}

/**
 * Goes to `address` (a new entry in the history, so Back comes back here); when it is the address
 * already shown, which no hashchange follows (a page whose read failed, asked for again), calls
 * `again` instead.
 */
export function goTo(address, again) {
  if (new URL(address, location.href).hash === location.hash) again();
  else location.hash = address;
}

/** Cursor paging: the API gives a next cursor; earlier cursors are kept to go back. */
export function Pager({ cursors, next, onPage, labels = ["Newer", "Older"] }) {
  // The button last pressed: on the last (or first) page it is disabled, which drops the keyboard's
  // focus to <body> (until 2026-12-06); the focus goes to the other one.
  const nav = useRef(null);
  const pressed = useRef(-1);
  useEffect(() => {
    const buttons = nav.current?.querySelectorAll("button");
    if (pressed.current < 0 || !buttons?.[pressed.current]?.disabled) return;
    focusIfLost(buttons[1 - pressed.current]);
  });
  const press = (i, ...page) => {
    pressed.current = i;
    onPage(...page);
  };
  return html`<nav class="pager" aria-label="Pages" ref=${nav}>
    <button type="button" disabled=${cursors.length === 0} onClick=${() => press(0, cursors.slice(0, -1), cursors.at(-2) ?? null)}>${labels[0]}</button>
    <button type="button" disabled=${!next} onClick=${() => press(1, [...cursors, next], next)}>${labels[1]}</button>
  </nav>`;
}

/**
 * Where a queued task stands: the API's estimate of the runs ahead of it, labelled as one, and why
 * (runs of a higher priority, other users served in turn). On the task page (`brief` unset) the why is
 * text seen under the number; in a row of the task list, where there is no room, it is a disclosure the
 * keyboard opens (Enter or Space on the number). Until 2026-12-06 the why was only the number's `title`,
 * a tooltip the keyboard, a touch screen and most screen readers never show.
 */
export function QueuePlace({ queue, brief = false }) {
  if (!queue) return null;
  const { place, reasons } = queue.noWorker ? waitingForWorker(queue) : runsAhead(queue);
  if (brief)
    return html`<details class="queue-place"><summary>${place}</summary><span class="queue-why">${reasons}</span></details>`;
  return html`<span class="queue-place">${place}<span class="queue-why">${reasons}</span></span>`;
}

function runsAhead(queue) {
  const why = [
    queue.higherPriority > 0 ? `${queue.higherPriority} of a higher priority` : null,
    queue.usersWaiting > 0
      ? `${queue.usersWaiting} other user${queue.usersWaiting === 1 ? "" : "s"} served in turn`
      : null,
  ].filter(Boolean);
  return {
    place: `≈ ${queue.runsAhead} run${queue.runsAhead === 1 ? "" : "s"} ahead (estimate)`,
    reasons: `An estimate${why.length > 0 ? `: ${why.join("; ")}` : ""}. What arrives or finishes meanwhile changes it.`,
  };
}

/** No live worker runs the task's type: it is not next whatever the count says. */
const waitingForWorker = (queue) => ({
  place: "waiting for a worker",
  reasons: `No live worker can run this analysis type now (${shownName(queue.noWorker)}); the task fails with ANALYSIS_WORKER_UNAVAILABLE if none comes in time.`,
});

/** What the keyboard reaches in `row` and in its detail row (a run's), in order. */
const controls = (row) => {
  const detail = row.nextElementSibling?.classList.contains("detail") ? [row.nextElementSibling] : [];
  return [row, ...detail].flatMap((r) => [
    ...r.querySelectorAll(
      'a[href], button:not([disabled]), input:not([disabled]), select, summary, [tabindex]:not([tabindex="-1"])',
    ),
  ]);
};

/**
 * Keeps the keyboard's focus in a list whose rows a live re-read may take away (a filter on the task
 * list or the runs, a row whose status changed): rows are the elements with attribute `rowAttr`, its
 * value the row's key. When the element with the focus goes with its row, the focus goes to the same
 * control of the row when it is shown again (drawn anew), else to the first control of the next row
 * that is still there (else the one before it, else the row now at its place), else to `fallback()`
 * (the list's heading). Not when the user has moved the focus meanwhile. Until 2026-12-06 it fell to
 * <body>, and a keyboard user started again from the top of the page.
 */
export function useRowFocus(rowAttr, fallback) {
  const was = useRef(null);
  useEffect(() => {
    // The row an element is in: a run's detail row counts as its run's.
    const rowOf = (el) => {
      const tr = el.closest?.("tr");
      if (tr?.hasAttribute(rowAttr)) return tr;
      const before = tr?.previousElementSibling;
      return tr?.classList.contains("detail") && before?.hasAttribute(rowAttr) ? before : null;
    };
    const onFocusIn = (e) => {
      const row = rowOf(e.target);
      if (!row) {
        was.current = null;
        return;
      }
      const rows = [...document.querySelectorAll(`[${rowAttr}]`)];
      was.current = {
        el: e.target,
        key: row.getAttribute(rowAttr),
        slot: controls(row).indexOf(e.target),
        // Focused by the keyboard (or a script after it): a mouse user's click leaves no ring, and the
        // page is not to be scrolled back to where they clicked when the row goes.
        keyboard: e.target.matches(":focus-visible"),
        at: rows.indexOf(row),
        keys: rows.map((r) => r.getAttribute(rowAttr)),
      };
    };
    // Left for nothing (a click on the page's text, which focuses <body>) while its row stays: the
    // user has left the list. Removed with its row (a blur some browsers fire then): still in it.
    const onFocusOut = (e) => {
      const el = e.target;
      setTimeout(() => {
        if (was.current?.el === el && el.isConnected && focusLost()) was.current = null;
      });
    };
    document.addEventListener("focusin", onFocusIn);
    document.addEventListener("focusout", onFocusOut);
    return () => {
      document.removeEventListener("focusin", onFocusIn);
      document.removeEventListener("focusout", onFocusOut);
    };
  }, [rowAttr]);
  useEffect(() => {
    const r = was.current;
    if (!r) return;
    const rows = [...document.querySelectorAll(`[${rowAttr}]`)];
    if (r.el.isConnected) {
      // The rows as they are now, for the next render that may take the focused one away.
      r.keys = rows.map((row) => row.getAttribute(rowAttr));
      r.at = r.keys.indexOf(r.key);
      return;
    }
    was.current = null;
    if (!focusLost()) return;
    const byKey = new Map(rows.map((row) => [row.getAttribute(rowAttr), row]));
    const i = r.keys.indexOf(r.key);
    const order = [r.key, ...r.keys.slice(i + 1), ...r.keys.slice(0, i).reverse()];
    const key = order.find((k) => byKey.has(k));
    const row = key !== undefined ? byKey.get(key) : rows[Math.min(r.at, rows.length - 1)];
    const there = row ? controls(row) : [];
    const to = (key === r.key ? there[r.slot] : null) ?? there[0] ?? fallback();
    if (!to) return;
    // A heading takes the focus only with a tabindex (as the view's heading does, app.js).
    if (!to.hasAttribute("tabindex") && to.tabIndex < 0) to.tabIndex = -1;
    to.focus({ preventScroll: !r.keyboard });
  });
}

/**
 * One timer per interval for every component that ticks (useTick): a task page's running rows count
 * on together, in one redraw, not each on a timer of its own at its own moment.
 */
const tickers = new Map();

/**
 * Re-renders the component every `ms` while `on`: a running duration counts on between the reads and
 * events that re-render it otherwise (a program that writes no progress for a minute left the task
 * page's "Duration" standing still for that minute, until 2026-12-07).
 */
export function useTick(on, ms = 1000) {
  const [, setTicks] = useState(0);
  useEffect(() => {
    if (!on) return undefined;
    let ticker = tickers.get(ms);
    if (ticker === undefined) {
      const bumps = new Set();
      const timer = setInterval(() => {
        for (const bump of bumps) bump();
      }, ms);
      ticker = { bumps, timer };
      tickers.set(ms, ticker);
    }
    const bump = () => setTicks((n) => n + 1);
    ticker.bumps.add(bump);
    return () => {
      ticker.bumps.delete(bump);
      if (ticker.bumps.size > 0) return;
      clearInterval(ticker.timer);
      tickers.delete(ms);
    };
  }, [on, ms]);
}

/**
 * A duration from `from` to `to` (or now: format.js's duration), counting on every second while it
 * runs (useTick): only this text is drawn again, not the page around it.
 */
export function Elapsed({ from, to }) {
  useTick(Boolean(from && !to));
  return duration(from, to);
}

/**
 * Reads failed in a row, for a retry's backoff (a ref), counted afresh when `key` — the address read —
 * changes: until 2026-12-07 the failures under the filters or page before made a new one's first
 * retry wait up to 15 s. Call it before the read's effect (effects run in order).
 */
export function useFailures(key) {
  const failed = useRef(0);
  useEffect(() => {
    failed.current = 0;
  }, [key]);
  return failed;
}
