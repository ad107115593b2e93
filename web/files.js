// The user's uploads, newest first, paged; choose some to start a task over them. The page is in the
// address (`#/files?cursor=…`, app.js reads it), so Back and a reload come back to it.
import { api, mayPass, rereadDelayMs } from "./api.js";
import { bytes, shownName, when } from "./format.js";
import { html, useEffect, useRef, useState } from "./lib.js";
import { ErrorNote, focusIfLost, goTo, listAddress, Pager, useFailures } from "./widgets.js";

export function FilesView({ me, paging }) {
  const [page, setPage] = useState(null);
  const [error, setError] = useState(null);
  // Bumped to read the page shown again (its address asked for again: no hashchange follows).
  const [again, setAgain] = useState(0);
  const [chosen, setChosen] = useState(() => new Set());
  // Reads failed in a row (the retry's backoff), counted afresh on another page.
  const failed = useFailures(paging.key);
  useEffect(() => {
    const ctrl = new AbortController();
    let retry = null;
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
        failed.current = 0;
      },
      (err) => {
        if (ctrl.signal.aborted) return;
        setError(err);
        // Not reached, or failed by the server: read again, 1 s, 2 s … 15 s apart (as the task list).
        if (mayPass(err)) retry = setTimeout(() => setAgain((n) => n + 1), rereadDelayMs(failed.current++));
      },
    );
    return () => {
      ctrl.abort();
      clearTimeout(retry);
    };
  }, [paging.key, again]);
  // The files whose whole SHA-256 is shown. The list shows its first 12 digits, a button that shows
  // it whole (until 2026-12-06 it was only in a tooltip, which the keyboard and screen readers never
  // reach), in a read-only field the keyboard can select and copy. The button is described by the
  // file's name, not named by it: a name holding the file's would answer for "Keep" or "Delete".
  const [hashes, setHashes] = useState(() => new Set());
  const showHash = (id, shown) => {
    const next = new Set(hashes);
    shown ? next.add(id) : next.delete(id);
    setHashes(next);
  };
  const toggle = (id) => {
    const next = new Set(chosen);
    next.has(id) ? next.delete(id) : next.add(id);
    setChosen(next);
  };
  // Deleting the chosen files: asked first in the page (no browser dialog), then one request each. A
  // file already gone (another tab, another admin) counts as deleted; the first other error is shown
  // and the files not deleted stay chosen.
  const [confirming, setConfirming] = useState(false);
  const [deleting, setDeleting] = useState(false);
  // What the last deletion did, said (a live region) and focused: the buttons the keyboard was on are
  // gone or disabled after it. The question takes the focus to its "Keep" (the action that changes
  // nothing), and "Keep" gives it back to "Delete … selected". Until 2026-12-06 each of these left the
  // focus on <body>, and a deletion said nothing.
  const [deleted, setDeleted] = useState(null);
  const keep = useRef(null);
  const ask = useRef(null);
  const said = useRef(null);
  const [focusTo, setFocusTo] = useState(null);
  useEffect(() => {
    const to = { keep, ask, said }[focusTo];
    if (!to) return;
    setFocusTo(null);
    if (to === keep) to.current?.focus();
    else focusIfLost(to.current);
  }, [focusTo]);
  async function remove() {
    setDeleting(true);
    const left = new Set(chosen);
    let failure = null;
    for (const id of chosen) {
      try {
        await api(`/files/${id}`, { method: "DELETE" });
        left.delete(id);
      } catch (err) {
        if (err.code === "FILE_NOT_FOUND") left.delete(id);
        else {
          failure = err;
          break;
        }
      }
    }
    const count = chosen.size - left.size;
    setChosen(left);
    setDeleting(false);
    setConfirming(false);
    setAgain((n) => n + 1);
    setDeleted(`${count === 0 ? "No" : count} ${count === 1 ? "file" : "files"} deleted.`);
    setFocusTo("said");
    if (failure) setError(failure);
  }
  // Why the two buttons above the list are disabled, shown by them (until 2026-12-06 nothing said it).
  const why =
    chosen.size > 0
      ? null
      : page?.items.length === 0
        ? "No files to select."
        : "Select files in the list first.";
  return html`<section>
    <header class="row">
      <h1>Files</h1>
      <div class="row actions">
        <a class=${`button primary ${chosen.size === 0 ? "disabled" : ""}`} aria-disabled=${chosen.size === 0}
          aria-describedby=${why ? "selected-why" : undefined}
          href=${chosen.size === 0 ? undefined : `#/new?files=${[...chosen].join(",")}`}>New task with ${chosen.size} selected</a>
        <button type="button" class="danger" disabled=${chosen.size === 0 || deleting} onClick=${() => {
          setConfirming(true);
          setDeleted(null);
          setFocusTo("keep");
        }} ref=${ask} aria-describedby=${why ? "selected-why" : undefined}>Delete ${chosen.size} selected</button>
        ${why ? html`<small class="why" id="selected-why">${why}</small>` : null}
      </div>
    </header>
    ${
      confirming && chosen.size > 0
        ? html`<p class="confirm" role="alert">Delete ${chosen.size} ${chosen.size === 1 ? "file" : "files"}, record and bytes?
          Tasks made from ${chosen.size === 1 ? "it" : "them"} keep their outputs; runs that have not read ${chosen.size === 1 ? "it" : "them"} yet will fail.
          <button type="button" class="danger" disabled=${deleting} onClick=${remove}>${deleting ? "Deleting…" : "Delete"}</button>
          <button type="button" disabled=${deleting} ref=${keep} onClick=${() => {
            setConfirming(false);
            setFocusTo("ask");
          }}>Keep</button></p>`
        : null
    }
    <p class=${deleted ? "notice" : ""} role="status" tabindex="-1" ref=${said}>${deleted}</p>
    <${ErrorNote} error=${error} />
    ${
      page === null
        ? error
          ? null
          : html`<p class="muted">Loading…</p>`
        : page.items.length === 0
          ? html`<p class="muted">No files yet. <a href="#/new">Upload some.</a></p>`
          : html`<div class="scroll"><table class="files">
            <thead><tr><th scope="col"><span class="visually-hidden">Select</span></th><th scope="col">Name</th>
              ${me?.role === "admin" ? html`<th scope="col">Owner</th>` : null}
              <th scope="col">Size</th><th scope="col">SHA-256</th><th scope="col">Uploaded</th></tr></thead>
            <tbody>${page.items.map(
              (f) => html`<tr key=${f.fileId} data-file=${f.fileId}>
                <td><input type="checkbox" id=${`file-${f.fileId}`} checked=${chosen.has(f.fileId)} onChange=${() => toggle(f.fileId)} /></td>
                <td class="name"><label for=${`file-${f.fileId}`} id=${`file-name-${f.fileId}`}>${shownName(f.name)}</label></td>
                ${me?.role === "admin" ? html`<td><span class="name">${shownName(f.owner)}</span></td>` : null}
                <td class="num">${bytes(f.sizeBytes)}</td>
                <td class="sha">
                  <button type="button" class="link" aria-expanded=${hashes.has(f.fileId)} id=${`sha-${f.fileId}`}
                    aria-label=${`${f.sha256.slice(0, 12)}…, SHA-256`} aria-describedby=${`file-name-${f.fileId}`}
                    onClick=${() => showHash(f.fileId, !hashes.has(f.fileId))}><code>${f.sha256.slice(0, 12)}…</code></button>
                  ${
                    hashes.has(f.fileId)
                      ? html`<input class="sha-full" readonly value=${f.sha256} spellcheck="false"
                        aria-label=${`SHA-256 of ${shownName(f.name)}`} onFocus=${(e) => e.currentTarget.select()}
                        onKeyDown=${(e) => {
                          if (e.key !== "Escape") return;
                          showHash(f.fileId, false);
                          document.getElementById(`sha-${f.fileId}`)?.focus();
                        }} />`
                      : null
                  }
                </td>
                <td>${when(f.createdAt)}</td>
              </tr>`,
            )}</tbody>
          </table></div>
          <${Pager} cursors=${page.cursors} next=${page.nextCursor} onPage=${(cursors) => goTo(listAddress("/files", {}, cursors), () => setAgain((n) => n + 1))} />`
    }
  </section>`;
}
