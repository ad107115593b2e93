// The command-line client against a real `assay all` server running the real programs: a folder of
// CSVs with hostile names to a folder of results, re-submits that upload nothing, failing runs named,
// parameters refused before any upload, a wrong token, the small commands, and a start-up that loads
// nothing of the server. The client runs with stdout on a pipe, so it speaks JSON lines.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { ASSAY_BIN, cleanEnv, collect, ROOT } from "../helpers/cli.ts";
import {
  apiAll,
  apiGet,
  type ClientServer,
  client,
  csv,
  errorOf,
  jsonLines,
  type Line,
  ofKind,
  startClientServer,
  taskLog,
} from "../helpers/client.ts";

let server: ClientServer;
let token: string;
let work: string;

/**
 * The inputs: local path → rows, and the folder its outputs must land in under --out (every name
 * checked by hand here, not computed by the client's own code).
 */
const LONG = `${"long name ".repeat(20).trim()}.csv`;
const INPUTS: { file: string; rows: number; folder: string | ((runId: string) => string) }[] = [
  { file: "alpha.csv", rows: 10, folder: "alpha.csv" },
  { file: "données β.csv", rows: 11, folder: "données β.csv" },
  { file: "日本語データ.csv", rows: 12, folder: "日本語データ.csv" },
  { file: "emoji 🎉.csv", rows: 13, folder: "emoji 🎉.csv" },
  // Characters Windows refuses in a name become `_` (src/files/folder-names.ts).
  { file: "<img src=x onerror=alert(1)>.csv", rows: 14, folder: "_img src=x onerror=alert(1)_.csv" },
  { file: `quote " and ' apostrophe.csv`, rows: 15, folder: `quote _ and ' apostrophe.csv` },
  { file: "-rf.csv", rows: 16, folder: "-rf.csv" },
  { file: "--help.csv", rows: 17, folder: "--help.csv" },
  { file: "spaces   in name.csv", rows: 18, folder: "spaces   in name.csv" },
  { file: "results.csv", rows: 19, folder: (runId) => `results.csv (run ${runId})` },
  { file: "tab\there.csv", rows: 20, folder: "tab_here.csv" },
  { file: "back\\slash.csv", rows: 21, folder: "back_slash.csv" },
  { file: "percent%20name.csv", rows: 22, folder: "percent%20name.csv" },
  { file: "CAPS.CSV", rows: 23, folder: "CAPS.CSV" },
  { file: "a.b.c.csv", rows: 24, folder: "a.b.c.csv" },
  { file: LONG, rows: 25, folder: LONG },
  { file: "sub/nested.csv", rows: 26, folder: "sub/nested.csv" },
  { file: "sub/deeper/x.csv", rows: 27, folder: "sub/deeper/x.csv" },
  // The same bytes twice: two local files, two runs.
  { file: "dup-a.csv", rows: 28, folder: "dup-a.csv" },
  { file: "dup-b.csv", rows: 28, folder: "dup-b.csv" },
];
const HIDDEN = [".hidden.csv", ".cache/inside.csv"];

let inputDir: string;
let firstTask: { taskId: string; lines: Line[] };

function writeInputs(dir: string): void {
  for (const [i, input] of INPUTS.entries()) {
    const file = path.join(dir, input.file);
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, csv(input.rows, input.file.startsWith("dup-") ? 99 : i + 2));
  }
  for (const h of HIDDEN) {
    fs.mkdirSync(path.dirname(path.join(dir, h)), { recursive: true });
    fs.writeFileSync(path.join(dir, h), csv(5, 1000));
  }
}

const sha256 = (file: string) => createHash("sha256").update(fs.readFileSync(file)).digest("hex");

before(async () => {
  server = await startClientServer({ concurrency: 4 });
  token = await server.token("alice");
  work = fs.mkdtempSync(path.join(os.tmpdir(), "assay-client-test-"));
  inputDir = path.join(work, "inputs");
  writeInputs(inputDir);
});

after(async () => {
  await server.close();
  fs.rmSync(work, { recursive: true, force: true });
});

test("submit a directory of 20 CSVs with --follow --out: the outputs on disk are the runs' outputs", async () => {
  const out = path.join(work, "results");
  const r = await client(
    ["submit", "--type", "summary", inputDir, "--follow", "--out", out],
    server.env(token),
  );
  assert.equal(r.code, 0, r.stderr);
  const lines = jsonLines(r.stdout);
  const files = ofKind(lines, "file");
  assert.deepEqual(
    files.map((f) => f.path).sort(),
    INPUTS.map((i) => i.file).sort(),
    "hidden files are skipped",
  );
  assert.ok(files.every((f) => f.uploaded === true));
  for (const f of files) assert.equal(f.sha256, sha256(path.join(inputDir, f.path as string)));
  const [task] = ofKind(lines, "task");
  const taskId = task?.taskId as string;
  assert.match(taskId, /^[1-9][0-9]*$/);
  firstTask = { taskId, lines };
  const [summary] = ofKind(lines, "summary");
  assert.equal(summary?.status, "succeeded");
  assert.equal(summary?.succeededCount, 20);
  assert.deepEqual(summary?.failedRuns, []);

  // Every run's outputs, byte for byte, in the folder of its input file; nothing else on disk.
  const runs = await apiAll<{ runId: string; inputFileId: string; metrics: { rows: number } }>(
    server,
    token,
    `/api/analysis-tasks/${taskId}/runs`,
  );
  assert.equal(runs.length, 20, "one run per local file, the two with the same bytes included");
  const pathOf = new Map(files.map((f) => [f.fileId as string, f.path as string]));
  const expected = new Set<string>(["results.csv"]);
  for (const run of runs) {
    const input = INPUTS.find((i) => i.file === pathOf.get(run.inputFileId));
    assert.ok(input, `run ${run.runId} has a local input`);
    assert.equal(run.metrics.rows, input.rows);
    const folder = typeof input.folder === "string" ? input.folder : input.folder(run.runId);
    const outputs = await apiGet<{ items: { name: string }[] }>(
      server,
      token,
      `/api/analysis-tasks/${taskId}/runs/${run.runId}/outputs`,
    );
    assert.deepEqual(
      outputs.items.map((o) => o.name),
      ["summary.json"],
    );
    for (const o of outputs.items) {
      const res = await fetch(
        `${server.url}/api/analysis-tasks/${taskId}/runs/${run.runId}/outputs/${encodeURIComponent(o.name)}`,
        { headers: { authorization: `Bearer ${token}` } },
      );
      const onDisk = fs.readFileSync(path.join(out, folder, o.name));
      assert.deepEqual(onDisk, Buffer.from(await res.arrayBuffer()), `${folder}/${o.name}`);
      assert.equal(JSON.parse(onDisk.toString()).rows, input.rows);
      expected.add(`${folder}/${o.name}`);
    }
  }
  const onDisk = (fs.readdirSync(out, { recursive: true }) as string[]).filter((p) =>
    fs.statSync(path.join(out, p)).isFile(),
  );
  assert.deepEqual(onDisk.sort(), [...expected].sort());
  const results = await fetch(`${server.url}/api/analysis-tasks/${taskId}/results.csv`, {
    headers: { authorization: `Bearer ${token}` },
  });
  assert.equal(fs.readFileSync(path.join(out, "results.csv"), "utf8"), await results.text());
  // The log the client printed is the task's log.
  const events = ofKind(lines, "event").map(({ kind, ...e }) => e);
  assert.deepEqual(events, await taskLog(server, token, taskId));
});

test("a re-submit of the same folder uploads nothing and makes a task over the same files", async () => {
  assert.ok(firstTask, "runs after the first submit");
  const before = await apiAll<{ fileId: string }>(server, token, "/api/files");
  const r = await client(["submit", "--type", "summary", inputDir], server.env(token));
  assert.equal(r.code, 0, r.stderr);
  const lines = jsonLines(r.stdout);
  const [upload] = ofKind(lines, "upload");
  assert.deepEqual(
    { uploaded: upload?.uploaded, reused: upload?.reused, bytes: upload?.bytes },
    {
      uploaded: 0,
      reused: 20,
      bytes: 0,
    },
  );
  assert.ok(ofKind(lines, "file").every((f) => f.uploaded === false));
  assert.equal(ofKind(lines, "event").length, 0, "without --follow nothing is followed");
  const after = await apiAll<{ fileId: string }>(server, token, "/api/files");
  assert.equal(after.length, before.length, "no file was uploaded");
  const ids = (l: Line[]) =>
    ofKind(l, "file")
      .map((f) => `${f.path}→${f.fileId}`)
      .sort();
  assert.deepEqual(ids(lines), ids(firstTask.lines), "every local file maps to the copy it was uploaded as");
  const [task] = ofKind(lines, "task");
  assert.notEqual(task?.taskId, firstTask.taskId);

  // The same Idempotency-Key twice: one task.
  const key = ["submit", "--type", "summary", inputDir, "--idempotency-key", "nightly-2026-12-01"];
  const a = jsonLines((await client(key, server.env(token))).stdout);
  const b = jsonLines((await client(key, server.env(token))).stdout);
  assert.equal(ofKind(a, "task")[0]?.taskId, ofKind(b, "task")[0]?.taskId);
});

test("submit --out: inputs whose folders would coincide get one folder each, with their own outputs", async () => {
  // Names that are one folder after control characters, separators and characters Windows refuses
  // are replaced, or on a file system that folds case or normalization (macOS, Windows); "ab.csv" is
  // none of them, and "CON.csv", a Windows device name, becomes "_CON.csv".
  const dir = path.join(work, "collide");
  const rowsOf: Record<string, number> = {
    "a\tb.csv": 31,
    "ab.csv": 32,
    "a\\b.csv": 33,
    "a_b.csv": 34,
    "Relevé.csv": 35,
    "relevé.csv": 36,
    "caf\u00e9.csv": 37,
    "cafe\u0301.csv": 38,
    "a:b.csv": 39,
    "CON.csv": 40,
  };
  fs.mkdirSync(dir);
  for (const [name, rows] of Object.entries(rowsOf)) fs.writeFileSync(path.join(dir, name), csv(rows, rows));
  const out = path.join(work, "collide-out");
  const r = await client(["submit", "--type", "summary", dir, "--out", out], server.env(token));
  assert.equal(r.code, 0, r.stderr);
  const lines = jsonLines(r.stdout);
  const pathOf = new Map(ofKind(lines, "file").map((f) => [f.fileId as string, f.path as string]));
  const taskId = ofKind(lines, "task")[0]?.taskId as string;
  const runs = await apiAll<{ runId: string; inputFileId: string }>(
    server,
    token,
    `/api/analysis-tasks/${taskId}/runs`,
  );
  const downloads = ofKind(lines, "download");
  assert.equal(downloads.length, 10);
  const folders = downloads.map((d) => d.folder as string);
  assert.equal(
    new Set(folders.map((f) => f.normalize("NFC").toLowerCase())).size,
    10,
    `one folder per input on any file system: ${folders.join(" | ")}`,
  );
  for (const d of downloads) {
    const run = runs.find((x) => x.runId === d.runId);
    const local = pathOf.get(run?.inputFileId as string) as string;
    if (local === "ab.csv" || local === "CON.csv") assert.equal(d.folder, local.replace("CON", "_CON"));
    else assert.match(d.folder as string, new RegExp(` \\(run ${d.runId}\\)$`), `${local}: its run id`);
    const summary = JSON.parse(fs.readFileSync(path.join(out, d.folder as string, "summary.json"), "utf8"));
    assert.equal(summary.rows, rowsOf[local], `${d.folder} holds the outputs of ${JSON.stringify(local)}`);
  }
  assert.deepEqual(
    fs.readdirSync(out).filter((f) => f.includes(".partial-")),
    [],
    "no temporary file left behind",
  );
  assert.equal(fs.readdirSync(out).length, 11, "ten folders and results.csv");
});

test("a bad --idempotency-key exits 2 before anything is uploaded", async () => {
  const dave = await server.token("dave");
  for (const key of ["a b", "日本", "x".repeat(201), ""]) {
    const r = await client(
      ["submit", "--type", "summary", inputDir, "--idempotency-key", key],
      server.env(dave),
    );
    assert.equal(r.code, 2, `${JSON.stringify(key)}: ${r.stderr}`);
    assert.equal(ofKind(jsonLines(r.stdout), "error")[0]?.code, "USAGE");
    assert.match(r.stderr, /--idempotency-key must be 1 to 200 visible ASCII characters/);
  }
  assert.deepEqual(await apiAll(server, dave, "/api/files"), [], "nothing was uploaded");
});

test("a failing type exits 1 and names the runs that failed", async () => {
  const dir = path.join(work, "mixed");
  fs.mkdirSync(dir);
  const fixtures = path.join(ROOT, "test/fixtures/csv");
  fs.copyFileSync(path.join(fixtures, "normal.csv"), path.join(dir, "good ✓.csv"));
  fs.copyFileSync(path.join(fixtures, "empty.csv"), path.join(dir, "empty ∅.csv"));
  fs.copyFileSync(path.join(fixtures, "ragged-short.csv"), path.join(dir, "<b>ragged &amp; hostile.csv"));
  const partial = await client(["submit", "--type", "summary", dir, "--follow"], server.env(token));
  assert.equal(partial.code, 1, partial.stderr);
  const [summary] = ofKind(jsonLines(partial.stdout), "summary");
  assert.equal(summary?.status, "partially_succeeded");
  const failed = summary?.failedRuns as { fileName: string; status: string; errorCode: string }[];
  assert.deepEqual(failed.map((f) => [f.fileName, f.status, f.errorCode]).sort(), [
    ["<b>ragged &amp; hostile.csv", "failed", "ANALYSIS_DATA_INVALID"],
    ["empty ∅.csv", "failed", "ANALYSIS_DATA_INVALID"],
  ]);

  // Every run failing: python-stats over a column no file has.
  const all = await client(
    [
      "submit",
      "--type",
      "python-stats",
      "--param",
      "method=mean",
      "--param",
      "columns=no such column",
      dir,
      "--follow",
      "--out",
      path.join(work, "mixed-out"),
    ],
    server.env(token),
  );
  assert.equal(all.code, 1, all.stderr);
  const [s2] = ofKind(jsonLines(all.stdout), "summary");
  assert.equal(s2?.status, "failed");
  assert.equal((s2?.failedRuns as unknown[] | undefined)?.length, 3);
  // No outputs, but the table of what became of every run is written, by submit and by download.
  const table = fs.readFileSync(path.join(work, "mixed-out", "results.csv"), "utf8");
  assert.equal(table.trim().split("\n").length, 4, table);
  assert.deepEqual(fs.readdirSync(path.join(work, "mixed-out")), ["results.csv"]);
  const [created] = ofKind(jsonLines(all.stdout), "task");
  const again = await client(
    ["download", String(created?.taskId), "--out", path.join(work, "mixed-download")],
    server.env(token),
  );
  assert.equal(again.code, 1, again.stderr);
  assert.deepEqual(fs.readdirSync(path.join(work, "mixed-download")), ["results.csv"]);
});

test("bad parameters, an unknown type or bad arguments exit 2 before anything is uploaded", async () => {
  const bob = await server.token("bob");
  const cases: [string[], RegExp][] = [
    [
      ["--type", "python-stats", "--param", "method=bogus"],
      /method must be one of mean, median, stdev, min, max/,
    ],
    [["--type", "python-stats"], /missing parameter method/],
    [
      ["--type", "python-stats", "--param", "method=mean", "--param", "colour=red"],
      /has no parameter colour/,
    ],
    [["--type", "python-stats", "--param", "method=mean", "--param", "columns="], /columns\/0/],
    [["--type", "summary", "--param", "x"], /key=value/],
    [
      ["--type", "no-such-type"],
      /unknown analysis type no-such-type \(one of summary, python-stats, r-report\)/,
    ],
    [["--type", "summary", "--concurrency", "0"], /--concurrency/],
    [["--type", "summary", "--bogus-flag"], /Unknown option '--bogus-flag'/],
  ];
  for (const [args, message] of cases) {
    const r = await client(["submit", ...args, inputDir], server.env(bob));
    assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
    const [error] = ofKind(jsonLines(r.stdout), "error");
    assert.equal(error?.exitCode, 2);
    assert.match(r.stderr, message);
  }
  // A server URL with a user name and password (fetch refuses it, and its message printed the
  // password): exit 2 USAGE, the password never printed.
  const credentials = server.url.replace("//", "//ann:s3cr3t-pw@");
  for (const args of [
    ["status", "1"],
    ["submit", "--type", "summary", inputDir],
  ]) {
    const r = await client(args, server.env(bob, { ASSAY_URL: credentials }));
    assert.equal(r.code, 2, r.stderr);
    assert.equal(ofKind(jsonLines(r.stdout), "error")[0]?.code, "USAGE");
    assert.match(r.stderr, /must not hold a user name or password \(http:\/\/\*\*\*@127/);
    assert.ok(!`${r.stdout}${r.stderr}`.includes("s3cr3t-pw"), "the password is not printed");
  }
  const ftp = await client(
    ["status", "1"],
    server.env(bob, { ASSAY_URL: "ftp://ann:s3cr3t-pw@example.net/" }),
  );
  assert.equal(ftp.code, 2);
  assert.match(ftp.stderr, /not an http\(s\) URL: ftp:\/\/\*\*\*@example\.net/);
  assert.ok(!`${ftp.stdout}${ftp.stderr}`.includes("s3cr3t-pw"));
  // A password with a slash (not encoded: the URL does not parse) is hidden too.
  const slash = await client(
    ["status", "1"],
    server.env(bob, { ASSAY_URL: "http://ann:s3cr/t-pw@127.0.0.1:9/" }),
  );
  assert.equal(slash.code, 2);
  assert.ok(!`${slash.stdout}${slash.stderr}`.includes("t-pw"), slash.stderr);
  const missing = await client(["submit", "--type", "summary", path.join(work, "nowhere")], server.env(bob));
  assert.equal(missing.code, 2);
  assert.match(missing.stderr, /no such file or directory/);
  assert.deepEqual(await apiAll(server, bob, "/api/files"), [], "nothing was uploaded");
});

test("a wrong, missing or unusable token, or no server, exits 3; the token is never printed", async () => {
  const wrong = await client(["submit", "--type", "summary", inputDir], server.env("assay_wrong-token"));
  assert.equal(wrong.code, 3);
  assert.equal(ofKind(jsonLines(wrong.stdout), "error")[0]?.code, "UNAUTHORIZED");
  const none = await client(["tasks"], cleanEnv({ ASSAY_URL: server.url }));
  assert.equal(none.code, 3);
  assert.match(none.stderr, /no API token/);
  // A port nobody listens on (this server's, once it is stopped, is needed by other tests).
  const closed = await client(["status", "1"], server.env(token, { ASSAY_URL: "http://127.0.0.1:9" }));
  assert.equal(closed.code, 3);
  assert.match(closed.stderr, /cannot reach http:\/\/127\.0\.0\.1:9/);
  // Said at once: nothing there has ever answered, so it is the address, not an API restarting.
  assert.doesNotMatch(closed.stderr, /trying again|gave up/);
  const port = await new Promise<number>((resolve) => {
    const probe = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as net.AddressInfo;
      probe.close(() => resolve(port));
    });
  });
  const refused = await client(["status", "1"], server.env(token, { ASSAY_URL: `http://127.0.0.1:${port}` }));
  assert.equal(refused.code, 3);
  assert.match(refused.stderr, /ECONNREFUSED/);
  assert.doesNotMatch(refused.stderr, /trying again|gave up/);
  const viaFlag = await client(["tasks", "--token", token, "--url", "http://127.0.0.1:9"], cleanEnv());
  for (const r of [wrong, none, closed, viaFlag]) {
    assert.ok(!`${r.stdout}${r.stderr}`.includes(token), "the token is not printed");
  }
});

test("a token read from a file with its line end (CRLF, LF, a tab) works; one with a space inside is refused", async () => {
  for (const padded of [`${token}\r\n`, `${token}\n`, `\t${token} `]) {
    const r = await client(["tasks", "--limit", "1"], server.env(padded));
    assert.equal(r.code, 0, r.stderr);
    assert.equal(ofKind(jsonLines(r.stdout), "error").length, 0);
  }
  const inside = await client(["tasks"], server.env(`${token.slice(0, 8)} ${token.slice(8)}`));
  assert.equal(inside.code, 3);
  assert.match(inside.stderr, /characters no token has/);
  assert.ok(!`${inside.stdout}${inside.stderr}`.includes(token.slice(8)), "the token is not printed");
});

test("tasks, status, logs, follow, files, download and cancel", async () => {
  assert.ok(firstTask, "runs after the first submit");
  const { taskId } = firstTask;
  const env = server.env(token);

  const status = jsonLines((await client(["status", taskId], env)).stdout);
  assert.equal(ofKind(status, "task")[0]?.status, "succeeded");
  assert.deepEqual(
    ofKind(status, "run").map(({ kind, ...r }) => r),
    await apiAll(server, token, `/api/analysis-tasks/${taskId}/runs`),
  );

  const tasks = jsonLines((await client(["tasks", "--status", "succeeded", "--limit", "100"], env)).stdout);
  assert.ok(ofKind(tasks, "task").some((t) => t.taskId === taskId));
  assert.ok(ofKind(tasks, "task").every((t) => t.status === "succeeded"));
  assert.equal((await client(["tasks", "--status", "done"], env)).code, 2);

  const log = await taskLog(server, token, taskId);
  const logs = await client(["logs", taskId], env);
  assert.deepEqual(
    ofKind(jsonLines(logs.stdout), "event").map(({ kind, ...e }) => e),
    log,
  );
  // Following a task that has ended prints its whole log and its summary, and exits by its outcome.
  const follow = await client(["follow", taskId], env);
  assert.equal(follow.code, 0);
  assert.deepEqual(
    ofKind(jsonLines(follow.stdout), "event").map(({ kind, ...e }) => e),
    log,
  );
  assert.equal(ofKind(jsonLines(follow.stdout), "summary")[0]?.status, "succeeded");

  const files = jsonLines((await client(["files", "--limit", "1000"], env)).stdout);
  assert.deepEqual(
    ofKind(files, "file").map(({ kind, ...f }) => f),
    await apiAll(server, token, "/api/files"),
  );

  // download: folders named by the runs' file names (the server's), repeated ones made unique.
  const out = path.join(work, "downloaded");
  const dl = await client(["download", taskId, "--out", out], env);
  assert.equal(dl.code, 0, dl.stderr);
  const runs = await apiAll<{ runId: string; fileName: string }>(
    server,
    token,
    `/api/analysis-tasks/${taskId}/runs`,
  );
  for (const line of ofKind(jsonLines(dl.stdout), "download")) {
    const run = runs.find((r) => r.runId === line.runId);
    assert.ok(run);
    assert.ok(fs.existsSync(path.join(out, line.folder as string, "summary.json")));
  }
  const folders = fs.readdirSync(out).sort();
  assert.ok(folders.includes("results.csv"));
  assert.ok(
    folders.some((f) => /^results\.csv \(run \d+\)$/.test(f)),
    "the input named results.csv gets its run id",
  );
  assert.ok(
    folders.includes("nested.csv") && folders.includes("x.csv"),
    "folders by the server's base names",
  );
  assert.equal(folders.length, 21);

  // cancel: a finished task is exit 1; a running one is accepted and ends cancelled.
  const done = await client(["cancel", taskId], env);
  assert.equal(done.code, 1);
  assert.match(done.stderr, /had already ended \(succeeded\)/);
  const big = path.join(work, "slow");
  fs.mkdirSync(big);
  for (let i = 0; i < 8; i++) fs.writeFileSync(path.join(big, `slow-${i}.csv`), csv(150_000, i + 5));
  const created = jsonLines(
    (await client(["submit", "--type", "python-stats", "--param", "method=median", big], env)).stdout,
  );
  const slowId = ofKind(created, "task")[0]?.taskId as string;
  const cancel = await client(["cancel", slowId], env);
  assert.equal(cancel.code, 0, cancel.stderr);
  assert.equal(ofKind(jsonLines(cancel.stdout), "cancel")[0]?.taskId, slowId);
  const followed = await client(["follow", slowId], env);
  assert.equal(followed.code, 1);
  assert.equal(ofKind(jsonLines(followed.stdout), "summary")[0]?.status, "cancelled");
  // Cancelled, nothing succeeded: no outputs, but the table of its runs, and exit 1.
  const cancelledOut = path.join(work, "cancelled-download");
  const cancelled = await client(["download", slowId, "--out", cancelledOut], env);
  assert.equal(cancelled.code, 1, cancelled.stderr);
  // (A run that ended before the cancel would have its folder too.)
  assert.ok(fs.readdirSync(cancelledOut).includes("results.csv"));
  // A script learns why from a summary line, as follow's: the task, and the runs without outputs
  // (it printed only `downloaded` with 0 runs, and exited 1).
  const [summary] = ofKind(jsonLines(cancelled.stdout), "summary") as unknown as {
    taskId: string;
    status: string;
    totalCount: number;
    failedRuns: { status: string; errorCode: string | null }[];
  }[];
  assert.deepEqual([summary?.taskId, summary?.status], [slowId, "cancelled"], cancelled.stdout);
  assert.equal(summary?.failedRuns.length, summary?.totalCount);
  assert.ok(
    summary?.failedRuns.every(
      (r) => r.status === "cancelled" && r.errorCode === "ANALYSIS_PROCESS_CANCELLED",
    ),
  );

  // Unknown ids: a usage error.
  assert.equal((await client(["status", "999999999999999"], env)).code, 2);
  assert.equal((await client(["status", "abc"], env)).code, 2);
});

test("files rm deletes files, tries every id, and exits 2 when one names no file of yours", async () => {
  const env = server.env(token);
  const dir = path.join(work, "to-delete");
  fs.mkdirSync(dir);
  for (const name of ["gone-1 «ä».csv", "gone-2.csv"])
    fs.writeFileSync(path.join(dir, name), csv(3, name.length));
  const uploaded = ofKind(
    jsonLines((await client(["submit", "--type", "summary", dir], env)).stdout),
    "file",
  );
  const ids = uploaded.map((f) => f.fileId as string);
  assert.equal(ids.length, 2);
  const bob = await server.token("bob-files");
  const bobs = ofKind(
    jsonLines(
      (await client(["submit", "--type", "summary", path.join(dir, "gone-2.csv")], server.env(bob))).stdout,
    ),
    "file",
  )[0]?.fileId as string;
  // Someone else's id between two of one's own: both of one's own go, the command exits 2.
  const rm = await client(["files", "rm", ids[0] as string, bobs, ids[1] as string], env);
  assert.equal(rm.code, 2, rm.stderr);
  assert.deepEqual(
    ofKind(jsonLines(rm.stdout), "deleted").map((l) => l.fileId),
    ids,
  );
  assert.match(rm.stderr, /FILE_NOT_FOUND/);
  assert.match(rm.stderr, new RegExp(`no file ${bobs} of yours`), "the id that failed is named");
  // Said once: not a note per id and then the API's own message for the first.
  assert.equal(rm.stderr, `assay: no file ${bobs} of yours (FILE_NOT_FOUND)\n`);
  assert.equal(errorOf(rm.stdout)?.code, "FILE_NOT_FOUND");
  const left = ofKind(jsonLines((await client(["files", "--limit", "1000"], env)).stdout), "file");
  assert.ok(!left.some((f) => ids.includes(f.fileId as string)), "both are gone");
  const bobLeft = ofKind(jsonLines((await client(["files"], server.env(bob))).stdout), "file");
  assert.ok(
    bobLeft.some((f) => f.fileId === bobs),
    "bob's stays",
  );
  // Bad ids are refused before anything is deleted.
  for (const args of [["rm"], ["rm", "abc"], ["rm", bobs, "0"], ["rm", bobs, "--limit", "3"]]) {
    const r = await client(["files", ...args], server.env(bob));
    assert.equal(r.code, 2, args.join(" "));
  }
  assert.ok(
    ofKind(jsonLines((await client(["files"], server.env(bob))).stdout), "file").some(
      (f) => f.fileId === bobs,
    ),
    "nothing deleted by a refused command",
  );
});

test("every client command has --help with an example; none needs a token or a server for it", async () => {
  for (const command of [
    "submit",
    "tasks",
    "status",
    "follow",
    "logs",
    "cancel",
    "download",
    "files",
    "types",
  ]) {
    const r = await client([command, "--help"], cleanEnv());
    assert.equal(r.code, 0, `${command}: ${r.stderr}`);
    assert.match(r.stdout, new RegExp(`^Usage: assay ${command}`));
    assert.match(r.stdout, /Examples?:\n {2}assay /);
    assert.match(r.stdout, /Exit codes: 0 /);
  }
  const top = await client(["--help"], cleanEnv());
  assert.match(top.stdout, /Client commands/);
});

test("a client command loads nothing of the server: no Fastify, postgres, AWS SDK, config or database code", async () => {
  assert.ok(firstTask, "runs after the first submit");
  const trace = path.join(work, "imports.txt");
  const child = spawn(
    process.execPath,
    ["--import", path.join(ROOT, "test/helpers/trace-imports.mjs"), ASSAY_BIN, "status", firstTask.taskId],
    {
      // The sources, module by module (test/unit/bundle.test.ts checks the bundle's chunks alike).
      env: { ...server.env(token), ASSAY_TRACE_IMPORTS: trace, ASSAY_BUNDLE: "0" },
      cwd: ROOT,
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  const r = await collect(child);
  assert.equal(r.code, 0, r.stderr);
  const loaded = fs.readFileSync(trace, "utf8").split("\n").filter(Boolean);
  assert.ok(
    loaded.some((u) => u.endsWith("/src/cli/client-tasks.ts")),
    "the trace sees the client's modules",
  );
  const server_ = loaded.filter((u) =>
    /node_modules\/(fastify|@fastify|postgres|@aws-sdk|pino|typebox|drizzle-orm|tsx)\/|\/src\/(config|db|queue|storage|tasks|files|auth|events|runner|metrics)\/?|\/src\/http\/(app|server|auth|routes)/.test(
      u,
    ),
  );
  assert.deepEqual(server_, []);
});
