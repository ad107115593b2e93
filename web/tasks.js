// The task list: newest first, paged, filtered by status and type; refreshed every two seconds
// (POLL_MS) while any task on the page is still going (and the page is visible). Its filters and page
// are in the address (app.js reads them): choosing one goes to a new address, so Back comes back.
import { api, POLL_MS } from "./api.js";
import { isTerminal } from "./events.js";
import { duration, STATUS_LABEL, shownName, TASK_STATUSES, when } from "./format.js";
import { html, useEffect, useRef, useState } from "./lib.js";
import { ErrorNote, goTo, listAddress, Pager, QueuePlace, Status, TaskBar, useRowFocus } from "./widgets.js";

export function TasksView({ me, types, path, filter, paging }) {
  const [page, setPage] = useState(null);
  const [error, setError] = useState(null);
  const [tick, setTick] = useState(0);

  useEffect(() => {
    const ctrl = new AbortController();
    const q = new URLSearchParams({ limit: "20" });
    if (filter.status) q.set("status", filter.status);
    if (filter.type) q.set("analysisType", filter.type);
    if (paging.cursor) q.set("cursor", paging.cursor);
    api(`/analysis-tasks?${q}`, { signal: ctrl.signal }).then(
      (p) => {
        // With the cursors that reached it: the pager goes on from the page shown (see files.js).
        setPage({ ...p, cursors: paging.cursors });
        setError(null);
      },
      (err) => ctrl.signal.aborted || setError(err),
    );
    return () => ctrl.abort();
  }, [filter.status, filter.type, paging.key, tick]);

  const live = page?.items.some((t) => !isTerminal(t.status));
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
        </select>
      </label>
      <label>Type
        <select value=${filter.type} onChange=${change("type")}>
          <option value="">any</option>
          ${(types ?? []).map((t) => html`<option value=${t.name}>${t.name}</option>`)}
        </select>
      </label>
    </form>
    <${ErrorNote} error=${error} />
    ${
      page === null
        ? error
          ? null
          : html`<p class="muted">Loading…</p>`
        : page.items.length === 0
          ? html`<p class="muted">No tasks${filter.status || filter.type ? " match these filters" : " yet"}. <a href="#/new">Start one.</a></p>`
          : html`<div class="scroll"><table class="tasks">
            <thead><tr>
              <th scope="col">Task</th><th scope="col">Type</th>${admin ? html`<th scope="col">Owner</th>` : null}
              <th scope="col">Status</th><th scope="col" class="wide">Progress</th><th scope="col">Runs</th>
              <th scope="col">Created</th><th scope="col">Duration</th>
            </tr></thead>
            <tbody>
              ${page.items.map(
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
          <${Pager} cursors=${page.cursors} next=${page.nextCursor}
            onPage=${(cursors) => goTo(listAddress(path, filter, cursors), again)} />`
    }
  </section>`;
}
