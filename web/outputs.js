// A run's outputs: listed, and each one shown the way it reads best — CSV and JSON previewed (first
// rows), images shown, an HTML report in a sandboxed frame (no script, an opaque origin). Outputs are
// fetched with the token and shown from blob: URLs — but for a report, whose frame cannot send the
// token: it loads from a short-lived view link the API makes (a blob: document would inherit this
// page's Content-Security-Policy and lose the report's styles). A download is saved by the browser
// from a download link, never read into this page. Nothing from an output is ever parsed as HTML in
// this page.
import { api, apiBlob, saveVia } from "./api.js";
import { parseCsv } from "./csv.js";
import { isTerminal } from "./events.js";
import { bytes, shownName, shownText } from "./format.js";
import { html, useEffect, useState } from "./lib.js";
import { ErrorNote } from "./widgets.js";

const PREVIEW_ROWS = 20;
const PREVIEW_BYTES = 256 * 1024;

function Preview({ path, output }) {
  const [state, setState] = useState({ loading: true });
  useEffect(() => {
    const ctrl = new AbortController();
    let url = null;
    if (/\.html$/i.test(output.name)) {
      api(`${path}/link`, { method: "POST", signal: ctrl.signal }).then(
        (link) => setState({ kind: "html", url: link.url }),
        (error) => ctrl.signal.aborted || setState({ error }),
      );
      return () => ctrl.abort();
    }
    apiBlob(path, { signal: ctrl.signal }).then(
      async (blob) => {
        const ext = output.name.toLowerCase().split(".").pop();
        if (ext === "png" || ext === "svg") {
          url = URL.createObjectURL(blob);
          setState({ kind: "image", url });
        } else {
          const text = await blob.slice(0, PREVIEW_BYTES).text();
          const cut = blob.size > PREVIEW_BYTES;
          if (ext === "csv") setState({ kind: "csv", rows: parseCsv(text, PREVIEW_ROWS + 1), cut });
          else if (ext === "json") {
            let shown = text;
            try {
              if (!cut) shown = JSON.stringify(JSON.parse(text), null, 2);
            } catch {}
            setState({ kind: "text", text: shown.split("\n").slice(0, 200).join("\n"), cut });
          } else setState({ kind: "text", text, cut });
        }
      },
      (error) => ctrl.signal.aborted || setState({ error }),
    );
    return () => {
      ctrl.abort();
      if (url) URL.revokeObjectURL(url);
    };
  }, [path]);
  if (state.error) return html`<${ErrorNote} error=${state.error} />`;
  if (state.loading)
    return html`<p class="muted">Loading <span class="name">${shownName(output.name)}</span>…</p>`;
  if (state.kind === "image")
    return html`<img class="output-image" src=${state.url} alt=${shownName(output.name)} />`;
  if (state.kind === "html")
    return html`<iframe class="report" sandbox="" referrerpolicy="no-referrer" src=${state.url} title=${shownName(output.name)}></iframe>
      <p><a href=${state.url} target="_blank" rel="noopener noreferrer">Open <span class="name">${shownName(output.name)}</span> in a new tab</a>
        <span class="muted">(the link works for ten minutes)</span></p>`;
  if (state.kind === "csv") {
    const [head = [], ...rows] = state.rows;
    return html`<div class="scroll"><table class="preview" aria-label=${`Preview of ${shownName(output.name)}`}>
      <thead><tr>${head.map((h) => html`<th scope="col">${shownName(h)}</th>`)}</tr></thead>
      <tbody>${rows.slice(0, PREVIEW_ROWS).map((r) => html`<tr>${r.map((c) => html`<td>${shownName(c)}</td>`)}</tr>`)}</tbody>
    </table></div>
    ${rows.length > PREVIEW_ROWS || state.cut ? html`<p class="muted">First ${PREVIEW_ROWS} rows.</p>` : null}`;
  }
  return html`<pre class="preview">${shownText(state.text)}</pre>${state.cut ? html`<p class="muted">Beginning only.</p>` : null}`;
}

export function Metrics({ metrics }) {
  const entries = Object.entries(metrics ?? {});
  if (entries.length === 0) return null;
  return html`<table class="metrics" aria-label="Metrics">
    <tbody>${entries.map(
      ([k, v]) =>
        html`<tr><th scope="row"><span class="name">${shownName(k)}</span></th><td>${shownName(typeof v === "object" && v !== null ? JSON.stringify(v) : String(v))}</td></tr>`,
    )}</tbody>
  </table>`;
}

export function RunOutputs({ taskId, run }) {
  const [list, setList] = useState(null);
  const [open, setOpen] = useState(null);
  const [error, setError] = useState(null);
  const base = `/analysis-tasks/${taskId}/runs/${run.runId}/outputs`;
  useEffect(() => {
    const ctrl = new AbortController();
    api(base, { signal: ctrl.signal }).then(
      (data) => {
        setList(data.items);
        const first = data.items.find((o) => /\.(html|csv|png|svg|json)$/i.test(o.name));
        if (first) setOpen(first.name);
      },
      (err) => ctrl.signal.aborted || setError(err),
    );
    return () => ctrl.abort();
  }, [base]);
  // Saved by the browser from a download link (streamed to disk), not read into this page.
  const download = async (name) => {
    try {
      await saveVia(`${base}/${encodeURIComponent(name)}/download-link`);
      setError(null);
    } catch (err) {
      setError(err);
    }
  };
  return html`<div class="run-outputs">
    <${Metrics} metrics=${run.metrics} />
    <${ErrorNote} error=${error} />
    ${
      list === null
        ? html`<p class="muted">Loading outputs…</p>`
        : list.length === 0
          ? html`<p class="muted">No outputs${noOutputsWhy(run.status)}.</p>`
          : html`<ul class="outputs">
            ${list.map(
              (o) => html`<li key=${o.name}>
                <button type="button" class=${`link ${open === o.name ? "current" : ""}`} aria-pressed=${open === o.name}
                  onClick=${() => setOpen(open === o.name ? null : o.name)}><span class="name">${shownName(o.name)}</span></button>
                <span class="muted">${bytes(o.sizeBytes)}</span>
                <button type="button" class="link" onClick=${() => download(o.name)} aria-label=${`Download ${shownName(o.name)}`}>download</button>
              </li>`,
            )}
          </ul>`
    }
    ${
      open && list?.some((o) => o.name === open)
        ? html`<${Preview} key=${open} path=${`${base}/${encodeURIComponent(open)}`} output=${list.find((o) => o.name === open)} />`
        : null
    }
  </div>`;
}

/** Why a run has no outputs to list: it has not finished yet, or it did not succeed. */
function noOutputsWhy(status) {
  if (status === "succeeded") return "";
  if (!isTerminal(status)) return " yet: the run has not finished";
  return ": the run did not succeed";
}
