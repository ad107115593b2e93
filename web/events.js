// A task's Server-Sent Events, read with fetch so the token travels in the Authorization header
// (EventSource cannot send headers, and a token in the URL would reach logs). After any drop — the API
// restarting, the network — it reconnects with Last-Event-ID: the server sends exactly the events after
// it, and ids already seen are skipped here too, so nothing is shown twice or lost.
import { apiFetch } from "./api.js";

const TERMINAL = new Set(["succeeded", "partially_succeeded", "failed", "timed_out", "cancelled"]);
export const isTerminal = (status) => TERMINAL.has(status);

// The abort listener goes with the wait: a page that reconnects for hours adds one per reconnect.
const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });

/**
 * Follows task `taskId` until it ends or `signal` aborts. `onEvents(events)` gets batches in id order;
 * `onState(state)` gets "connecting" | "live" | "reconnecting" | "ended" | "gone".
 * `isFinished()` is asked when a stream ends without the task's closing event (the server ends a
 * finished task's stream at once when resuming past its last event). `onReset()` is called when the
 * server says the id resumed from is none of the task's events (the database was restored from an older
 * backup): what was shown is stale, and the whole log follows from its first event.
 */
export async function followTask(taskId, { onEvents, onState, onReset, isFinished, signal, after = null }) {
  let lastId = after === null ? null : BigInt(after);
  let failures = 0;
  onState("connecting");
  while (!signal.aborted) {
    let closed = false;
    let waitAtLeast = 0;
    try {
      const res = await apiFetch(`/analysis-tasks/${taskId}/events`, {
        signal,
        headers: {
          accept: "text/event-stream",
          ...(lastId === null ? {} : { "last-event-id": String(lastId) }),
        },
      });
      if (res.status === 404 || res.status === 401) return onState("gone");
      // 429: too many of this user's streams on the server (another tab's); asked again, not before
      // its Retry-After.
      if (res.status === 429) waitAtLeast = Math.min(Number(res.headers.get("retry-after")) || 0, 60) * 1000;
      if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}`);
      onState("live");
      failures = 0;
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let data = [];
      let id = null;
      let type = null;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let batch = [];
        for (let nl = buffer.search(/\r\n|\r|\n/); nl >= 0; nl = buffer.search(/\r\n|\r|\n/)) {
          const line = buffer.slice(0, nl);
          buffer = buffer.slice(nl + (buffer.startsWith("\r\n", nl) ? 2 : 1));
          if (line === "" && type === "reset") {
            // The ids seen so far mean nothing now: the log follows from its start, ids lower than
            // the last one seen included.
            if (batch.length > 0) onEvents(batch);
            batch = [];
            lastId = null;
            onReset?.();
            data = [];
            id = null;
            type = null;
          } else if (line === "") {
            if (data.length > 0 && id !== null && /^[0-9]+$/.test(id)) {
              const n = BigInt(id);
              if (lastId === null || n > lastId) {
                lastId = n;
                const event = JSON.parse(data.join("\n"));
                batch.push(event);
                if (event.runId === null && event.type.startsWith("task.") && isTerminal(event.data?.status))
                  closed = true;
              }
            }
            data = [];
            id = null;
            type = null;
          } else if (line.startsWith("data:")) data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
          else if (line.startsWith("id:")) id = line.slice(3).trim();
          else if (line.startsWith("event:")) type = line.slice(6).trim();
        }
        if (batch.length > 0) onEvents(batch);
      }
      if (closed || (await isFinished())) return onState("ended");
    } catch {
      if (signal.aborted) return;
      failures++;
    }
    if (closed) return onState("ended");
    onState("reconnecting");
    await sleep(Math.max(Math.min(500 * 2 ** failures, 5000), waitAtLeast), signal);
  }
}
