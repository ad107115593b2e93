// The client's pure parts, without an Assay server: the SSE parser, resuming a stream that breaks off
// mid-frame (against a tiny HTTP server of the test's own), the task tracker, parameters typed by a
// schema, output folder names and exit codes.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import {
  downloadOutputs,
  folderFromLabel,
  folderNames,
  foldersFromLabels,
  safeSegment,
} from "../../src/client/download.ts";
import {
  ClientUsageError,
  exitCodeOf,
  Interrupted,
  OutputClosed,
  ServerProblem,
  TaskStateError,
} from "../../src/client/exit.ts";
import { ApiClient, ApiRequestError, ConnectionError } from "../../src/client/http.ts";
import { hashFile, serverName } from "../../src/client/inputs.ts";
import { shown } from "../../src/client/output.ts";
import { type JsonSchema, paramProblems, parseParams } from "../../src/client/params.ts";
import { TaskTracker } from "../../src/client/progress.ts";
import { SseParser, taskEvents } from "../../src/client/sse.ts";
import { uploadFile } from "../../src/client/upload.ts";
import type { Run, TaskEvent } from "../../src/http/api-types.ts";
import { cleanEnv, collect, ROOT, spawnCli } from "../helpers/cli.ts";

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

/** Follows task 1 on `server` to its end: the ids delivered and the states said, in order. */
async function followAll(server: http.Server): Promise<{ got: string[]; states: string[] }> {
  const c = new ApiClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, "assay_test");
  const states: string[] = [];
  const got: string[] = [];
  for await (const e of taskEvents(c, "1", {
    signal: new AbortController().signal,
    onState: (s) => states.push(s),
  }))
    got.push(e.id);
  return { got, states };
}

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
    const { got, states } = await followAll(server);
    assert.deepEqual(got, ids, "every event once, in order, up to the closing event");
    assert.deepEqual(seen, [undefined, "10"], "the second connection resumed after the last whole event");
    assert.deepEqual(states, ["reconnecting", "live"]);
  } finally {
    server.close();
  }
});

test("a 429 from the stream (too many of the user's streams on the server) is asked again, after its Retry-After", async () => {
  const closing = event("12", "task.succeeded", null, { status: "succeeded" });
  let asked = 0;
  const at: number[] = [];
  const server = http.createServer((_req, res) => {
    asked++;
    at.push(performance.now());
    if (asked === 1) {
      res.writeHead(429, { "content-type": "application/json", "retry-after": "1" });
      res.end('{"code":"TOO_MANY_STREAMS","message":"You have too many event streams open on this server."}');
    } else {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(frame(closing));
    }
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  try {
    const { got, states } = await followAll(server);
    assert.deepEqual(got, ["12"]);
    assert.equal(asked, 2);
    // Not before its Retry-After (the first retry's backoff alone is ~250 ms).
    assert.ok((at[1] ?? 0) - (at[0] ?? 0) >= 950, `asked again after ${(at[1] ?? 0) - (at[0] ?? 0)} ms`);
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
  assert.equal(safeSegment("a\u0000b\nc.csv"), "a_b_c.csv");
  assert.equal(safeSegment("..."), "_");
  // Windows-safe (the rules are src/files/folder-names.ts's, tested in test/unit/folder-names.test.ts).
  assert.equal(safeSegment('a:b<c>"d|e?f*.csv'), "a_b_c__d_e_f_.csv");
  assert.equal(safeSegment("x. "), "x__");
  assert.equal(safeSegment("CON.csv"), "_CON.csv");
  assert.deepEqual(
    [
      ...folderNames([
        { runId: "10", fileName: "a.csv" },
        { runId: "11", fileName: "a.csv" },
        { runId: "12", fileName: "results.csv" },
        { runId: "13", fileName: "b.csv" },
        { runId: "14", fileName: "a:b.csv" },
        { runId: "15", fileName: "a_b.csv" },
        { runId: "16", fileName: "nul.csv" },
      ]).values(),
    ],
    [
      "a.csv (run 10)",
      "a.csv (run 11)",
      "results.csv (run 12)",
      "b.csv",
      "a_b.csv (run 14)",
      "a_b.csv (run 15)",
      "_nul.csv",
    ],
  );
  assert.equal(folderFromLabel("sub/dir/x.csv", "1"), "sub/dir/x.csv");
  assert.equal(folderFromLabel("results.csv", "7"), "results.csv (run 7)");
  assert.equal(folderFromLabel("results.csv/x.csv", "7"), "results.csv (folder)/x.csv");
  assert.equal(serverName('dir/a "b"\u0007.csv'), 'a "b".csv');
  assert.equal(shown("evil\u001b[2J\u202e.csv"), "evil⟨U+001B⟩[2J⟨U+202E⟩.csv");
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
  assert.equal(exitCodeOf(new OutputClosed("x")), 141);
  assert.equal(exitCodeOf(Object.assign(new Error("x"), { code: "EACCES" })), 2);
});

test("folder names that one file system would take for one folder are made distinct", () => {
  // Labels that differ only in what safeSegment replaces, in case, or in normalization (é composed,
  // and e + combining acute as macOS stores it); a control character is replaced, not dropped, so
  // "ab.csv" keeps its own folder.
  const labels = [
    ["20", "a\tb.csv"],
    ["21", "ab.csv"],
    ["22", "a\\b.csv"],
    ["23", "a_b.csv"],
    ["24", "Données.csv"],
    ["25", "données.csv"],
    ["26", "caf\u00e9/x.csv"],
    ["27", "cafe\u0301/x.csv"],
    ["28", "RESULTS.CSV"],
    ["29", "unique ✓.csv"],
    ["30", "a:b.csv"],
    ["31", "x."],
    ["32", "x_"],
    ["33", "con.csv"],
  ].map(([runId, label]) => ({ runId: runId as string, label: label as string }));
  const folders = foldersFromLabels(labels);
  assert.deepEqual(
    [...folders.values()],
    [
      "a_b.csv (run 20)",
      "ab.csv",
      "a_b.csv (run 22)",
      "a_b.csv (run 23)",
      "Données.csv (run 24)",
      "données.csv (run 25)",
      "caf\u00e9/x.csv (run 26)",
      "cafe\u0301/x.csv (run 27)",
      "RESULTS.CSV (run 28)",
      "unique ✓.csv",
      "a_b.csv (run 30)",
      "x_ (run 31)",
      "x_ (run 32)",
      "_con.csv",
    ],
  );
  const keys = [...folders.values()].map((f) => f.normalize("NFC").toLowerCase());
  assert.equal(new Set([...keys, "results.csv"]).size, labels.length + 1, "no two alike, none results.csv");
  // A label that is literally another's suffixed name gets a folder of its own, made unique as the
  // zip makes it (until 2026-12-07 "x.csv (run 5) (2)": submit --out and the zip differed).
  assert.deepEqual(
    [
      ...foldersFromLabels([
        { runId: "5", label: "x.csv" },
        { runId: "6", label: "X.csv" },
        { runId: "7", label: "x.csv (run 5)" },
      ]).values(),
    ],
    ["x.csv (run 5)", "X.csv (run 6)", "x.csv (run 5) (run 7)"],
  );
  // Alone too: a label ending like " (run <id>)" is never left as it is (another task's run 5 could
  // be the same folder's).
  assert.deepEqual(
    [...foldersFromLabels([{ runId: "9", label: "y (run 5)" }]).values()],
    ["y (run 5) (run 9)"],
  );
  // The same as the zip's (folderNames, from the names the server stores) for names alone.
  const alike = [
    { runId: "5", label: "x.csv", fileName: "x.csv" },
    { runId: "6", label: "X.csv", fileName: "X.csv" },
    { runId: "7", label: "x.csv (run 5)", fileName: "x.csv (run 5)" },
    { runId: "8", label: "results.csv", fileName: "results.csv" },
  ];
  assert.deepEqual([...foldersFromLabels(alike).values()], [...folderNames(alike).values()]);
  // assay download: the server's names, folded the same way.
  assert.deepEqual(
    [
      ...folderNames([
        { runId: "10", fileName: "Report.csv" },
        { runId: "11", fileName: "report.csv" },
        { runId: "12", fileName: "Results.CSV" },
      ]).values(),
    ],
    ["Report.csv (run 10)", "report.csv (run 11)", "Results.CSV (run 12)"],
  );
  // A name that ends like a suffixed one gets its own suffix, as the zip gives it.
  assert.deepEqual(
    [
      ...folderNames([
        { runId: "12", fileName: "same.csv" },
        { runId: "13", fileName: "same.csv" },
        { runId: "14", fileName: "same.csv (run 12)" },
      ]).values(),
    ],
    ["same.csv (run 12)", "same.csv (run 13)", "same.csv (run 12) (run 14)"],
  );
});

// ---- uploads and downloads against a tiny server of the test's own ----------------------------

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "assay-client-parts-"));
after(() => fs.rmSync(scratch, { recursive: true, force: true }));

async function tinyServer(handler: http.RequestListener): Promise<{ c: ApiClient; close: () => void }> {
  const server = http.createServer(handler);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    c: new ApiClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, "assay_test"),
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

/** Rejects with a message when `p` has not settled within `ms` (the bug here is a hang). */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: still waiting after ${ms} ms`)), ms);
    }),
  ]);
}

/** Answers an upload the way the API does once the whole body has arrived. */
const acceptUpload: http.RequestListener = (req, res) => {
  let n = 0;
  req.on("data", (c: Buffer) => {
    n += c.length;
  });
  req.on("end", () => {
    res.writeHead(201, { "content-type": "application/json" });
    res.end(JSON.stringify({ data: { fileId: "1000001", name: "x", sizeBytes: n, sha256: "?" } }));
  });
};

test("a file that shrinks or grows between hashing and upload fails at once with exit 2, not a hang", async () => {
  const { c, close } = await tinyServer(acceptUpload);
  const uploader = await c.uploader(2);
  try {
    // Small files are read whole, large ones streamed: both paths.
    for (const [size, change] of [
      [10_000, "shrink"],
      [10_000, "grow"],
      [3 * 1024 * 1024, "shrink"],
      [3 * 1024 * 1024, "grow"],
    ] as const) {
      const file = path.join(scratch, `mesures ${change} ${size} — été.csv`);
      fs.writeFileSync(file, Buffer.alloc(size, "1,2,3\n"));
      const input = { path: file, label: `relevés/${path.basename(file)}`, ...(await hashFile(file)) };
      if (change === "shrink") fs.truncateSync(file, Math.floor(size / 2));
      else fs.appendFileSync(file, "4,5,6\n");
      let counted = 0;
      await assert.rejects(
        within(
          uploadFile(uploader, input, new AbortController().signal, (n) => {
            counted += n;
          }),
          2000,
          `upload of a file that did ${change}`,
        ),
        (err: unknown) =>
          err instanceof ClientUsageError &&
          err.message === `${input.label} changed while it was uploaded` &&
          exitCodeOf(err) === 2,
      );
      assert.equal(counted, 0, "the bytes counted for the failed upload are taken back");
    }
  } finally {
    uploader.close();
    close();
  }
});

test("an upload the server takes but never answers is given up after the idle timeout", async () => {
  const { c, close } = await tinyServer((req) => req.resume());
  const uploader = await c.uploader(1, 300);
  const file = path.join(scratch, "données sans réponse.csv");
  fs.writeFileSync(file, "id,value\n1,2\n");
  const input = { path: file, label: "données sans réponse.csv", ...(await hashFile(file)) };
  const t0 = performance.now();
  try {
    await assert.rejects(
      within(
        uploadFile(uploader, input, new AbortController().signal, () => {}),
        3000,
        "silent server",
      ),
      (err: unknown) => err instanceof ConnectionError && /for 0\.3 s/.test(err.message),
    );
    assert.ok(performance.now() - t0 < 2000);
  } finally {
    uploader.close();
    close();
  }
});

const outputsRoute = /^\/api\/analysis-tasks\/7\/runs\/70\/outputs$/;
const run70 = { runId: "70", fileName: "entrée ✓.csv" } as Run;

/** Every file under `dir`, relative. */
const filesUnder = (dir: string) =>
  fs.existsSync(dir)
    ? (fs.readdirSync(dir, { recursive: true }) as string[]).filter((p) =>
        fs.statSync(path.join(dir, p)).isFile(),
      )
    : [];

test("a download shorter than its listed size fails and leaves no file under its name, nor a temporary one", async () => {
  const { c, close } = await tinyServer((req, res) => {
    if (outputsRoute.test(req.url ?? "")) {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ data: { items: [{ name: "résumé.json", sizeBytes: 10 }] } }));
    } else {
      res.writeHead(200, { "content-type": "application/json" });
      res.end("12345");
    }
  });
  const out = path.join(scratch, "court");
  try {
    await assert.rejects(
      downloadOutputs(c, "7", [{ run: run70, folder: "entrée ✓.csv" }], out, {
        concurrency: 2,
        signal: new AbortController().signal,
      }),
      (err: unknown) => err instanceof ConnectionError && /received 5 of 10 bytes/.test(err.message),
    );
    assert.deepEqual(filesUnder(out), [], "neither résumé.json nor a .partial-* file");
  } finally {
    close();
  }
});

test("a download that stalls mid-body is given up after the idle timeout and removed", async () => {
  const { c, close } = await tinyServer((req, res) => {
    if (outputsRoute.test(req.url ?? "")) {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ data: { items: [{ name: "gros fichier.csv", sizeBytes: 1000 }] } }));
    } else {
      // Half the body, then silence with the connection open.
      res.writeHead(200, { "content-type": "text/csv", "content-length": "1000" });
      res.write(Buffer.alloc(500, "x"));
    }
  });
  const out = path.join(scratch, "bloqué");
  try {
    await assert.rejects(
      within(
        downloadOutputs(c, "7", [{ run: run70, folder: "entrée ✓.csv" }], out, {
          concurrency: 1,
          signal: new AbortController().signal,
          idleMs: 300,
        }),
        3000,
        "stalled download",
      ),
      (err: unknown) => err instanceof ConnectionError && /nothing received .* for 0\.3 s/.test(err.message),
    );
    assert.deepEqual(filesUnder(out), []);
  } finally {
    close();
  }
});

test("a reader that closes the pipe early stops the client quietly with 141, not a crash with exit 1", async () => {
  // A task that never ends and prints an event every few milliseconds: `assay follow 1 | head -1`.
  let id = 10;
  const { c, close } = await tinyServer((req, res) => {
    if (req.url === "/api/analysis-tasks/1") {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ data: { taskId: "1", status: "running", totalCount: 1 } }));
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    const timer = setInterval(() => {
      id++;
      const e = {
        id: String(id),
        taskId: "1",
        runId: "5",
        type: "run.progress",
        data: { percent: id % 100, message: "lecture de « données » ✓" },
        createdAt: "2026-12-01T00:00:00.000Z",
      };
      res.write(`id: ${id}\nevent: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`);
    }, 2);
    res.on("close", () => clearInterval(timer));
  });
  try {
    const child = spawnCli(["follow", "1"], cleanEnv({ ASSAY_URL: c.shownUrl, ASSAY_TOKEN: "assay_test" }));
    const done = collect(child);
    // The first line, then the reader goes away as `head -1` does.
    await new Promise<void>((resolve) => {
      let text = "";
      const onData = (chunk: Buffer) => {
        text += chunk.toString();
        if (!text.includes("\n")) return;
        child.stdout?.off("data", onData);
        child.stdout?.destroy();
        resolve();
      };
      child.stdout?.on("data", onData);
    });
    const r = await within(done, 10_000, "the client after its reader went away");
    assert.doesNotMatch(r.stderr, /Unhandled 'error' event|EPIPE|\n\s+at /, r.stderr);
    assert.equal(r.code, 141, r.stderr);
  } finally {
    close();
  }
});

test("a process that exits mid-download (a second Ctrl-C) leaves no temporary file behind", async () => {
  const { c, close } = await tinyServer((req, res) => {
    if (outputsRoute.test(req.url ?? "")) {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ data: { items: [{ name: "à moitié.csv", sizeBytes: 1000 }] } }));
    } else {
      res.writeHead(200, { "content-type": "text/csv", "content-length": "1000" });
      res.write(Buffer.alloc(500, "x"));
    }
  });
  const out = path.join(scratch, "interrompu");
  // The download in a process of its own that, once the temporary file exists, exits the way the
  // second Ctrl-C does: process.exit, no catch or finally run.
  const script = `
    import fs from "node:fs";
    import { downloadOutputs } from ${JSON.stringify(path.join(ROOT, "src/client/download.ts"))};
    import { ApiClient } from ${JSON.stringify(path.join(ROOT, "src/client/http.ts"))};
    const out = ${JSON.stringify(out)};
    downloadOutputs(new ApiClient(${JSON.stringify(c.shownUrl)}, "assay_test"), "7",
      [{ run: { runId: "70", fileName: "x" }, folder: "entrée ✓.csv" }], out,
      { concurrency: 1, signal: new AbortController().signal });
    const dir = out + "/entrée ✓.csv";
    const poll = setInterval(() => {
      const names = fs.existsSync(dir) ? fs.readdirSync(dir) : [];
      if (names.some((n) => n.includes(".partial-") && fs.statSync(dir + "/" + n).size > 0)) {
        console.log("partial:", names.join(","));
        process.exit(130);
      }
    }, 5);`;
  try {
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    const r = await within(collect(child), 10_000, "the downloading process");
    assert.equal(r.code, 130, r.stderr);
    assert.match(r.stdout, /partial: à moitié\.csv\.partial-\d+-[0-9a-f]+/, "it did exit mid-download");
    assert.deepEqual(filesUnder(out), []);
  } finally {
    close();
  }
});

test("Ctrl-C stops a small command waiting on a silent server at once, not after its 30 s timeout", async () => {
  let asked = () => {};
  // Takes every request and never answers.
  const { c, close } = await tinyServer(() => asked());
  try {
    for (const args of [["status", "100000042"], ["types"]]) {
      const reached = new Promise<void>((r) => {
        asked = r;
      });
      const child = spawnCli(args, cleanEnv({ ASSAY_URL: c.shownUrl, ASSAY_TOKEN: "assay_test" }));
      const done = collect(child);
      await reached;
      const t0 = performance.now();
      child.kill("SIGINT");
      const r = await within(done, 5000, `assay ${args.join(" ")} after Ctrl-C`);
      assert.equal(r.code, 130, r.stderr);
      assert.ok(performance.now() - t0 < 3000);
    }
  } finally {
    close();
  }
});

test("a stream that ends while the API restarts is said lost once, without a GET's own retries or their 'gave up'", async () => {
  const events = [
    event("9", "task.queued", null),
    event("10", "run.succeeded", "5", { status: "succeeded" }),
    event("11", "task.succeeded", null, { status: "succeeded" }),
  ];
  let streams = 0;
  const server = http.createServer((req, res) => {
    const unavailable = () => {
      res.writeHead(503, { "content-type": "application/json" });
      res.end('{"code":"NOT_READY","message":"The server is shutting down."}');
    };
    // The task, asked when the stream ends without its closing event: the API is going away.
    if (req.url === "/api/analysis-tasks/1") return unavailable();
    streams++;
    // The first stream ends cleanly after one event; the next two are refused; the fourth has it all.
    if (streams === 2 || streams === 3) return unavailable();
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.end(streams === 1 ? frame(events[0] as TaskEvent) : events.map(frame).join(""));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const notes: string[] = [];
  const states: string[] = [];
  try {
    const c = new ApiClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, "assay_test", {
      onRetry: (n) => notes.push(n),
    });
    const got: string[] = [];
    await within(
      (async () => {
        for await (const e of taskEvents(c, "1", {
          signal: new AbortController().signal,
          onState: (s, detail) => states.push(`${s}: ${detail}`),
        }))
          got.push(e.id);
      })(),
      10_000,
      "the stream to its end",
    );
    assert.deepEqual(got, ["9", "10", "11"], "every event once");
    assert.deepEqual(notes, [], "no GET retries of its own inside the stream's loop");
    assert.equal(states.length, 2, states.join("\n"));
    assert.match(states[0] as string, /^reconnecting: /);
    assert.doesNotMatch(states[0] as string, /gave up/);
    assert.match(states[1] as string, /^live: /);
  } finally {
    server.close();
  }
});

/**
 * Runs `args` against a server that answers `json` for the JSON routes it knows and a slow endless
 * stream for anything else; its reader goes away at the first output. Asserts exit 141 and that the
 * task is said to have ended (succeeded), not to be still running.
 */
async function stoppedReadingEndedTask(args: string[], json: (url: string) => unknown): Promise<void> {
  let id = 10;
  const { c, close } = await tinyServer((req, res) => {
    const body = json(req.url ?? "");
    if (body !== undefined) {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ data: body }));
      return;
    }
    // A long log, sent slowly enough for the reader to go away in the middle of it.
    res.writeHead(200, { "content-type": "text/event-stream" });
    const timer = setInterval(() => {
      id++;
      res.write(frame(event(String(id), "run.progress", "5", { percent: id % 100 })));
    }, 2);
    res.on("close", () => clearInterval(timer));
  });
  try {
    const child = spawnCli(args, cleanEnv({ ASSAY_URL: c.shownUrl, ASSAY_TOKEN: "assay_test" }));
    const done = collect(child);
    await new Promise<void>((resolve) => {
      const onData = () => {
        child.stdout?.off("data", onData);
        child.stdout?.destroy();
        resolve();
      };
      child.stdout?.on("data", onData);
    });
    const r = await within(done, 10_000, "the client after its reader went away");
    assert.equal(r.code, 141, r.stderr);
    assert.doesNotMatch(r.stderr, /still running|assay cancel/, r.stderr);
    assert.match(r.stderr, /task 1 has ended \(succeeded\)/, r.stderr);
  } finally {
    close();
  }
}

test("stopping following a task that has ended (a closed pipe) does not say it is still running", async () => {
  await stoppedReadingEndedTask(["follow", "1"], (url) =>
    url === "/api/analysis-tasks/1" ? { taskId: "1", status: "succeeded", totalCount: 1 } : undefined,
  );
});

test("stopping logs --follow of a task that ended before it began says it has ended, from the log's pages", async () => {
  await stoppedReadingEndedTask(["logs", "1", "--follow"], (url) =>
    url.startsWith("/api/analysis-tasks/1/logs")
      ? {
          items: [
            event("7", "task.queued", null, { status: "queued", totalCount: 1 }),
            event("8", "run.succeeded", "5", { status: "succeeded" }),
            event("9", "task.succeeded", null, { status: "succeeded" }),
          ],
          nextCursor: null,
        }
      : undefined,
  );
});

test("files rm: ids found missing before another error are still said", async () => {
  const { c, close } = await tinyServer((req, res) => {
    const missing = req.url === "/api/files/1000000001";
    res.writeHead(missing ? 404 : 401, { "content-type": "application/json" });
    res.end(
      JSON.stringify(
        missing
          ? { code: "FILE_NOT_FOUND", message: "The file does not exist." }
          : { code: "UNAUTHORIZED", message: "The token is not valid." },
      ),
    );
  });
  try {
    const r = await collect(
      spawnCli(
        ["files", "rm", "1000000001", "1000000002"],
        cleanEnv({ ASSAY_URL: c.shownUrl, ASSAY_TOKEN: "assay_test" }),
      ),
    );
    assert.equal(r.code, 3, r.stderr);
    assert.match(r.stderr, /no file 1000000001 of yours \(FILE_NOT_FOUND\)/, r.stderr);
    assert.match(r.stderr, /UNAUTHORIZED/, r.stderr);
  } finally {
    close();
  }
});

test("a URL with a path the server has no routes under says the URL may be wrong", async () => {
  const { c, close } = await tinyServer((_req, res) => {
    res.writeHead(404, { "content-type": "application/json" });
    res.end('{"code":"NOT_FOUND","message":"No such route."}');
  });
  try {
    const r = await collect(
      spawnCli(["status", "8"], cleanEnv({ ASSAY_URL: `${c.shownUrl}/api`, ASSAY_TOKEN: "assay_test" })),
    );
    assert.equal(r.code, 2, r.stderr);
    assert.match(
      r.stderr,
      /No such route\. Is http:\/\/127\.0\.0\.1:\d+\/api the server's address\?/,
      r.stderr,
    );
    assert.match(r.stderr, /ASSAY_URL \(or --url\)/);
  } finally {
    close();
  }
});

test("Ctrl-C during assay download says the same command downloads the outputs again", async () => {
  let reached = () => {};
  const downloading = new Promise<void>((r) => {
    reached = r;
  });
  const json = (res: http.ServerResponse, data: unknown) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ data }));
  };
  const { c, close } = await tinyServer((req, res) => {
    const url = req.url ?? "";
    if (url === "/api/analysis-tasks/7")
      return json(res, { taskId: "7", status: "succeeded", totalCount: 1 });
    if (url.startsWith("/api/analysis-tasks/7/runs?")) return json(res, { items: [run70], nextCursor: null });
    if (outputsRoute.test(url)) return json(res, { items: [{ name: "out.csv", sizeBytes: 1000 }] });
    // The output itself: half of it, then nothing.
    res.writeHead(200, { "content-type": "text/csv", "content-length": "1000" });
    res.write(Buffer.alloc(500, "x"));
    reached();
  });
  const out = path.join(scratch, "interrupted download");
  try {
    const child = spawnCli(
      ["download", "7", "--out", out],
      cleanEnv({ ASSAY_URL: c.shownUrl, ASSAY_TOKEN: "assay_test" }),
    );
    const done = collect(child);
    await within(downloading, 10_000, "the download to start");
    child.kill("SIGINT");
    const r = await within(done, 10_000, "assay download after Ctrl-C");
    assert.equal(r.code, 130, r.stderr);
    assert.equal(
      r.stderr,
      `assay: download interrupted; the same command again (assay download 7 --out '${out}') downloads the outputs again\n`,
    );
  } finally {
    close();
  }
});
