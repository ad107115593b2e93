// The API client: every request carries the token in the Authorization header (never in a URL).
import { noteServerDate } from "./clock.js";

const TOKEN_KEY = "assay.token";

/** Why a request signed the page out: its token was refused (revoked, or unknown here). */
export const TOKEN_REFUSED = {
  code: "UNAUTHORIZED",
  message: "Your token is no longer valid: sign in again.",
};

export const session = {
  get token() {
    return localStorage.getItem(TOKEN_KEY);
  },
  signIn(token) {
    localStorage.setItem(TOKEN_KEY, token);
  },
  /** `reason` (an error) is shown on the sign-in form; none when the user signed out. */
  signOut(reason = null) {
    localStorage.removeItem(TOKEN_KEY);
    window.dispatchEvent(new CustomEvent("assay:signed-out", { detail: reason }));
  },
  /**
   * Calls `onChange()` when another tab signs in or out (a `storage` event: it fires in the other tabs
   * only). Returns the function that stops it.
   */
  watch(onChange) {
    const changed = (e) => {
      if (e.storageArea === localStorage && (e.key === TOKEN_KEY || e.key === null)) onChange();
    };
    window.addEventListener("storage", changed);
    return () => window.removeEventListener("storage", changed);
  },
};

/**
 * Why `token` cannot be a token (an error), or null. Tokens are printable ASCII; a header carries
 * nothing beyond Latin-1, so a token pasted with, say, a zero-width space failed in fetch itself and
 * read as "The server could not be reached".
 */
export function notAToken(token) {
  const stray = /[^\x21-\x7e]/u.exec(token)?.[0];
  if (stray === undefined) return null;
  const point = stray.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
  return {
    code: "UNAUTHORIZED",
    message: `That is not a token: it holds U+${point}, a character no token has. Copy it again.`,
  };
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function headers(token, extra = {}) {
  return { authorization: `Bearer ${token ?? ""}`, ...extra };
}

/**
 * A 401 signs out — when the token refused is still the one signed in: another tab may have signed in
 * with another since the request was sent.
 */
function refused(sent) {
  if (session.token === sent) session.signOut(TOKEN_REFUSED);
}

async function failure(res, sent) {
  const body = await res.json().catch(() => null);
  if (res.status === 401) refused(sent);
  return new ApiError(res.status, body?.code ?? `HTTP_${res.status}`, body?.message ?? res.statusText);
}

/**
 * fetch, whose failure to reach the server (no connection, the connection dropped: a TypeError
 * "Failed to fetch") is an ApiError NETWORK, as an upload's is. An abort stays an abort.
 */
async function reach(url, init) {
  try {
    const res = await fetch(url, init);
    noteServerDate(res.headers.get("date"));
    return res;
  } catch (err) {
    if (init.signal?.aborted) throw err;
    throw new ApiError(0, "NETWORK", "The server could not be reached: check the connection and try again.");
  }
}

/** JSON request to /api; returns the envelope's data. */
export async function api(path, { method = "GET", body, signal, extraHeaders } = {}) {
  const token = session.token;
  const init = { method, signal, headers: headers(token, extraHeaders) };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["content-type"] = "application/json";
  }
  const res = await reach(`/api${path}`, init);
  if (!res.ok) throw await failure(res, token);
  return (await res.json()).data;
}

/**
 * A response body as a Blob (an output previewed, the results table shown), with its content type; a
 * File, named as the response's Content-Disposition names it, when it names one. Held whole in memory:
 * what is saved goes through saveVia instead.
 */
export async function apiBlob(path, { signal } = {}) {
  const token = session.token;
  const res = await reach(`/api${path}`, { headers: headers(token), signal });
  if (!res.ok) throw await failure(res, token);
  const blob = await res.blob();
  const name = fileNameOf(res.headers.get("content-disposition"));
  return name ? new File([blob], name, { type: blob.type }) : blob;
}

/**
 * The file name a Content-Disposition header gives: `filename*=UTF-8''…` (RFC 6266 / 5987) first, then
 * `filename="…"` (or a bare token); only its last path segment, without control characters. Null when
 * it gives none.
 */
export function fileNameOf(disposition) {
  if (!disposition) return null;
  let name = null;
  const extended = /(?:^|;)\s*filename\*\s*=\s*([^';\s]*)'[^']*'([^;\s]*)/i.exec(disposition);
  if (extended && /^utf-8$/i.test(extended[1] ?? "")) {
    try {
      name = decodeURIComponent(extended[2] ?? "");
    } catch {
      name = null;
    }
  }
  if (!name) {
    const plain = /(?:^|;)\s*filename\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]+))/i.exec(disposition);
    if (plain) name = plain[1] !== undefined ? plain[1].replace(/\\(.)/g, "$1") : plain[2];
  }
  const last = lastSegment(name ?? "");
  return last && last !== "." && last !== ".." ? last : null;
}

/** A name's last path segment, without control characters or outer blanks. */
function lastSegment(name) {
  const clean = name.replace(/\p{Cc}/gu, "");
  return clean.slice(Math.max(clean.lastIndexOf("/"), clean.lastIndexOf("\\")) + 1).trim();
}

/**
 * How often a page re-reads what sends no events while it changes (the task list, a queued task's
 * place in the queue), while the tab is visible.
 */
export const POLL_MS = 2000;

/**
 * How long a page waits before it reads again what it failed to read `failures` times in a row:
 * 1 s, 2 s, 4 s … 15 s (the task page, the task and files lists).
 */
export const rereadDelayMs = (failures) => Math.min(1000 * 2 ** failures, 15_000);

/**
 * Whether a failed read is worth trying again by itself: it did not reach the server (NETWORK), or
 * the server failed it (5xx: an API restarting, a database not answering). A 4xx will not change.
 */
export const mayPass = (err) => err.status === 0 || err.status >= 500;

/**
 * The raw response of an authenticated GET (for streams). A 401 signs out, as any request's does: a
 * stream that reconnected after the network dropped, its token revoked meanwhile, showed the task
 * "unavailable", still signed in, until 2026-12-06.
 */
export async function apiFetch(path, init = {}) {
  const token = session.token;
  const res = await fetch(`/api${path}`, { ...init, headers: headers(token, init.headers ?? {}) });
  if (res.status === 401) refused(token);
  return res;
}

/**
 * Saves a download through a fresh download link: `linkPath` is the API route that makes one (a POST,
 * with the token), and the link is followed by a temporary `<a download>`, so the browser fetches the
 * file itself and streams it to disk under the name its Content-Disposition gives. Read with fetch, a
 * zip of several GB was held whole in the tab's memory (until 2026-12-06). Rejects with the ApiError
 * of a link refused (not ready, not found, the network); what goes wrong after is the browser's
 * download's to show.
 */
export async function saveVia(linkPath) {
  const { url } = await api(linkPath, { method: "POST" });
  const a = document.createElement("a");
  a.href = url;
  // Empty: the response's own name.
  a.download = "";
  document.body.append(a);
  a.click();
  a.remove();
}

/**
 * Uploads one file with progress (fetch cannot report upload progress; XMLHttpRequest can).
 * Resolves with the file record; rejects with ApiError. `signal` aborts it.
 */
export function uploadFile(file, onProgress, signal) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    const token = session.token;
    xhr.open("POST", "/api/files");
    xhr.setRequestHeader("authorization", `Bearer ${token ?? ""}`);
    xhr.upload.onprogress = (e) => {
      if (e.lengthComputable) onProgress(e.loaded, e.total);
    };
    xhr.onload = () => {
      let body = null;
      try {
        body = JSON.parse(xhr.responseText);
      } catch {}
      if (xhr.status === 201 && body) resolve(body.data);
      else {
        if (xhr.status === 401) refused(token);
        reject(
          new ApiError(xhr.status, body?.code ?? `HTTP_${xhr.status}`, body?.message ?? "Upload failed"),
        );
      }
    };
    xhr.onerror = () => reject(new ApiError(0, "NETWORK", "The upload could not reach the server."));
    xhr.onabort = () => reject(new ApiError(0, "ABORTED", "Upload cancelled."));
    signal?.addEventListener("abort", () => xhr.abort(), { once: true });
    const form = new FormData();
    form.append("file", file, file.name);
    xhr.send(form);
  });
}
