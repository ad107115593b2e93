// The task list: newest first, paged, filtered by status and type; refreshed every two seconds
// (POLL_MS) while any task on the page is still going (and the page is visible). Its filters and page
// are in the address (app.js reads them): choosing one goes to a new address, so Back comes back.
import { api, mayPass, POLL_MS, rereadDelayMs } from "./api.js";
import { isTerminal } from "./events.js";
import { duration, STATUS_LABEL, shownName, TASK_STATUSES, when } from "./format.js";
import { html, useEffect, useRef, useState } from "./lib.js";
import {
  ErrorNote,
  goTo,
  listAddress,
  Pager,
  QueuePlace,
  Status,
  TaskBar,
  useFailures,
  useRowFocus,
} from "./widgets.js";

export function TasksView({ me, types, path, filter, paging }) {
  const [page, setPage] = useState(null);
  const [error, setError] = useState(null);
  const [tick, setTick] = useState(0);
  // The filters a page was read with: a page read under other filters is not shown under these.
  const filterKey = `${filter.status}\n${filter.type}`;
  // Reads failed in a row (the retry's backoff), counted afresh under other filters or another page.
  const failed = useFailures(`${filterKey}\n${paging.key}`);

  useEffect(() => {
    const ctrl = new AbortController();
    let retry = null;
    const q = new URLSearchParams({ limit: "20" });
    if (filter.status) q.set("status", filter.status);
    if (filter.type) q.set("analysisType", filter.type);
    if (paging.cursor) q.set("cursor", paging.cursor);
    api(`/analysis-tasks?${q}`, { signal: ctrl.signal }).then(
      (p) => {
        // With the cursors that reached it: the pager goes on from the page shown (see files.js).
        setPage({ ...p, cursors: paging.cursors, filterKey });
        setError(null);
        failed.current = 0;
      },
      (err) => {
        if (ctrl.signal.aborted) return;
        setError(err);
        // A read that did not reach the server, or that it failed (the API restarting), is tried
        // again, 1 s, 2 s, 4 s … 15 s apart: until 2026-12-07 only a reload read the list again when no
        // task on it was running. A request refused (400: a filter or cursor not known) is not.
        if (mayPass(err)) retry = setTimeout(() => setTick((n) => n + 1), rereadDelayMs(failed.current++));
      },
    );
    return () => {
      ctrl.abort();
      clearTimeout(retry);
    };
  }, [filter.status, filter.type, paging.key, tick]);

  // A page of other filters (the read under these failed) is not shown as theirs: until 2026-12-07 a
  // failed read left the rows of the filters before under the ones chosen.
  const shown = page?.filterKey === filterKey ? page : null;
  // Re-read every POLL_MS while a task shown is going; not while a read's error is shown (a 400 would
  // be asked again every 2 s, a 5xx beside the backoff's retry).
  const live = !error && shown?.items.some((t) => !isTerminal(t.status));
  useEffect(() => {
    if (!live) return;
    const timer = setInterval(() => document.visibilityState === "visible" && setTick((n) => n + 1), POLL_MS);
    return () => clearInterval(timer);
  }, [live]);

  // A row that a re-read takes away (a status filter, and its task's status changed) while the keyboard
  // is on it: the focus goes to the next row, or to the heading when none is left.
  const heading = useRef(null);
  useRowFocus("data-task", () => heading.current);

  const admin = me?.role === "admin";
  // The address already shown (a page whose read failed, asked for again) is read again.
  const again = () => setTick((n) => n + 1);
  const change = (key) => (e) =>
    goTo(listAddress(path, { ...filter, [key]: e.currentTarget.value }, []), again);
  return html`<section>
    <header class="row">
      <h1 ref=${heading}>Tasks</h1>
      <a class="button primary" href="#/new">New task</a>
    </header>
    <form class="filters" onSubmit=${(e) => e.preventDefault()}>
      <label>Status
        <select value=${filter.status} onChange=${change("status")}>
          <option value="">any</option>
          ${TASK_STATUSES.map((s) => html`<option value=${s}>${STATUS_LABEL[s]}</option>`)}
          ${unknownOption(filter.status, TASK_STATUSES)}
        </select>
      </label>
      <label>Type
        <select value=${filter.type} onChange=${change("type")}>
          <option value="">any</option>
          ${(types ?? []).map((t) => html`<option value=${t.name}>${t.name}</option>`)}
          ${unknownOption(
            filter.type,
            types?.map((t) => t.name),
          )}
        </select>
      </label>
    </form>
    <${ErrorNote} error=${error} />
    ${
      shown === null
        ? error
          ? null
          : html`<p class="muted">Loading…</p>`
        : shown.items.length === 0
          ? html`<p class="muted">No tasks${filter.status || filter.type ? " match these filters" : " yet"}. <a href="#/new">Start one.</a></p>`
          : html`<div class="scroll"><table class="tasks">
            <thead><tr>
              <th scope="col">Task</th><th scope="col">Type</th>${admin ? html`<th scope="col">Owner</th>` : null}
              <th scope="col">Status</th><th scope="col" class="wide">Progress</th><th scope="col">Runs</th>
              <th scope="col">Created</th><th scope="col">Duration</th>
            </tr></thead>
            <tbody>
              ${shown.items.map(
                (t) => html`<tr key=${t.taskId} data-task=${t.taskId}>
                  <td><a href=${`#/tasks/${t.taskId}`}>#${t.taskId}</a></td>
                  <td>${t.analysisType}</td>
                  ${admin ? html`<td><span class="name">${shownName(t.owner)}</span></td>` : null}
                  <td><${Status} status=${t.status} /> <${QueuePlace} queue=${t.queue} brief /></td>
                  <td class="wide"><${TaskBar} task=${t} /></td>
                  <td class="num">${t.succeededCount + t.failedCount + t.timedOutCount + t.cancelledCount}/${t.totalCount}
                    ${t.failedCount + t.timedOutCount > 0 ? html` <span class="bad">(${t.failedCount + t.timedOutCount} failed)</span>` : null}</td>
                  <td>${when(t.createdAt)}</td>
                  <td>${duration(t.startedAt, t.finishedAt)}</td>
                </tr>`,
              )}
            </tbody>
          </table></div>
          <${Pager} cursors=${shown.cursors} next=${shown.nextCursor}
            onPage=${(cursors) => goTo(listAddress(path, filter, cursors), again)} />`
    }
  </section>`;
}

/**
 * An option for a filter's value from the address that is none of `known` (`#/?status=bogus`, which the
 * API refuses): the select shows it, not a blank, and leaving it sets the select again. Without one the
 * select had nothing selected, and going back to "any" left it blank (Preact compares the new value
 * with the element's, which reads "" then). None while `known` is not loaded yet.
 */
function unknownOption(value, known) {
  if (!value || !known || known.includes(value)) return null;
  // Cut: a select is as wide as its longest option, and the address may hold anything.
  const name = shownName(value);
  return html`<option value=${value}>${name.length > 40 ? `${name.slice(0, 39)}…` : name} (not known)</option>`;
}
