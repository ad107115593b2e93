// The user's uploads, newest first, paged; choose some to start a task over them.
import { api } from "./api.js";
import { bytes, shownName, when } from "./format.js";
import { html, useEffect, useState } from "./lib.js";
import { ErrorNote, Pager } from "./widgets.js";

export function FilesView({ me }) {
  const [paging, setPaging] = useState({ cursors: [], cursor: null });
  const [page, setPage] = useState(null);
  const [error, setError] = useState(null);
  const [chosen, setChosen] = useState(() => new Set());
  useEffect(() => {
    const ctrl = new AbortController();
    const q = new URLSearchParams({ limit: "50" });
    if (paging.cursor) q.set("cursor", paging.cursor);
    // The page keeps the cursors that reached it: the pager goes on from the page shown, which is
    // the one before when a read failed (a failed "Older" moved to a page never shown, and the next
    // one pushed its cursor again, so "Newer" came back to the same page). A read that succeeds ends
    // the error of one that failed.
    api(`/files?${q}`, { signal: ctrl.signal }).then(
      (p) => {
        setPage({ ...p, cursors: paging.cursors });
        setError(null);
      },
      (err) => ctrl.signal.aborted || setError(err),
    );
    return () => ctrl.abort();
  }, [paging]);
  const toggle = (id) => {
    const next = new Set(chosen);
    next.has(id) ? next.delete(id) : next.add(id);
    setChosen(next);
  };
  return html`<section>
    <header class="row">
      <h1>Files</h1>
      <a class=${`button primary ${chosen.size === 0 ? "disabled" : ""}`} aria-disabled=${chosen.size === 0}
        href=${chosen.size === 0 ? undefined : `#/new?files=${[...chosen].join(",")}`}>New task with ${chosen.size} selected</a>
    </header>
    <${ErrorNote} error=${error} />
    ${
      page === null
        ? html`<p class="muted">Loading…</p>`
        : page.items.length === 0
          ? html`<p class="muted">No files yet. <a href="#/new">Upload some.</a></p>`
          : html`<div class="scroll"><table class="files">
            <thead><tr><th scope="col"><span class="visually-hidden">Select</span></th><th scope="col">Name</th>
              ${me?.role === "admin" ? html`<th scope="col">Owner</th>` : null}
              <th scope="col">Size</th><th scope="col">SHA-256</th><th scope="col">Uploaded</th></tr></thead>
            <tbody>${page.items.map(
              (f) => html`<tr key=${f.fileId} data-file=${f.fileId}>
                <td><input type="checkbox" id=${`file-${f.fileId}`} checked=${chosen.has(f.fileId)} onChange=${() => toggle(f.fileId)} /></td>
                <td class="name"><label for=${`file-${f.fileId}`}>${shownName(f.name)}</label></td>
                ${me?.role === "admin" ? html`<td><span class="name">${shownName(f.owner)}</span></td>` : null}
                <td class="num">${bytes(f.sizeBytes)}</td>
                <td><code title=${f.sha256}>${f.sha256.slice(0, 12)}</code></td>
                <td>${when(f.createdAt)}</td>
              </tr>`,
            )}</tbody>
          </table></div>
          <${Pager} cursors=${page.cursors} next=${page.nextCursor} onPage=${(cursors, cursor) => setPaging({ cursors, cursor })} />`
    }
  </section>`;
}
