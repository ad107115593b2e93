// New task: pick files (drop them, or a file picker; many at once, each uploaded with its own
// progress) and/or files already uploaded, choose the analysis type — types no live worker can run are
// shown unavailable with the reason — fill in its parameters, submit.
import { api, uploadFile } from "./api.js";
import { bytes, shownName, when } from "./format.js";
import { html, useEffect, useRef, useState } from "./lib.js";
import { parametersFrom, SchemaForm } from "./schema-form.js";
import { ErrorNote, focusIfLost, RunBar } from "./widgets.js";

const UPLOADS_AT_ONCE = 3;
const OTHERS_AT_ONCE = 4;
let nextKey = 1;

/**
 * A random Idempotency-Key: 32 hex digits from getRandomValues (crypto.randomUUID exists only in a
 * secure context, which an http:// address other than localhost is not).
 */
function idempotencyKey() {
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join(
    "",
  );
}

/**
 * The parameter a refusal of the API names, when it names one of `schema`'s: its message starts with
 * `body/parameters/<name>` ("body/parameters/columns/0 must NOT have more than 200 characters"), or
 * says `body/parameters must have required property '<name>'`.
 */
function refusedParameter(err, schema) {
  if (err?.code !== "VALIDATION_FAILED" || typeof err.message !== "string") return null;
  const m =
    /^body\/parameters\/([^/\s]+)/.exec(err.message) ??
    /^body\/parameters must have required property '([^']+)'/.exec(err.message);
  const name = m?.[1]?.replace(/~1/g, "/").replace(/~0/g, "~");
  return name !== undefined && Object.hasOwn(schema?.properties ?? {}, name) ? name : null;
}

/**
 * What the uploads' live region says: how many are done and failed, changed when one ends — not at
 * every step of its progress. (A failure is also said by its own alert.)
 */
function uploadsSaid(uploads) {
  if (uploads.length === 0) return "";
  const done = uploads.filter((u) => u.state === "done").length;
  const failed = uploads.filter((u) => u.state === "failed").length;
  return `${done} of ${uploads.length} ${uploads.length === 1 ? "upload" : "uploads"} done${failed > 0 ? `, ${failed} failed` : ""}.`;
}

export function NewTaskView({ types, preselected }) {
  const [type, setType] = useState("");
  const [values, setValues] = useState({});
  const [uploads, setUploads] = useState([]); // {key, file, loaded, total, state, error, record}
  const [chosen, setChosen] = useState(() => new Set(preselected));
  const [known, setKnown] = useState(null);
  const [error, setError] = useState(null);
  // A parameter's problem, shown at its field: name → message (the form's own checks, the API's refusal).
  const [fieldProblems, setFieldProblems] = useState({});
  const [busy, setBusy] = useState(false);
  const [dragging, setDragging] = useState(false);
  const controllers = useRef(new Map());
  // The last request sent and its Idempotency-Key: sent again unchanged (after a dropped connection or
  // a 5xx, which may have created the task), it carries the same key and gets that task, not a second.
  const attempt = useRef({ body: null, key: null });
  // Files chosen elsewhere (the files page's later pages) that the list below does not show: id → the
  // file's record, or the error reading it.
  const [others, setOthers] = useState(() => new Map());
  const picker = useRef(null);
  // The list of uploaded files starts open when files came chosen, and is then the user's to open and
  // close: bound to the count chosen, it closed under the keyboard's focus when the last was unchosen
  // (until 2026-12-06), and the focus fell to <body>.
  const [listOpen] = useState(() => preselected.length > 0);

  useEffect(() => {
    const ctrl = new AbortController();
    api("/files?limit=50", { signal: ctrl.signal }).then(
      setKnown,
      (err) => ctrl.signal.aborted || setError(err),
    );
    return () => {
      ctrl.abort();
      for (const c of controllers.current.values()) c.abort();
    };
  }, []);
  // A chosen file the first page of uploads does not hold is read by itself, to be shown (and unchosen),
  // OTHERS_AT_ONCE at a time: a selection of hundreds on the files page is not hundreds of requests at once.
  useEffect(() => {
    if (known === null) return;
    const listed = new Set(known.items.map((f) => f.fileId));
    const ctrl = new AbortController();
    const queue = preselected.filter((id) => !listed.has(id));
    const next = async () => {
      for (let id = queue.shift(); id !== undefined && !ctrl.signal.aborted; id = queue.shift()) {
        const read = id;
        await api(`/files/${read}`, { signal: ctrl.signal }).then(
          (record) => setOthers((m) => new Map(m).set(read, { record })),
          (error) => ctrl.signal.aborted || setOthers((m) => new Map(m).set(read, { error })),
        );
      }
    };
    for (let i = 0; i < OTHERS_AT_ONCE; i++) next();
    return () => ctrl.abort();
  }, [known]);
  useEffect(() => {
    if (!type && types) setType(types.find((t) => t.available)?.name ?? types[0]?.name ?? "");
  }, [types]);

  const patch = (key, change) =>
    setUploads((list) => list.map((u) => (u.key === key ? { ...u, ...change } : u)));

  async function start(key, file) {
    const ctrl = new AbortController();
    controllers.current.set(key, ctrl);
    patch(key, { state: "uploading" });
    try {
      const record = await uploadFile(file, (loaded, total) => patch(key, { loaded, total }), ctrl.signal);
      patch(key, { state: "done", record, loaded: file.size, total: file.size });
    } catch (err) {
      const message =
        err.code === "PAYLOAD_TOO_LARGE"
          ? `${shownName(file.name)} is too large: ${err.message}`
          : err.message;
      patch(key, { state: "failed", error: { code: err.code, message } });
    } finally {
      controllers.current.delete(key);
    }
  }

  // Uploads start as soon as files are picked, a few at a time.
  useEffect(() => {
    const running = uploads.filter((u) => u.state === "uploading").length;
    const waiting = uploads
      .filter((u) => u.state === "waiting")
      .slice(0, Math.max(0, UPLOADS_AT_ONCE - running));
    for (const u of waiting) start(u.key, u.file);
  }, [uploads]);

  function add(fileList) {
    const added = [...fileList].map((file) => ({
      key: nextKey++,
      file,
      loaded: 0,
      total: file.size,
      state: "waiting",
    }));
    setUploads((list) => [...list, ...added]);
  }
  // The focus goes to the next upload's "remove" (or the one before, or the file picker): the button
  // pressed goes with its row, and the focus fell to <body> (until 2026-12-06).
  function remove(key) {
    controllers.current.get(key)?.abort();
    const at = uploads.findIndex((u) => u.key === key);
    setUploads((list) => list.filter((u) => u.key !== key));
    setTimeout(() => {
      const buttons = document.querySelectorAll(".uploads > li > button");
      focusIfLost(buttons[at] ?? buttons[at - 1] ?? picker.current);
    });
  }

  const spec = types?.find((t) => t.name === type);
  const pending = uploads.some((u) => u.state === "waiting" || u.state === "uploading");
  const fileIds = [...uploads.filter((u) => u.state === "done").map((u) => u.record.fileId), ...chosen];
  const uniqueIds = [...new Set(fileIds)];
  // Why "Start" is disabled, shown next to it (a disabled button is no stop of the keyboard's, and
  // until 2026-12-06 nothing said why).
  const startWhy = !spec
    ? types === null
      ? "Loading the analysis types…"
      : types.length === 0
        ? "No analysis type could be read."
        : "Choose an analysis type."
    : pending
      ? "Waiting for the uploads to finish."
      : uniqueIds.length === 0
        ? "Add files, or choose uploaded ones."
        : null;

  /** Shows `problems` (name → message) at their fields, and moves to the first. */
  function atFields(problems) {
    setFieldProblems(problems);
    const first = Object.keys(spec?.parameters?.properties ?? {}).find((name) => problems[name]);
    if (first) setTimeout(() => document.getElementById(`param-${first}`)?.focus());
  }

  async function submit(e) {
    e.preventDefault();
    // Sending: the button is inert, not disabled, so that a refusal leaves the keyboard's focus on it
    // (a disabled button dropped it to <body>, until 2026-12-06).
    if (busy) return;
    setError(null);
    setFieldProblems({});
    if (!spec) return setError({ message: "Choose an analysis type." });
    const { parameters, problems } = parametersFrom(spec.parameters, values);
    if (problems.length > 0)
      return atFields(Object.fromEntries(problems.map((p) => [p.name, { code: "VALIDATION_FAILED", ...p }])));
    if (uniqueIds.length === 0) return setError({ message: "Add at least one file." });
    const body = { analysisType: type, inputFileIds: uniqueIds, parameters };
    const sent = JSON.stringify(body);
    if (attempt.current.body !== sent) attempt.current = { body: sent, key: idempotencyKey() };
    setBusy(true);
    try {
      const task = await api("/analysis-tasks", {
        method: "POST",
        body,
        extraHeaders: { "idempotency-key": attempt.current.key },
      });
      location.hash = `#/tasks/${task.taskId}`;
    } catch (err) {
      const field = refusedParameter(err, spec.parameters);
      if (field) atFields({ [field]: err });
      else setError(err);
      setBusy(false);
    }
  }

  const choose = (name) => {
    setType(name);
    setValues({});
    setFieldProblems({});
  };
  const edit = (next, name) => {
    setValues(next);
    if (fieldProblems[name])
      setFieldProblems((problems) => {
        const rest = { ...problems };
        delete rest[name];
        return rest;
      });
  };
  const dragOver = (e) => {
    e.preventDefault();
    setDragging(true);
  };
  const drop = (e) => {
    e.preventDefault();
    setDragging(false);
    add(e.dataTransfer.files);
  };
  const picked = (e) => {
    add(e.currentTarget.files);
    e.currentTarget.value = "";
  };
  const toggle = (id) => {
    const next = new Set(chosen);
    next.has(id) ? next.delete(id) : next.add(id);
    setChosen(next);
  };

  return html`<section>
    <h1>New task</h1>
    <form onSubmit=${submit}>
      <fieldset>
        <legend>Analysis</legend>
        ${
          // app.js reads the types, and has none when the read failed (the API restarting, a 5xx): said
          // here, or the form showed no choice at all and a disabled button, with no reason.
          types?.length === 0
            ? html`<p class="error" role="alert">The analysis types could not be read. Reload the page to try again.</p>`
            : types === null
              ? html`<p class="muted">Loading analysis types…</p>`
              : null
        }
        <div class="types" role="radiogroup" aria-label="Analysis type">
          ${(types ?? []).map(
            (t) => html`<label class=${`type ${t.available ? "" : "unavailable"}`}>
              <input type="radio" name="type" value=${t.name} checked=${type === t.name}
                onChange=${() => choose(t.name)} />
              <strong>${t.name}</strong>
              <span>${t.description ?? ""}</span>
              ${t.available ? null : html`<em class="bad">unavailable: ${t.reason ?? "no worker can run it"}</em>`}
            </label>`,
          )}
        </div>
        ${spec ? html`<${SchemaForm} schema=${spec.parameters} values=${values} problems=${fieldProblems} onChange=${edit} />` : null}
      </fieldset>

      <fieldset>
        <legend>Files</legend>
        <div class=${`drop ${dragging ? "over" : ""}`}
          onDragOver=${dragOver}
          onDragLeave=${() => setDragging(false)}
          onDrop=${drop}>
          <p>Drop files here, or</p>
          <label class="button">Choose files
            <input ref=${picker} class="visually-hidden" type="file" multiple
              onChange=${picked} />
          </label>
        </div>
        <p class="visually-hidden" role="status">${uploadsSaid(uploads)}</p>
        ${
          uploads.length > 0
            ? html`<ul class="uploads" aria-label="Uploads">
              ${uploads.map(
                (u) => html`<li key=${u.key} class=${`upload ${u.state}`}>
                  <span class="name">${shownName(u.file.name)}</span>
                  <span class="size">${bytes(u.file.size)}</span>
                  <${RunBar} percent=${u.state === "done" ? 100 : u.total ? (100 * u.loaded) / u.total : 0}
                    status=${u.state === "done" ? "succeeded" : u.state === "failed" ? "failed" : "running"}
                    label=${`upload of ${shownName(u.file.name)}`} />
                  <span class="state">${u.state === "failed" ? "" : u.state}</span>
                  <button type="button" class="link" onClick=${() => remove(u.key)}
                    aria-label=${`Remove ${shownName(u.file.name)}`}>remove</button>
                  ${u.error ? html`<${ErrorNote} error=${u.error} />` : null}
                </li>`,
              )}
            </ul>`
            : null
        }
        <details open=${listOpen}>
          <summary>Or choose uploaded files (${chosen.size} chosen)</summary>
          ${
            known === null
              ? html`<p class="muted">Loading…</p>`
              : known.items.length === 0 && others.size === 0
                ? html`<p class="muted">No uploaded files yet.</p>`
                : html`<ul class="known">
                  ${[...others].map(
                    ([id, o]) => html`<li key=${id}><label>
                      <input type="checkbox" checked=${chosen.has(id)} onChange=${() => toggle(id)} />
                      ${
                        o.record
                          ? html`<span class="name">${shownName(o.record.name)}</span> <span class="muted">${bytes(o.record.sizeBytes)} · ${when(o.record.createdAt)}</span>`
                          : html`<span class="muted">file ${id}</span> <span class="bad">${shownName(o.error.message)}</span>`
                      }
                    </label></li>`,
                  )}
                  ${known.items.map(
                    (f) => html`<li key=${f.fileId}><label>
                      <input type="checkbox" checked=${chosen.has(f.fileId)} onChange=${() => toggle(f.fileId)} />
                      <span class="name">${shownName(f.name)}</span> <span class="muted">${bytes(f.sizeBytes)} · ${when(f.createdAt)}</span>
                    </label></li>`,
                  )}
                </ul>`
          }
        </details>
      </fieldset>

      <${ErrorNote} error=${error} />
      <div class="row actions">
        <button type="submit" class="primary" disabled=${startWhy !== null} aria-disabled=${busy || undefined}
          aria-describedby=${startWhy ? "start-why" : undefined}>
          ${pending ? "Uploading…" : `Start ${type || "task"} over ${uniqueIds.length} file${uniqueIds.length === 1 ? "" : "s"}`}
        </button>
        ${startWhy ? html`<small class="why" id="start-why">${startWhy}</small>` : null}
      </div>
    </form>
  </section>`;
}
