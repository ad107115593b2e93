// The dashboard's entry: sign-in, the hash router, the header. A sign-in link from `make dev` carries
// the token in the URL fragment (#token=…), which browsers never send to a server; it is removed from
// the address bar at once, and stored (or, with another token signed in, offered: SwitchAccount).
import { api, notAToken, session, TOKEN_REFUSED } from "./api.js";
import { FilesView } from "./files.js";
import { shownName } from "./format.js";
import { html, render, useEffect, useRef, useState } from "./lib.js";
import { NewTaskView } from "./new-task.js";
import { TaskView } from "./task.js";
import { TasksView } from "./tasks.js";
import { addressPaging, addressValue, ErrorNote, focusLost } from "./widgets.js";

/**
 * Reads a sign-in link's token (#token=…) and takes it out of the address bar: `{ problem }`, what is
 * wrong with the link, or `{ pending }`, a token to ask about. It is stored at once when no token is
 * (or this one already is); when another one is, the user chooses (SwitchAccount): a link someone sent
 * switched this browser's every tab to the sender's account unasked, and what the user uploaded and ran
 * next was the sender's to read (a security trial).
 */
function takeTokenFromFragment() {
  const m = /^#token=([^&]+)/.exec(location.hash);
  if (!m) return {};
  history.replaceState(null, "", `${location.pathname}#/`);
  let token;
  try {
    token = decodeURIComponent(m[1]);
  } catch {
    return { problem: { message: "That sign-in link is damaged: copy it again, or paste the token." } };
  }
  const problem = notAToken(token);
  if (problem) return { problem };
  if (session.token && session.token !== token) return { pending: token };
  session.signIn(token);
  return {};
}

/**
 * A sign-in link of another token while one is signed in: whose it is, and the choice. Nothing
 * changes until the user picks; the link's token is asked who it is (a token that is not valid says
 * so, and the session stays).
 */
function SwitchAccount({ token, me, onSwitch, onStay }) {
  const [who, setWho] = useState(undefined);
  // The choice has the focus (a screen reader reads it out first), as a dialog's would.
  const box = useRef(null);
  useEffect(() => box.current?.focus(), []);
  useEffect(() => {
    const ctrl = new AbortController();
    fetch("/api/me", { headers: { authorization: `Bearer ${token}` }, signal: ctrl.signal })
      .then(async (res) =>
        setWho(res.ok ? (await res.json()).data : res.status === 401 ? null : { failed: res.status }),
      )
      .catch(() => ctrl.signal.aborted || setWho({ failed: "network" }));
    return () => ctrl.abort();
  }, [token]);
  const current = html`<strong>${shownName(me.name)}</strong>`;
  let body;
  if (who === undefined) body = html`<p>Checking the sign-in link…</p>`;
  else if (who === null)
    body = html`<p>The sign-in link's token is not valid (unknown, revoked or expired). You are still signed in as ${current}.</p>
      <div class="row"><button type="button" onClick=${onStay}>Dismiss</button></div>`;
  else {
    const other = who.failed
      ? html`another account (its name could not be read)`
      : html`<strong>${shownName(who.name)}</strong>${who.role === "admin" ? " (admin)" : ""}`;
    body = html`<p>You opened a sign-in link for ${other}. You are signed in as ${current}: switching signs
      out ${current} in every tab of this browser, and what you upload and run then belongs to the link's account.</p>
      <div class="row">
        <button type="button" onClick=${onStay}>Stay signed in as ${shownName(me.name)}</button>
        <button type="button" onClick=${onSwitch}>${who.failed ? "Switch account" : `Sign in as ${shownName(who.name)}`}</button>
      </div>`;
  }
  return html`<section class="notice switch-account" role="alertdialog" aria-labelledby="switch-title" tabindex="-1" ref=${box}>
    <h2 id="switch-title">Sign in with this link?</h2>
    ${body}
  </section>`;
}

/**
 * Where the address points. The lists' filters and page are in it (`#/?status=running&cursor=…`,
 * `#/files?cursor=…`), so a reload, a link and Back and Forward show the list as it was; their values
 * go to the API as they are (clipped), which refuses what it does not take with its own error.
 */
function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const at = hash.indexOf("?");
  const path = at < 0 ? hash : hash.slice(0, at);
  const params = new URLSearchParams(at < 0 ? "" : hash.slice(at + 1));
  const m = /^\/tasks\/(\d{1,18})$/.exec(path);
  if (m) return { view: "task", taskId: m[1] };
  if (path === "/new")
    return { view: "new", files: (params.get("files") ?? "").split(",").filter((s) => /^\d{1,18}$/.test(s)) };
  if (path === "/files") return { view: "files", paging: addressPaging(params) };
  if (path === "/" || path === "/tasks")
    return {
      view: "tasks",
      path,
      filter: { status: addressValue(params, "status"), type: addressValue(params, "type") },
      paging: addressPaging(params),
    };
  return { view: "missing" };
}

/** The document's title for view `where` (null: the sign-in form), so a tab and a screen reader say where they are. */
function titleOf(where) {
  const view =
    where === null
      ? "Sign in"
      : where.view === "task"
        ? `Task #${where.taskId}`
        : ({ tasks: "Tasks", new: "New task", files: "Files" }[where.view] ?? "Not found");
  return `${view} — Assay`;
}

/**
 * Moves the keyboard's focus to the heading of the view just shown, once it is there (a task's comes
 * after its read), when the focus was lost with the view left (on <body>, or on an element gone) or is
 * on the header's links that went there — not when the user has moved it meanwhile. Until
 * 2026-12-06 it stayed on <body> after every move: signing in, following a task's link, starting a
 * task, signing out. Returns the function that stops waiting.
 */
function focusHeading() {
  const put = () => {
    const heading = document.querySelector("#app h1");
    if (!heading) return false;
    const at = document.activeElement;
    if (focusLost() || at.closest("header.top, .skip-link")) {
      heading.tabIndex = -1;
      heading.focus();
    }
    return true;
  };
  if (put()) return undefined;
  const watcher = new MutationObserver(() => put() && watcher.disconnect());
  watcher.observe(document.getElementById("app"), { childList: true, subtree: true });
  return () => watcher.disconnect();
}

/**
 * "Skip to main content": the first stop of the keyboard in every view, seen only while it has the
 * focus, which it moves to the view's <main> (past the header's links). A button, not a link to
 * `#main`: the hash router reads every address, and would take that one for a page that is not there.
 * The main region takes the focus only from it (tabindex set then, and dropped once the focus leaves),
 * so a click on its text does not focus it.
 */
function SkipLink() {
  const skip = () => {
    const main = document.getElementById("main");
    if (!main) return;
    main.tabIndex = -1;
    main.addEventListener("blur", () => main.removeAttribute("tabindex"), { once: true });
    main.focus();
  };
  return html`<button type="button" class="skip-link" onClick=${skip}>Skip to main content</button>`;
}

function SignIn({ onSignedIn, problem, link, onTakeLink }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState(problem);
  async function submit(e) {
    e.preventDefault();
    const problem = notAToken(token.trim());
    if (problem) return setError(problem);
    session.signIn(token.trim());
    try {
      onSignedIn(await api("/me"));
    } catch (err) {
      session.signOut();
      setError(
        err.status === 401 ? { message: "That token is not valid (unknown, revoked or expired)." } : err,
      );
    }
  }
  return html`<${SkipLink} />
  <main class="signin" id="main">
    <h1>Assay</h1>
    ${
      link
        ? html`<p class="notice">You opened a sign-in link.
        <button type="button" onClick=${onTakeLink}>Sign in with the link</button></p>`
        : null
    }
    <form onSubmit=${submit}>
      <label for="token">API token</label>
      <input id="token" type="password" autocomplete="off" spellcheck="false" required value=${token}
        onInput=${(e) => setToken(e.currentTarget.value)} placeholder="assay_…"
        aria-invalid=${error ? "true" : undefined} aria-describedby=${error ? "token-problem token-help" : "token-help"} />
      <small id="token-help">Kept in this browser only. Create one with <code>assay token create --user ${"<name>"}</code>.</small>
      <${ErrorNote} id="token-problem" error=${error} />
      <button type="submit" class="primary">Sign in</button>
    </form>
  </main>`;
}

function App({ link }) {
  const [me, setMe] = useState(null);
  const [checking, setChecking] = useState(Boolean(session.token));
  const [problem, setProblem] = useState(link.problem ?? null);
  // A sign-in link of another token than the one signed in, waiting for the user's choice.
  const [pending, setPending] = useState(link.pending ?? null);
  const [where, setWhere] = useState(route);
  const [types, setTypes] = useState(null);

  useEffect(() => {
    const onHash = () => setWhere(route());
    // Who the token is: at start, and whenever another tab signs in (the token every request sends
    // changed under this page: it showed the user signed in before while acting as the new one). A
    // sign-out meanwhile ends the check.
    let checks = 0;
    // Signed out here (the button; a request refused: then why) or in another tab.
    const signedOut = (reason) => {
      checks++;
      setMe(null);
      setTypes(null);
      setProblem(reason);
      setChecking(false);
    };
    const onSignedOut = (e) => signedOut(e.detail ?? null);
    const check = () => {
      const seq = ++checks;
      api("/me").then(
        (m) => {
          if (seq !== checks) return;
          setMe(m);
          setChecking(false);
        },
        (err) => {
          if (seq !== checks) return;
          setMe(null);
          setProblem(err.status === 401 ? TOKEN_REFUSED : err);
          setChecking(false);
        },
      );
    };
    window.addEventListener("hashchange", onHash);
    window.addEventListener("assay:signed-out", onSignedOut);
    // Signed in here with a link's token (SwitchAccount).
    const onSignedIn = () => {
      setChecking(true);
      check();
    };
    window.addEventListener("assay:signed-in", onSignedIn);
    const unwatch = session.watch(() => (session.token ? check() : signedOut(null)));
    if (session.token) check();
    return () => {
      window.removeEventListener("hashchange", onHash);
      window.removeEventListener("assay:signed-out", onSignedOut);
      window.removeEventListener("assay:signed-in", onSignedIn);
      unwatch();
    };
  }, []);
  const takeLink = () => {
    session.signIn(pending);
    setPending(null);
    window.dispatchEvent(new Event("assay:signed-in"));
  };
  // The token signed in was refused (401: revoked, expired, unknown) while a link waited: nothing to
  // switch from, and the link is taken as if nobody had been signed in. Only then: a check that failed
  // otherwise (the network, a 502 while the API restarts) or a sign-out in another tab leaves the link
  // unused — it took them for a refusal and switched unasked (the review).
  useEffect(() => {
    if (pending && !checking && !me && problem === TOKEN_REFUSED) takeLink();
  }, [pending, checking, me, problem]);
  // Staying: the choice goes, and the focus to the view's heading (it fell to <body>).
  const stay = () => {
    setPending(null);
    requestAnimationFrame(() => focusHeading());
  };
  // Read again on every move to or from the form (a worker may have come or gone). An older read
  // still running is aborted, so a slow one cannot replace a newer answer; a failed read keeps the
  // types already known, and with none the form says the read failed (an empty list).
  useEffect(() => {
    if (!me) return;
    const ctrl = new AbortController();
    api("/analysis-types", { signal: ctrl.signal }).then(
      (d) => setTypes(d.items),
      () => ctrl.signal.aborted || setTypes((known) => (known?.length ? known : [])),
    );
    return () => ctrl.abort();
  }, [me, where.view === "new"]);

  // What is shown (a view, the sign-in form): when it changes, its title and where the focus goes. Not
  // on the first one shown, nor after the check of a stored token (the page as it loads keeps focus).
  const shown = checking
    ? "checking"
    : me
      ? `${me.userId} ${where.view} ${where.taskId ?? ""} ${where.files ?? ""}`
      : "signin";
  const shownBefore = useRef(shown);
  useEffect(() => {
    document.title = checking ? "Assay" : titleOf(me ? where : null);
    const before = shownBefore.current;
    shownBefore.current = shown;
    if (before !== shown && before !== "checking") return focusHeading();
  }, [shown]);

  if (checking) return html`<p class="muted">Signing in…</p>`;
  // Not signed in with a link waiting (the stored token's check failed without a refusal, or another
  // tab signed out): the form offers it — the user's choice, nobody's account to switch from; a
  // token pasted instead drops it.
  if (!me)
    return html`<${SignIn}
      onSignedIn=${(m) => {
        setPending(null);
        setMe(m);
      }}
      problem=${problem}
      link=${pending !== null}
      onTakeLink=${takeLink} />`;
  const nav = [
    ["tasks", "#/", "Tasks"],
    ["new", "#/new", "New task"],
    ["files", "#/files", "Files"],
  ];
  let view;
  if (where.view === "task") view = html`<${TaskView} key=${where.taskId} taskId=${where.taskId} me=${me} />`;
  // Keyed by its files: an address whose ?files= changed (edited, Back/Forward between two) is a new
  // form; unkeyed, the old one stayed with its old choice and never looked the new ids up.
  else if (where.view === "new")
    view = html`<${NewTaskView} key=${where.files.join(",")} types=${types} preselected=${where.files} />`;
  else if (where.view === "files") view = html`<${FilesView} me=${me} paging=${where.paging} />`;
  else if (where.view === "tasks")
    view = html`<${TasksView} me=${me} types=${types} path=${where.path} filter=${where.filter} paging=${where.paging} />`;
  else view = html`<section><h1>Not found</h1><p><a href="#/">All tasks</a></p></section>`;
  return html`<div class="layout">
    <${SkipLink} />
    <header class="top">
      <a class="brand" href="#/">Assay</a>
      <nav aria-label="Main">
        ${nav.map(([id, href, label]) => html`<a href=${href} aria-current=${where.view === id ? "page" : undefined}>${label}</a>`)}
      </nav>
      <span class="who"><span class="name">${shownName(me.name)}</span>${me.role === "admin" ? " (admin)" : ""}</span>
      <button type="button" class="link" onClick=${() => session.signOut()}>Sign out</button>
    </header>
    <main key=${me.userId} id="main">
      ${pending ? html`<${SwitchAccount} token=${pending} me=${me} onSwitch=${takeLink} onStay=${stay} />` : null}
      ${view}
    </main>
  </div>`;
}

const link = takeTokenFromFragment();
render(html`<${App} link=${link} />`, document.getElementById("app"));
