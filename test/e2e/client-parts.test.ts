// The client's pure parts, without an Assay server: the SSE parser, resuming a stream that breaks off
// mid-frame (against a tiny HTTP server of the test's own), the task tracker, parameters typed by a
// schema, output folder names and exit codes.
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { folderFromLabel, folderNames, safeSegment } from "../../src/client/download.ts";
import {
  ClientUsageError,
  exitCodeOf,
  Interrupted,
  ServerProblem,
  TaskStateError,
} from "../../src/client/exit.ts";
import { ApiClient, ApiRequestError, ConnectionError } from "../../src/client/http.ts";
import { serverName } from "../../src/client/inputs.ts";
import { shown } from "../../src/client/output.ts";
import { type JsonSchema, paramProblems, parseParams } from "../../src/client/params.ts";
import { TaskTracker } from "../../src/client/progress.ts";
import { SseParser, taskEvents } from "../../src/client/sse.ts";
import type { TaskEvent } from "../../src/http/api-types.ts";

test("the SSE parser joins frames split anywhere, with LF, CRLF or CR, and skips comments", () => {
  const text =
    ': keep-alive\r\nid: 9\r\nevent: run.progress\r\ndata: {"a":\r\ndata: 1}\r\n\r\nid:10\rdata:x\r\rid: 11\ndata: y\n\n';
  for (let cut = 0; cut <= text.length; cut++) {
    const p = new SseParser();
    const frames = [...p.feed(text.slice(0, cut)), ...p.feed(text.slice(cut))];
    assert.deepEqual(
      frames,
      [
        { id: "9", event: "run.progress", data: '{"a":\n1}' },
        { id: "10", event: null, data: "x" },
        { id: "11", event: null, data: "y" },
      ],
      `cut at ${cut}`,
    );
  }
});

const event = (
  id: string,
  type: string,
  runId: string | null = "5",
  data: Record<string, unknown> = {},
): TaskEvent => ({
  id,
  taskId: "1",
  runId,
  type,
  data,
  createdAt: "2026-12-01T00:00:00.000Z",
});
const frame = (e: TaskEvent) => `id: ${e.id}\nevent: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`;

test("a stream that breaks off mid-frame resumes with Last-Event-ID; repeats are dropped by numeric id", async () => {
  // Ids cross a digit boundary and 2^53: compared as strings or Numbers they would go wrong.
  const ids = ["9", "10", "9007199254740993", "9007199254740995"];
  const events = [
    event(ids[0] as string, "task.queued", null),
    event(ids[1] as string, "run.running"),
    event(ids[2] as string, "run.succeeded", "5", { status: "succeeded" }),
    event(ids[3] as string, "task.succeeded", null, { status: "succeeded" }),
  ];
  const seen: (string | undefined)[] = [];
  const server = http.createServer((req, res) => {
    seen.push(req.headers["last-event-id"] as string | undefined);
    res.writeHead(200, { "content-type": "text/event-stream" });
    if (seen.length === 1) {
      // Two whole events and half of the third, then the connection dies.
      res.write(
        frame(events[0] as TaskEvent) +
          frame(events[1] as TaskEvent) +
          frame(events[2] as TaskEvent).slice(0, 20),
      );
      setTimeout(() => res.destroy(), 50);
    } else {
      // The server repeats what the client has (as if it had resumed from an older id), then the rest.
      res.end(events.map(frame).join(""));
    }
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  try {
    const c = new ApiClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, "assay_test");
    const states: string[] = [];
    const got: string[] = [];
    for await (const e of taskEvents(c, "1", {
      signal: new AbortController().signal,
      onState: (s) => states.push(s),
    })) {
      got.push(e.id);
    }
    assert.deepEqual(got, ids, "every event once, in order, up to the closing event");
    assert.deepEqual(seen, [undefined, "10"], "the second connection resumed after the last whole event");
    assert.deepEqual(states, ["reconnecting", "live"]);
  } finally {
    server.close();
  }
});

test("a 401 or 404 from the stream ends following with the API's error; no server is a ConnectionError in time", async () => {
  const server = http.createServer((_req, res) => {
    res.writeHead(404, { "content-type": "application/json" });
    res.end('{"code":"ANALYSIS_TASK_NOT_FOUND","message":"The analysis task does not exist."}');
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  try {
    const c = new ApiClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, "assay_test");
    await assert.rejects(
      (async () => {
        for await (const _ of taskEvents(c, "1", { signal: new AbortController().signal })) void _;
      })(),
      (err: unknown) => err instanceof ApiRequestError && err.code === "ANALYSIS_TASK_NOT_FOUND",
    );
  } finally {
    server.close();
  }
  const nobody = new ApiClient("http://127.0.0.1:9", "assay_test");
  await assert.rejects(
    (async () => {
      for await (const _ of taskEvents(nobody, "1", { signal: new AbortController().signal, giveUpMs: 300 }))
        void _;
    })(),
    (err: unknown) => err instanceof ConnectionError && /gave up following task 1/.test(err.message),
  );
});

test("the tracker counts each run's outcome once, retries as queued again, and the task's total", () => {
  const t = new TaskTracker("1", 0, [
    { runId: "5", fileName: "a.csv" },
    { runId: "6", fileName: "b.csv" },
  ]);
  t.apply(event("1", "task.queued", null, { status: "queued", totalCount: 2 }));
  t.apply(event("2", "run.running", "5", { attempt: 1 }));
  t.apply(event("3", "run.progress", "5", { percent: 40, message: "reading" }));
  assert.deepEqual(
    t.running.map((r) => [r.name, r.percent, r.message]),
    [["a.csv", 40, "reading"]],
  );
  const retry = t.apply(
    event("4", "run.retry", "5", { attempt: 1, errorCode: "ANALYSIS_DEPENDENCY_FAILED" }),
  );
  assert.equal(retry.kind === "run" && retry.retried, true);
  assert.equal(t.runs.get("5")?.status, "queued");
  t.apply(event("5", "run.succeeded", "5", { attempt: 2 }));
  t.apply(event("6", "run.failed", "6", { attempt: 1, errorCode: "ANALYSIS_DATA_INVALID" }));
  t.apply(event("7", "run.failed", "6", { attempt: 1, errorCode: "ANALYSIS_DATA_INVALID" }));
  t.apply(event("8", "task.partially_succeeded", null, { status: "partially_succeeded" }));
  assert.deepEqual(t.counts, { succeeded: 1, failed: 1, timed_out: 0, cancelled: 0 });
  assert.equal(t.total, 2);
  assert.equal(t.done, 2);
  assert.equal(t.status, "partially_succeeded");
});

test("a cancel's queued runs end with its task.cancelling event: counted once, live runs untouched", () => {
  // Runs 5 and 7 queued, 6 claimed (no event yet), 8 ended before the cancel.
  const t = new TaskTracker(
    "1",
    4,
    ["5", "6", "7", "8"].map((runId) => ({ runId, fileName: `${runId}.csv` })),
  );
  t.apply(event("1", "task.queued", null, { status: "queued", totalCount: 4 }));
  t.apply(event("2", "run.failed", "8", { attempt: 1, errorCode: "ANALYSIS_DATA_INVALID" }));
  // The cancel's events, as it writes them: the live runs' first, then the task's with the count.
  t.apply(event("3", "run.cancelling", "6", { status: "cancelling", attempt: 1 }));
  const bulk = t.apply(event("4", "task.cancelling", null, { status: "cancelling", cancelledQueued: 2 }));
  assert.deepEqual(bulk, { kind: "task", status: "cancelling", cancelledQueued: 2 });
  assert.deepEqual(
    [...t.runs.values()].map((r) => [r.runId, r.status]),
    [
      ["5", "cancelled"],
      ["6", "cancelling"],
      ["7", "cancelled"],
      ["8", "failed"],
    ],
  );
  assert.equal(t.runs.get("5")?.errorCode, "ANALYSIS_PROCESS_CANCELLED");
  const last = t.apply(
    event("5", "run.cancelled", "6", { attempt: 1, errorCode: "ANALYSIS_PROCESS_CANCELLED" }),
  );
  assert.equal(last.kind === "run" && last.ended, true);
  t.apply(event("6", "task.cancelled", null, { status: "cancelled" }));
  assert.deepEqual(t.counts, { succeeded: 0, failed: 1, timed_out: 0, cancelled: 3 });
  assert.equal(t.done, t.total);
  // A task.cancelling without the count (a log written before it existed) changes no run.
  const old = new TaskTracker("2", 1, [{ runId: "9", fileName: "x" }]);
  assert.deepEqual(old.apply(event("7", "task.cancelling", null, { status: "cancelling" })), {
    kind: "task",
    status: "cancelling",
    cancelledQueued: 0,
  });
  assert.equal(old.runs.get("9")?.status, "queued");
});

const STATS: JsonSchema = {
  type: "object",
  required: ["method"],
  properties: {
    method: { anyOf: [{ const: "mean" }, { const: "median" }] },
    columns: { type: "array", items: { type: "string", minLength: 1 } },
    bins: { type: "integer" },
    log: { type: "boolean" },
    options: { type: "object" },
  },
};

test("--param values are typed by the schema and checked against it", async () => {
  assert.deepEqual(
    parseParams(
      ["method=median", "columns=a,b", "columns=c", "bins=12", "log=true", 'options={"k":1}'],
      STATS,
      "python-stats",
    ),
    { method: "median", columns: ["a,b", "c"], bins: 12, log: true, options: { k: 1 } },
  );
  assert.deepEqual(parseParams(['columns=["x","y"]', "method=mean"], STATS, "t"), {
    columns: ["x", "y"],
    method: "mean",
  });
  assert.throws(() => parseParams(["bins=many"], STATS, "t"), ClientUsageError);
  assert.throws(() => parseParams(["method=mean", "method=median"], STATS, "t"), /given twice/);
  assert.throws(() => parseParams(["__proto__=1"], STATS, "t"), /has no parameter __proto__/);
  assert.deepEqual(await paramProblems({ method: "mean" }, STATS), []);
  assert.deepEqual(await paramProblems({}, STATS), [
    "missing parameter method (required): one of mean, median",
  ]);
  assert.deepEqual(await paramProblems({ method: "mode" }, STATS), [
    'method must be one of mean, median, not "mode"',
  ]);
  assert.match((await paramProblems({ method: "mean", columns: [""] }, STATS))[0] ?? "", /^columns\/0 /);
});

test("folder names: one safe path segment each, repeats and results.csv made unique", () => {
  assert.equal(safeSegment("../../etc/passwd"), "__.._etc_passwd");
  assert.equal(safeSegment("a\u0000b\nc.csv"), "abc.csv");
  assert.equal(safeSegment("..."), "_");
  assert.deepEqual(
    [
      ...folderNames([
        { runId: "10", fileName: "a.csv" },
        { runId: "11", fileName: "a.csv" },
        { runId: "12", fileName: "results.csv" },
        { runId: "13", fileName: "b.csv" },
      ]).values(),
    ],
    ["a.csv (run 10)", "a.csv (run 11)", "results.csv (run 12)", "b.csv"],
  );
  assert.equal(folderFromLabel("sub/dir/x.csv", "1"), "sub/dir/x.csv");
  assert.equal(folderFromLabel("results.csv", "7"), "results.csv (run 7)");
  assert.equal(folderFromLabel("results.csv/x.csv", "7"), "results.csv (folder)/x.csv");
  assert.equal(serverName('dir/a "b"\u0007.csv'), "a %22b%22.csv");
  assert.equal(shown("evil\u001b[2J\u202e.csv"), "evil?[2J?.csv");
});

test("exit codes: 2 usage, 3 server, 1 task state, 130 Ctrl-C", () => {
  assert.equal(exitCodeOf(new ClientUsageError("x")), 2);
  assert.equal(exitCodeOf(new ApiRequestError(400, "VALIDATION_FAILED", "x")), 2);
  assert.equal(exitCodeOf(new ApiRequestError(404, "ANALYSIS_TASK_NOT_FOUND", "x")), 2);
  assert.equal(exitCodeOf(new ApiRequestError(401, "UNAUTHORIZED", "x")), 3);
  assert.equal(exitCodeOf(new ApiRequestError(503, "NOT_READY", "x")), 3);
  assert.equal(exitCodeOf(new ConnectionError("x")), 3);
  assert.equal(exitCodeOf(new ServerProblem("x")), 3);
  assert.equal(exitCodeOf(new TaskStateError("x")), 1);
  assert.equal(exitCodeOf(new Interrupted("x")), 130);
  assert.equal(exitCodeOf(Object.assign(new Error("x"), { code: "EACCES" })), 2);
});
