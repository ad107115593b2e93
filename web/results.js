// The fan-in result: one row per input file with its status, error and metrics (the API's
// results.csv, the same table as results.csv at the root of the task's zip), sortable, downloadable,
// and a chart of the column it is sorted by when that column is numeric. Read again while a run in it
// is still going, when the task's event stream says a run's status changed (`changes` grows): at most
// one read at a time, each at least POLL_MS — or four times as long as the last read took, when
// longer — after the one before, while the tab is visible. Without news, every BACKSTOP_MS
// while the stream is live (an event missed), every POLL_MS as above while it is not (`live`).
import { apiBlob, POLL_MS, saveVia } from "./api.js";
import { parseCsv } from "./csv.js";
import { isTerminal } from "./events.js";
import { shownName } from "./format.js";
import { html, useEffect, useMemo, useRef, useState } from "./lib.js";
import { ErrorNote } from "./widgets.js";

const SHOWN = 200;
/** How often a table whose runs are going is read without news while the event stream is live. */
const BACKSTOP_MS = 30_000;

const numeric = (v) => v !== "" && Number.isFinite(Number(v));

/**
 * A cell as it was before the API guarded it against spreadsheets (`'` before a text that starts with
 * `=`, `+`, `-`, `@`, a tab or CR: src/tasks/results.ts): the table shows `-data.csv`, not
 * `'-data.csv`. The download keeps the guard. (A text that itself starts with `'=` and the like reads
 * without its quote here: the file cannot tell the two apart.)
 */
export const unguarded = (cell) => (/^'[=+\-@\t\r]/.test(cell) ? cell.slice(1) : cell);

/**
 * A bar per row of the first SHOWN (in the table's order) with a value in `column`: a run that failed,
 * or did not measure it, has an empty cell, which is no bar (Number("") is 0: a failed run was charted
 * as a value of 0).
 */
function Chart({ rows, column, label }) {
  const first = rows.slice(0, SHOWN);
  const values = first
    .filter((r) => numeric(r[column]))
    .map((r) => ({ name: shownName(r[1]), v: Number(r[column]) }));
  const without = first.length - values.length;
  const max = Math.max(...values.map((x) => Math.abs(x.v)), 1e-300);
  const w = 600;
  const barH = 14;
  return html`<figure class="chart">
    <svg viewBox=${`0 0 ${w} ${values.length * barH + 4}`} role="img" aria-label=${`${label} per input file`}>
      ${values.map(
        (x, i) => html`<g>
          <title>${x.name}: ${x.v}</title>
          <rect x="180" y=${i * barH + 2} width=${Math.max(1, (Math.abs(x.v) / max) * (w - 260))} height=${barH - 3}
            class=${x.v < 0 ? "neg" : "pos"} />
          <text x="176" y=${i * barH + barH - 3} text-anchor="end">${x.name.length > 28 ? `${x.name.slice(0, 27)}…` : x.name}</text>
          <text x=${184 + (Math.abs(x.v) / max) * (w - 260)} y=${i * barH + barH - 3}>${x.v}</text>
        </g>`,
      )}
    </svg>
    <figcaption>${label}${rows.length > SHOWN ? ` (first ${SHOWN} rows in this order)` : ""}${
      without > 0 ? `; ${without} without a value (failed, or not measured) not charted` : ""
    }</figcaption>
  </figure>`;
}

export function ResultsTable({ taskId, version, changes = 0, live = false }) {
  const [table, setTable] = useState(null);
  const [error, setError] = useState(null);
  const [sort, setSort] = useState({ column: 0, dir: 1 });
  // The reads' schedule (below), told of news and of the stream's state by the effects after it.
  const reads = useRef(null);
  const liveRef = useRef(live);
  liveRef.current = live;
  useEffect(() => {
    const ctrl = new AbortController();
    let timer = null;
    // Whether the last table read had a run still going (none read yet: so taken); whether a read is
    // on its way; whether news came since the last read was sent; the reads failed in a row since one
    // succeeded; when the last read ended, and the earliest the next may start (a refusal: never).
    let going = true;
    let reading = false;
    let news = false;
    let failed = 0;
    let ended = 0;
    let earliest = 0;
    // The one timer for the next read, set again whenever what it depends on changes. In a hidden tab
    // it waits, looking every POLL_MS, and the read comes when the tab is shown.
    const plan = () => {
      clearTimeout(timer);
      timer = null;
      if (!going || reading || earliest === Infinity) return;
      // After a failure the retry's time; after news the earliest allowed; without news a slow
      // backstop while the stream is live (its events tell of every change), else the old poll.
      const at = failed > 0 || news || !liveRef.current ? earliest : Math.max(earliest, ended + BACKSTOP_MS);
      timer = setTimeout(due, Math.max(0, at - performance.now()));
    };
    const due = () => {
      if (document.visibilityState === "visible") read();
      else timer = setTimeout(due, POLL_MS);
    };
    const read = () => {
      clearTimeout(timer);
      timer = null;
      reading = true;
      news = false;
      const started = performance.now();
      apiBlob(`/analysis-tasks/${taskId}/results.csv`, { signal: ctrl.signal })
        .then((b) => b.text())
        .then(
          (text) => {
            const [head = [], ...rows] = parseCsv(text).map((row) => row.map(unguarded));
            setTable([head, ...rows]);
            setError(null);
            failed = 0;
            const status = head.indexOf("status");
            going = status >= 0 && rows.some((r) => !isTerminal(r[status]));
            ended = performance.now();
            earliest = ended + Math.max(POLL_MS, 4 * (ended - started));
          },
          (err) => {
            if (ctrl.signal.aborted) return;
            setError(err);
            ended = performance.now();
            // Not what the API refused (a 404: the task is gone), but a read that did not reach it,
            // is tried again while the task is going: after 2 s, doubling to 16 s.
            earliest =
              err.status >= 400 && err.status < 500 ? Infinity : ended + POLL_MS * 2 ** Math.min(failed++, 3);
          },
        )
        .finally(() => {
          if (ctrl.signal.aborted) return;
          reading = false;
          plan();
        });
    };
    reads.current = {
      news: () => {
        news = true;
        plan();
      },
      plan,
    };
    read();
    return () => {
      ctrl.abort();
      clearTimeout(timer);
      reads.current = null;
    };
  }, [taskId, version]);
  // News from the stream: a read, coalesced (the first render's value is no news).
  const seen = useRef(changes);
  useEffect(() => {
    if (changes === seen.current) return;
    seen.current = changes;
    reads.current?.news();
  }, [changes]);
  useEffect(() => reads.current?.plan(), [live]);
  const [head = [], ...rows] = table ?? [];
  const sorted = useMemo(() => {
    const c = sort.column;
    const num = rows.every((r) => r[c] === "" || numeric(r[c]));
    return [...rows].sort((a, b) => {
      const x = a[c] ?? "";
      const y = b[c] ?? "";
      // Empty cells (a failed run's metrics) last either way, as a spreadsheet sorts them. (As
      // -Infinity, two of them compared NaN, and the order they came in was the engine's.)
      if (num) {
        if (x === "" || y === "") return (x === "") - (y === "");
        return sort.dir * (Number(x) - Number(y));
      }
      return sort.dir * x.localeCompare(y);
    });
  }, [table, sort]);
  const download = async () => {
    try {
      await saveVia(`/analysis-tasks/${taskId}/results.csv/link`);
      // As on the task page: a download that works ends the note of one that failed.
      setError(null);
    } catch (err) {
      setError(err);
    }
  };
  if (table === null)
    return error ? html`<${ErrorNote} error=${error} />` : html`<p class="muted">Loading results…</p>`;
  const chartable =
    sort.column > 8 &&
    rows.some((r) => numeric(r[sort.column])) &&
    rows.every((r) => r[sort.column] === "" || numeric(r[sort.column]));
  return html`<div>
    <${ErrorNote} error=${error} />
    <div class="row">
      <p class="muted">${rows.length} input file${rows.length === 1 ? "" : "s"}. Choose a column's heading to sort by it (again to reverse)${head.length > 9 ? "; a metric column is also charted" : ""}.</p>
      <button type="button" onClick=${download}>Download results.csv</button>
    </div>
    ${chartable ? html`<${Chart} rows=${sorted} column=${sort.column} label=${shownName(head[sort.column])} />` : null}
    <div class="scroll"><table class="results">
      <thead><tr>${head.map(
        (
          h,
          i,
        ) => html`<th scope="col" aria-sort=${sort.column === i ? (sort.dir > 0 ? "ascending" : "descending") : "none"}>
          <button type="button" class="link" onClick=${() => setSort({ column: i, dir: sort.column === i ? -sort.dir : 1 })}>
            <span class="name">${shownName(h)}</span>${sort.column === i ? html`<span aria-hidden="true">${sort.dir > 0 ? " ▲" : " ▼"}</span>` : ""}</button></th>`,
      )}</tr></thead>
      <tbody>${sorted.slice(0, SHOWN).map((r) => html`<tr>${r.map((c) => html`<td>${shownName(c)}</td>`)}</tr>`)}</tbody>
    </table></div>
    ${rows.length > SHOWN ? html`<p class="muted">Showing ${SHOWN} of ${rows.length} rows; the download has them all.</p>` : null}
  </div>`;
}
