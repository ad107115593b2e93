// Following a task whose stream ended without its closing event: the rest comes from the task's log
// (GET …/logs, page by page) — and Ctrl-C stops that at once too, not after a page's 30 s timeout
// (a 100,000-run task's log is hundreds of pages).
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { ApiClient } from "../../src/client/http.ts";
import { taskEvents } from "../../src/client/sse.ts";
import type { TaskEvent } from "../../src/http/api-types.ts";
import { within } from "../helpers/client.ts";
import { waitFor } from "../helpers/queue.ts";

const event = (id: string, type: string, runId: string | null = null): TaskEvent => ({
  id,
  taskId: "100000042",
  runId,
  type,
  data: {},
  createdAt: "2026-12-01T00:00:00.000Z",
});

test("Ctrl-C while the rest of a finished task's log is read stops following at once", async () => {
  let logRequests = 0;
  const hanging = new Set<http.ServerResponse>();
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://x");
    if (url.pathname.endsWith("/events")) {
      // One event, then a clean end without the task's closing event.
      res.writeHead(200, { "content-type": "text/event-stream" });
      const e = event("999999999999", "task.queued");
      res.end(`id: ${e.id}\nevent: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`);
    } else if (url.pathname.endsWith("/logs")) {
      // The rest of the log: a server that is slow to answer (it never does here).
      logRequests++;
      hanging.add(res);
    } else {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ data: { taskId: "100000042", status: "succeeded" } }));
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const client = new ApiClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, "t0ken");
  const ctrlC = new AbortController();
  const seen: string[] = [];
  try {
    const following = (async () => {
      for await (const e of taskEvents(client, "100000042", { signal: ctrlC.signal })) seen.push(e.id);
    })();
    await waitFor(async () => logRequests > 0, 10_000, "the client to read the rest of the log");
    ctrlC.abort();
    await within(following, 5_000, "following to stop after Ctrl-C");
    assert.deepEqual(seen, ["999999999999"]);
  } finally {
    for (const res of hanging) res.destroy();
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

test("the rest of a finished task's log from a cursor the log does not know (a restore): read from the start, told as a reset", async () => {
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://x");
    if (url.pathname.endsWith("/events")) {
      // A clean end without the closing event.
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end();
    } else if (url.pathname.endsWith("/logs")) {
      res.writeHead(url.searchParams.has("after") ? 400 : 200, { "content-type": "application/json" });
      res.end(
        url.searchParams.has("after")
          ? JSON.stringify({
              code: "VALIDATION_FAILED",
              message: "after must be the id of one of this task's events, and 999999999999 is none",
            })
          : JSON.stringify({
              code: "OK",
              data: { items: [event("57", "task.queued"), event("58", "task.succeeded")], nextCursor: null },
            }),
      );
    } else {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ data: { taskId: "100000042", status: "succeeded" } }));
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const client = new ApiClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, "t0ken");
  const states: string[] = [];
  const seen: string[] = [];
  try {
    for await (const e of taskEvents(client, "100000042", {
      signal: AbortSignal.timeout(10_000),
      after: "999999999999",
      onState: (state) => states.push(state),
    }))
      seen.push(e.id);
    assert.deepEqual(states, ["reset"]);
    assert.deepEqual(seen, ["57", "58"]);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});
