// A task: its bar and counts, one row per run (paged: a task may have 100,000), the event log, cancel,
// downloads, each run's outputs, and the fan-in result. Live from the task's event stream: events are
// applied in batches once per animation frame — or after FLUSH_MS when no frame comes (a hidden tab),
// or at once when PENDING_MAX are waiting — and the task and the visible runs are re-read (at most
// twice a second) when a run or the task changes state. A queued task has no events while it waits:
// it is re-read every POLL_MS for its place in the queue. Only the latest read's answer is shown.
import { api, POLL_MS, rereadDelayMs, saveVia } from "./api.js";
import { followTask, isTerminal } from "./events.js";
import { describeEvent, RUN_STATUSES, STATUS_LABEL, shownName, when } from "./format.js";
import { Fragment, html, useEffect, useRef, useState } from "./lib.js";
import { RunOutputs } from "./outputs.js";
import { ResultsTable } from "./results.js";
import {
  Elapsed,
  ErrorNote,
  focusIfLost,
  Pager,
  QueuePlace,
  RunBar,
  Status,
  TaskBar,
  useRowFocus,
} from "./widgets.js";

const RUNS_PAGE = 100;
const LOG_KEPT = 1000;
const REREAD_MS = 500;
/** Events wait at most this long for an animation frame (none come in a hidden tab)… */
const FLUSH_MS = 250;
/** …and no more than this many wait at all. */
const PENDING_MAX = LOG_KEPT;

/** The task page's tabs: id, label. */
const TABS = [
  ["runs", "Runs"],
  ["results", "Results"],
  ["log", "Event log"],
];

const STREAM_LABEL = {
  connecting: "connecting…",
  live: "live",
  reconnecting: "reconnecting…",
  ended: "finished",
  gone: "unavailable",
};

/**
 * Whether event `e` changes a row of the task's results table: any change of a run's status (it
 * started running, ended, was put back in the queue for a retry, is being cancelled) — every run event
 * but progress —, or a cancel that ended the queued runs (one task event).
 */
const changesResults = (e) => (e.runId && e.type !== "run.progress") || e.data?.cancelledQueued > 0;

export function TaskView({ taskId }) {
  const [task, setTask] = useState(null);
  const [runs, setRuns] = useState(null);
  const [paging, setPaging] = useState({ cursors: [], cursor: null });
  const [runFilter, setRunFilter] = useState("");
  // runId → fields from events, and `at`: the flush that applied them. A runs read drops those applied
  // before it was sent (its answer holds them); later ones stay, as its answer may predate them.
  const [live, setLive] = useState({});
  const flushes = useRef(0);
  const [log, setLog] = useState([]);
  const [stream, setStream] = useState("connecting");
  const [tab, setTab] = useState("runs");
  const [expanded, setExpanded] = useState(null);
  const [error, setError] = useState(null);
  const [loadProblem, setLoadProblem] = useState(null);
  const [notice, setNotice] = useState(null);
  const noticeRef = useRef(null);
  // Said to a screen reader (a live region) when the task ends while it is shown: its status and
  // counts, once — not every run's progress.
  const [ending, setEnding] = useState("");
  const statusShown = useRef(null);
  const [busy, setBusy] = useState(false);
  const [resultsVersion, setResultsVersion] = useState(0);
  // Changes of runs' status (started, ended, put back for a retry), as the stream told: the Results
  // tab reads its table again after them (results.js), instead of on a timer.
  const [resultsChanges, setResultsChanges] = useState(0);
  const taskRef = useRef(null);
  const reread = useRef({ timer: null, due: 0, task: false, runs: false });
  // Reads of the task and of its runs failed in a row, each (retryFailed's backoff).
  const failedReads = useRef({ task: 0, runs: 0 });
  const pending = useRef([]);
  const frame = useRef(0);
  const flushTimer = useRef(null);
  // The runs page asked for, and the cursors that reach it (kept with the answer, for the pager).
  const pageQuery = useRef({ query: "", cursors: [] });
  // Each read's number: an answer that is not the latest read's (a slow one, overtaken by a re-read
  // or by another page or filter chosen since) is dropped. The runs read before is aborted too.
  const taskReads = useRef(0);
  const runsRead = useRef({ seq: 0, ctrl: null });

  const loadTask = () => {
    const seq = ++taskReads.current;
    return api(`/analysis-tasks/${taskId}`).then(
      (t) => {
        if (seq !== taskReads.current) return t;
        taskRef.current = t;
        failedReads.current.task = 0;
        setTask(t);
        setLoadProblem(null);
        return t;
      },
      (err) => {
        if (seq !== taskReads.current) return null;
        // A task that is gone is the page's answer; a failed read (the API restarting) lasts until
        // the next read succeeds, which is tried again (see retryFailed).
        if (err.status === 404) setError(err);
        else {
          setLoadProblem(err);
          retryFailed("task");
        }
        return null;
      },
    );
  };
  const loadRuns = () => {
    const r = runsRead.current;
    r.ctrl?.abort();
    const ctrl = new AbortController();
    const seq = ++r.seq;
    r.ctrl = ctrl;
    const { query, cursors } = pageQuery.current;
    const sent = flushes.current;
    return api(`/analysis-tasks/${taskId}/runs?${query}`, { signal: ctrl.signal }).then(
      (p) => {
        if (seq !== r.seq) return;
        r.ctrl = null;
        // The pager goes on from the page shown, not from one whose read failed (see files.js).
        failedReads.current.runs = 0;
        setRuns({ ...p, cursors });
        // Until 2026-12-06 every event's fields were dropped here: a run that started while the read
        // was on its way showed "queued", its bar moving, until it ended.
        setLive((old) => Object.fromEntries(Object.entries(old).filter(([, fields]) => fields.at > sent)));
      },
      (err) => {
        if (seq !== r.seq) return;
        r.ctrl = null;
        if (err.status === 404) setError(err);
        else {
          setLoadProblem(err);
          retryFailed("runs");
        }
      },
    );
  };

  function scheduleReread(which, delayMs = REREAD_MS) {
    const r = reread.current;
    r[which] = true;
    const due = performance.now() + delayMs;
    // A pending read comes no later than asked: one asked for now (an event, the stream back) does
    // not wait out a failed read's backoff.
    if (r.timer) {
      if (r.due <= due) return;
      clearTimeout(r.timer);
    }
    r.due = due;
    r.timer = setTimeout(() => {
      r.timer = null;
      if (r.task) loadTask();
      if (r.runs) loadRuns();
      r.task = r.runs = false;
    }, delayMs);
  }
  // A read that failed (not a 404: the API restarting, the network) is tried again, later each time
  // it fails again (1 s doubling to 15 s). Before, the page waited for an event to re-read, which a
  // quiet task never sends: a first read that failed left it on "Loading task…" for good.
  function retryFailed(which) {
    scheduleReread(which, rereadDelayMs(failedReads.current[which]++));
  }

  function scheduleFlush() {
    if (pending.current.length >= PENDING_MAX) return flush();
    if (!frame.current) frame.current = requestAnimationFrame(flush);
    if (!flushTimer.current) flushTimer.current = setTimeout(flush, FLUSH_MS);
  }

  function flush() {
    cancelAnimationFrame(frame.current);
    frame.current = 0;
    clearTimeout(flushTimer.current);
    flushTimer.current = null;
    const batch = pending.current;
    pending.current = [];
    if (batch.length === 0) return;
    const at = ++flushes.current;
    setLog((old) => {
      const next = old.concat(batch);
      return next.length > LOG_KEPT ? next.slice(next.length - LOG_KEPT) : next;
    });
    setLive((old) => {
      const next = { ...old };
      for (const e of batch) {
        if (!e.runId) {
          // A cancel ends the queued runs in one task event. Runs whose latest event left them queued
          // (a retry) show it at once; the others change with the runs re-read below, which also
          // clears these.
          if (e.data?.cancelledQueued > 0)
            for (const [id, cur] of Object.entries(next))
              if (cur.status === "queued")
                next[id] = {
                  ...cur,
                  status: "cancelled",
                  errorCode: "ANALYSIS_PROCESS_CANCELLED",
                  finishedAt: e.createdAt,
                  at,
                };
          continue;
        }
        const cur = { ...(next[e.runId] ?? {}) };
        const d = e.data ?? {};
        if (e.type === "run.progress") {
          if (d.percent !== undefined) cur.progressPercent = d.percent;
          if (d.message !== undefined) cur.message = d.message;
        } else if (e.type === "run.retry") {
          cur.status = "queued";
        } else if (d.status) {
          cur.status = d.status;
          if (d.status === "running") cur.startedAt ??= e.createdAt;
          if (isTerminal(d.status)) cur.finishedAt = e.createdAt;
        }
        if (d.attempt !== undefined) cur.attempt = d.attempt;
        if (d.errorCode !== undefined) cur.errorCode = d.errorCode;
        cur.at = at;
        next[e.runId] = cur;
      }
      return next;
    });
    if (batch.some((e) => e.type !== "run.progress")) {
      scheduleReread("task");
      if (batch.some((e) => (e.runId && isTerminal(e.data?.status)) || e.data?.cancelledQueued > 0))
        scheduleReread("runs");
    }
    if (batch.some((e) => !e.runId && isTerminal(e.data?.status))) setResultsVersion((v) => v + 1);
    else if (batch.some(changesResults)) setResultsChanges((n) => n + 1);
  }

  useEffect(() => {
    const ctrl = new AbortController();
    let reconnecting = false;
    failedReads.current = { task: 0, runs: 0 };
    setTask(null);
    setLog([]);
    loadTask();
    followTask(taskId, {
      signal: ctrl.signal,
      onState: (state) => {
        setStream(state);
        // Back after a reconnect (the API restarted, say): what the page shows is read again, which
        // also clears the error a read made while it was away left shown.
        if (state === "reconnecting") reconnecting = true;
        else if (state === "live" && reconnecting) {
          reconnecting = false;
          scheduleReread("task");
          scheduleReread("runs");
        }
      },
      onEvents: (events) => {
        if (ctrl.signal.aborted) return;
        for (const e of events) pending.current.push(e);
        scheduleFlush();
      },
      // The server does not know the event resumed from (the database was restored from an older
      // backup): the log shown is dropped, the whole log follows, and the task and runs are read again.
      onReset: () => {
        if (ctrl.signal.aborted) return;
        pending.current = [];
        setLog([]);
        setLive({});
        scheduleReread("task");
        scheduleReread("runs");
      },
      // Asked when a stream ends without the task's closing event. Only an answer ends following: the
      // task is finished, or it is gone (404). A request that fails (the API restarting) is no answer,
      // and the stream reconnects.
      isFinished: async () => {
        const seq = ++taskReads.current;
        try {
          const t = await api(`/analysis-tasks/${taskId}`);
          if (seq === taskReads.current) {
            taskRef.current = t;
            setTask(t);
          }
          return isTerminal(t.status);
        } catch (err) {
          if (err.status !== 404) return false;
          setError(err);
          return true;
        }
      },
    });
    return () => {
      ctrl.abort();
      cancelAnimationFrame(frame.current);
      frame.current = 0;
      clearTimeout(flushTimer.current);
      flushTimer.current = null;
      clearTimeout(reread.current.timer);
      reread.current.timer = null;
      // Whatever is still on its way is no longer shown.
      taskReads.current++;
      runsRead.current.seq++;
      runsRead.current.ctrl?.abort();
      // Events not applied yet are dropped with the view. The ref itself outlives it: htm keeps a
      // template's static parts as first made, module-wide, and a Preact vnode keeps the parent it was
      // first shown in, so one past render of this view — its handlers and the refs they use — stays
      // reachable for as long as the page is open.
      pending.current = [];
    };
  }, [taskId]);

  // A queued task sends no event while others' runs go before it: re-read for its place in the queue
  // while it waits and the tab is visible (the first event or read that finds it started ends this).
  const queued = task?.status === "queued";
  useEffect(() => {
    if (!queued) return;
    const timer = setInterval(() => document.visibilityState === "visible" && loadTask(), POLL_MS);
    return () => clearInterval(timer);
  }, [taskId, queued]);

  useEffect(() => {
    const q = new URLSearchParams({ limit: String(RUNS_PAGE) });
    if (paging.cursor) q.set("cursor", paging.cursor);
    if (runFilter) q.set("status", runFilter);
    pageQuery.current = { query: q.toString(), cursors: paging.cursors };
    loadRuns();
  }, [taskId, paging, runFilter]);

  // "Cancel task" goes when the task ends. When it had the keyboard's focus (its end came while the
  // user was on it, not by their cancel, whose note takes the focus), the focus goes on to "Download
  // all", or to the heading when there is nothing to download; it fell to <body> (until 2026-12-06).
  // Whether it had the focus is read as the page is drawn, before the button is taken away.
  const cancelButton = useRef(null);
  const downloadButton = useRef(null);
  const cancelFocused = useRef(false);
  cancelFocused.current = cancelButton.current !== null && document.activeElement === cancelButton.current;
  useEffect(() => {
    const status = task?.status;
    if (!status) return;
    const before = statusShown.current;
    statusShown.current = status;
    if (before && !isTerminal(before) && isTerminal(status) && cancelFocused.current && !busy) {
      const download = downloadButton.current;
      const heading = document.querySelector("#app h1");
      if (download && !download.disabled) focusIfLost(download);
      else if (heading) {
        heading.tabIndex = -1;
        focusIfLost(heading);
      }
    }
    if (before && !isTerminal(before) && isTerminal(status))
      setEnding(
        `Task #${task.taskId} ${STATUS_LABEL[status] ?? status}: ${task.succeededCount} of ${task.totalCount} runs succeeded` +
          `${task.failedCount + task.timedOutCount > 0 ? `, ${task.failedCount + task.timedOutCount} failed` : ""}` +
          `${task.cancelledCount > 0 ? `, ${task.cancelledCount} cancelled` : ""}.`,
      );
  }, [task?.status]);

  const filterRuns = (e) => {
    setRunFilter(e.currentTarget.value);
    setPaging({ cursors: [], cursor: null });
  };

  // While a request is on its way its button is not disabled, only inert (`busy`): a disabled button
  // loses the keyboard's focus to <body> (until 2026-12-06 a keyboard user who downloaded had to Tab
  // from the top of the page again).
  async function cancel() {
    if (busy) return;
    setBusy(true);
    try {
      const after = await api(`/analysis-tasks/${taskId}/cancel`, { method: "POST" });
      const t = (await loadTask()) ?? after;
      setNotice(`Cancel requested: the task is ${STATUS_LABEL[t.status] ?? t.status}.`);
      // The note of an action that failed before goes with the next that succeeds (it stayed until
      // the page was left, until 2026-12-06).
      setError(null);
      // The button is disabled (cancelling) or gone (cancelled) now: the focus goes to the note that
      // says what happened, not to <body>.
      setTimeout(() => focusIfLost(noticeRef.current));
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  }
  // Downloads go through a download link, which the browser saves itself, streamed to disk, under the
  // name the API gives: a one-file task's output itself, else task-<id>.zip; a run's output under its
  // own name (summary.json), not the input's.
  async function downloadAll() {
    if (busy) return;
    setBusy(true);
    try {
      await saveVia(`/analysis-tasks/${taskId}/download/link`);
      setError(null);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  }
  async function downloadRun(run) {
    try {
      await saveVia(`/analysis-tasks/${taskId}/runs/${run.runId}/download/link`);
      setError(null);
    } catch (err) {
      setError(err);
    }
  }

  // The tabs as a tab list: one stop for Tab, the arrow keys (and Home, End) move between them (until
  // 2026-12-06 each tab was a stop of its own and the arrows did nothing).
  const tabKey = (e) => {
    const at = TABS.findIndex(([id]) => id === tab);
    const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: TABS.length - 1 }[e.key];
    if (to === undefined) return;
    e.preventDefault();
    const [id] = TABS[(to + TABS.length) % TABS.length];
    setTab(id);
    document.getElementById(`tab-${id}`)?.focus();
  };

  // A run's row that a re-read takes away (a status filter, and the run's status changed) while the
  // keyboard is on it: the focus goes to the next row, or to the "Runs" tab, which names the list.
  useRowFocus("data-run", () => document.getElementById("tab-runs"));

  if (error?.status === 404)
    return html`<section><h1>Task not found</h1><p>There is no task #${taskId} you can see. <a href="#/">All tasks</a></p></section>`;
  if (task === null)
    return html`<section><${ErrorNote} error=${error ?? loadProblem} /><p class="muted">Loading task…</p></section>`;
  const done = task.succeededCount + task.failedCount + task.timedOutCount + task.cancelledCount;
  const finished = isTerminal(task.status);
  // Why a button is disabled, said next to it and tied to it (aria-describedby): until 2026-12-06
  // "Download all" said it only in a tooltip (its title, which the keyboard, a touch screen and most
  // screen readers never show), and not at all when no run had succeeded.
  const cancelWhy = task.status === "cancelling" ? "The task is being cancelled." : null;
  const downloadWhy = !finished
    ? "Available when the task has finished."
    : task.succeededCount === 0
      ? "No run succeeded: there is nothing to download."
      : null;
  return html`<section class="task">
    <header class="row">
      <h1>Task #${task.taskId} <small>${task.analysisType}</small></h1>
      <${Status} status=${task.status} />
      <span class=${`stream ${stream}`} aria-live="polite">${STREAM_LABEL[stream]}</span>
      <span class="visually-hidden" role="status">${ending}</span>
    </header>
    <${TaskBar} task=${task} />
    <dl class="counts">
      <div><dt>Runs</dt><dd>${done}/${task.totalCount}</dd></div>
      <div><dt>Succeeded</dt><dd class="ok">${task.succeededCount}</dd></div>
      <div><dt>Failed</dt><dd class="bad">${task.failedCount}</dd></div>
      <div><dt>Timed out</dt><dd class="warn">${task.timedOutCount}</dd></div>
      <div><dt>Cancelled</dt><dd>${task.cancelledCount}</dd></div>
      <div><dt>Created</dt><dd>${when(task.createdAt)}</dd></div>
      <div><dt>Duration</dt><dd><${Elapsed} from=${task.startedAt} to=${task.finishedAt} /></dd></div>
      ${task.owner ? html`<div><dt>Owner</dt><dd><span class="name">${shownName(task.owner)}</span></dd></div>` : null}
      ${task.priority !== 5 ? html`<div><dt>Priority</dt><dd>${task.priority}</dd></div>` : null}
      ${task.queue ? html`<div><dt>Queue</dt><dd><${QueuePlace} queue=${task.queue} /></dd></div>` : null}
    </dl>
    ${
      Object.keys(task.parameters ?? {}).length > 0
        ? html`<p class="muted">Parameters: <code class="name">${shownName(JSON.stringify(task.parameters))}</code></p>`
        : null
    }
    <div class="row actions">
      ${
        finished
          ? null
          : html`<button type="button" class="danger" disabled=${cancelWhy !== null} aria-disabled=${busy || undefined}
              aria-describedby=${cancelWhy ? "cancel-why" : undefined} onClick=${cancel} ref=${cancelButton}>Cancel task</button>
            ${cancelWhy ? html`<small class="why" id="cancel-why">${cancelWhy}</small>` : null}`
      }
      <button type="button" disabled=${downloadWhy !== null} aria-disabled=${busy || undefined} onClick=${downloadAll} ref=${downloadButton}
        aria-describedby=${downloadWhy ? "download-all-why" : undefined}>Download all${task.totalCount > 1 ? " (zip)" : ""}</button>
      ${downloadWhy ? html`<small class="why" id="download-all-why">${downloadWhy}</small>` : null}
    </div>
    ${notice ? html`<p class="notice" role="status" tabindex="-1" ref=${noticeRef}>${notice}</p>` : null}
    <${ErrorNote} error=${error ?? loadProblem} />

    <div class="tabs" role="tablist" aria-label="Task views" onKeyDown=${tabKey}>
      ${TABS.map(
        ([id, label]) => html`<button type="button" role="tab" id=${`tab-${id}`} aria-selected=${tab === id}
          tabindex=${tab === id ? 0 : -1} aria-controls=${tab === id ? `panel-${id}` : undefined}
          onClick=${() => setTab(id)}>${label}</button>`,
      )}
    </div>

    ${
      tab === "runs"
        ? html`<div role="tabpanel" id="panel-runs" aria-labelledby="tab-runs">
          <form class="filters" onSubmit=${(e) => e.preventDefault()}>
            <label>Run status
              <select value=${runFilter} onChange=${filterRuns}>
                <option value="">any</option>
                ${RUN_STATUSES.map((s) => html`<option value=${s}>${STATUS_LABEL[s]}</option>`)}
              </select>
            </label>
          </form>
          ${
            runs === null
              ? html`<p class="muted">Loading runs…</p>`
              : html`<div class="scroll"><table class="runs">
                <thead><tr>
                  <th scope="col">Input file</th><th scope="col">Status</th><th scope="col" class="wide">Progress</th>
                  <th scope="col">Attempt</th><th scope="col">Error</th><th scope="col">Duration</th><th scope="col"><span class="visually-hidden">Actions</span></th>
                </tr></thead>
                <tbody>
                  ${runs.items.map((base) => {
                    const r = { ...base, ...(live[base.runId] ?? {}) };
                    const open = expanded === r.runId;
                    // Keyed as one (the row and its detail row): unkeyed, the rows after one that
                    // went were drawn anew, and the keyboard's focus on them was lost.
                    return html`<${Fragment} key=${r.runId}><tr data-run=${r.runId} class=${`s-${r.status}`}>
                        <td class="name">${shownName(r.fileName)}</td>
                        <td><${Status} status=${r.status} /></td>
                        <td class="wide"><${RunBar} percent=${r.status === "succeeded" ? 100 : r.progressPercent} status=${r.status}
                            label=${`progress of ${shownName(r.fileName)}`} />
                          <span class="message">${shownName(r.message)}</span></td>
                        <td class="num">${r.attempt}</td>
                        <td>${r.errorCode ? html`<code>${r.errorCode}</code>` : null}${r.errorMessage ? html`<div class="bad">${shownName(r.errorMessage)}</div>` : null}</td>
                        <td><${Elapsed} from=${r.startedAt} to=${r.finishedAt} /></td>
                        <td class="actions">
                          <button type="button" class="link" aria-expanded=${open} onClick=${() => setExpanded(open ? null : r.runId)}
                            aria-label=${`${open ? "hide results" : "results"} of ${shownName(r.fileName)}`}>${open ? "hide" : "results"}</button>
                          ${
                            r.status === "succeeded"
                              ? html`<button type="button" class="link" onClick=${() => downloadRun(r)}
                            aria-label=${`download output of ${shownName(r.fileName)}`}>download</button>`
                              : null
                          }
                        </td>
                      </tr>
                      ${
                        open
                          ? html`<tr class="detail"><td colspan="7">
                            <${RunOutputs} key=${`${r.runId}-${r.status}`} taskId=${taskId} run=${r} /></td></tr>`
                          : null
                      }</${Fragment}>`;
                  })}
                </tbody>
              </table></div>
              <${Pager} cursors=${runs.cursors} next=${runs.nextCursor} labels=${["Previous runs", "Next runs"]}
                onPage=${(cursors, cursor) => setPaging({ cursors, cursor })} />`
          }
        </div>`
        : null
    }
    ${
      tab === "results"
        ? html`<div role="tabpanel" id="panel-results" aria-labelledby="tab-results">
          <${ResultsTable} taskId=${taskId} version=${resultsVersion} changes=${resultsChanges}
            live=${stream === "live"} />
        </div>`
        : null
    }
    ${
      tab === "log"
        ? html`<div role="tabpanel" id="panel-log" aria-labelledby="tab-log">
          ${log.length >= LOG_KEPT ? html`<p class="muted">The latest ${LOG_KEPT} events.</p>` : null}
          <ol class="log" aria-live="off">
            ${log.map(
              (e) => html`<li key=${e.id} data-event=${e.id}>
                <time datetime=${e.createdAt}>${new Date(e.createdAt).toLocaleTimeString()}</time>
                <span class="etype">${e.type}</span>
                ${e.runId ? html`<span class="run">run ${e.runId}</span>` : null}
                <span class="detail">${describeEvent(e)}</span>
              </li>`,
            )}
          </ol>
        </div>`
        : null
    }
  </section>`;
}
