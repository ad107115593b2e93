// `assay download` through a connection that breaks mid-body: the real client (a child process)
// against a real `assay all`, with a small HTTP proxy between them that cuts chosen answers after
// some of their body, answers a 502 in the server's place, or alters an answer's ETag or a request's
// Range. An output file is resumed from the byte the client holds (`Range`, `If-Range`), results.csv
// (which cannot resume) is fetched again whole, a retry the server answers whole starts over, a 206 of
// another range is refused, and a download cut every time gives up with exit 3 — never a file under
// its own name that is not the server's bytes, never a temporary file left behind.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { test } from "node:test";
import { collect, spawnCli } from "../helpers/cli.ts";
import { apiGet, clientSuite, csv, jsonLines, ofKind, within } from "../helpers/client.ts";
import { waitFor } from "../helpers/queue.ts";

let taskId: string;
/** The task's two runs, each with summary.json: its route and the server's bytes. */
let outputs: { runId: string; fileName: string; route: string; bytes: Buffer }[];
let resultsRoute: string;
let resultsCsv: Buffer;

/** A CSV with many columns of non-ASCII names, so that summary.json is a few KB. */
function wideCsv(seed: number): string {
  const columns = Array.from({ length: 60 }, (_, i) => `colonne ${i} — mesure ✓ ${"é".repeat(i % 7)}`);
  const rows = Array.from({ length: 40 }, (_, r) => columns.map((_, c) => (r * seed + c) % 101).join(","));
  return `${columns.map((c) => `"${c}"`).join(",")}\n${rows.join("\n")}\n`;
}

async function bytesOf(route: string): Promise<Buffer> {
  const res = await fetch(`${suite.server.url}${route}`, {
    headers: { authorization: `Bearer ${suite.token}` },
  });
  assert.equal(res.status, 200, route);
  return Buffer.from(await res.arrayBuffer());
}

const suite = clientSuite({
  user: "fiona ✓",
  scratch: "assay-client-download-",
  ids: { tasks: 0, runs: 1 },
  setup: async () => {
    const dir = path.join(suite.work, "entrées");
    fs.mkdirSync(dir);
    fs.writeFileSync(path.join(dir, "relevé \u202efdp.csv"), wideCsv(3));
    fs.writeFileSync(path.join(dir, "日本語 データ.csv"), wideCsv(7));
    fs.writeFileSync(path.join(dir, "petit.csv"), csv(5, 1));
    const r = await collect(spawnCli(["submit", "--type", "summary", dir, "--follow"], suite.env()));
    assert.equal(r.code, 0, r.stderr);
    taskId = String(ofKind(jsonLines(r.stdout), "task")[0]?.taskId);
    const runs = await apiGet<{ items: { runId: string; fileName: string }[] }>(
      suite.server,
      suite.token,
      `/api/analysis-tasks/${taskId}/runs?limit=100`,
    );
    outputs = [];
    for (const run of runs.items.filter((x) => x.fileName !== "petit.csv")) {
      const route = `/api/analysis-tasks/${taskId}/runs/${run.runId}/outputs/summary.json`;
      outputs.push({ ...run, route, bytes: await bytesOf(route) });
    }
    assert.equal(outputs.length, 2);
    for (const o of outputs)
      assert.ok(o.bytes.length > 2000, `summary.json of ${o.fileName} is large enough`);
    resultsRoute = `/api/analysis-tasks/${taskId}/results.csv`;
    resultsCsv = await bytesOf(resultsRoute);
  },
});

interface Seen {
  path: string;
  range: string | undefined;
  ifRange: string | undefined;
  status: number;
  etag: string | undefined;
}

/** What the proxy does with one request (the nth to its path, from 1). */
interface Fault {
  /** Send only this many bytes of the body, then close the connection. */
  cutAfter?: number;
  /**
   * With cutAfter: close it only once the client's temporary file in this folder holds every byte
   * sent (the bytes it had before, from the request's Range, and these). A client's fetch drops the
   * bytes it has received but not yet read when the connection breaks; waiting for them makes the
   * byte a retry resumes from exact.
   */
  heldIn?: string;
  /** Answer a proxy's 502 page instead of asking the server. */
  badGateway?: boolean;
  /** The answer's ETag replaced by this one. */
  etag?: string;
  /** The request's Range replaced by this one. */
  range?: (range: string) => string;
}

/** An HTTP proxy in front of the server; `fault` says what becomes of each request. */
async function faultyProxy(fault: (path: string, nth: number) => Fault | undefined) {
  const backend = new URL(suite.server.url);
  const seen: Seen[] = [];
  const counts = new Map<string, number>();
  const proxy = http.createServer((req, res) => {
    const url = req.url ?? "";
    const nth = (counts.get(url) ?? 0) + 1;
    counts.set(url, nth);
    const f = fault(url, nth) ?? {};
    const one: Seen = {
      path: url,
      range: req.headers.range,
      ifRange: req.headers["if-range"] as string | undefined,
      status: 0,
      etag: undefined,
    };
    seen.push(one);
    if (f.badGateway) {
      req.resume();
      one.status = 502;
      res.writeHead(502, { "content-type": "text/html" });
      return res.end("<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>");
    }
    const headers = { ...req.headers };
    if (f.range && headers.range) headers.range = f.range(headers.range);
    const up = http.request(
      { host: backend.hostname, port: backend.port, method: req.method, path: url, headers },
      (answer) => {
        one.status = answer.statusCode ?? 0;
        one.etag = answer.headers.etag;
        const answerHeaders = { ...answer.headers };
        if (f.etag) answerHeaders.etag = f.etag;
        res.writeHead(answer.statusCode ?? 502, answerHeaders);
        if (f.cutAfter === undefined) return answer.pipe(res);
        let left = f.cutAfter;
        answer.on("data", (chunk: Buffer) => {
          if (left <= 0) return;
          const part = chunk.subarray(0, left);
          left -= part.length;
          if (left > 0) return void res.write(part);
          answer.destroy();
          const had = Number(/^bytes=([0-9]+)-/.exec(req.headers.range ?? "")?.[1] ?? 0);
          const held = f.heldIn
            ? () => heldIn(f.heldIn as string) === had + (f.cutAfter as number)
            : undefined;
          res.write(part, () => {
            if (!held) return req.socket.destroy();
            waitFor(async () => held(), 30_000, "the client to hold the bytes sent")
              .catch(() => {})
              .finally(() => req.socket.destroy());
          });
        });
      },
    );
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`,
    seen,
    to: (p: string) => seen.filter((s) => s.path === p),
    close: () => {
      proxy.closeAllConnections();
      proxy.close();
    },
  };
}

/** A run's folder in the download: its input's name made a safe segment (the bidi override `_`). */
const folderOf = (o: { fileName: string }) => o.fileName.replace("\u202e", "_");

/** The size of the temporary file in `dir` (-1 when there is none). */
function heldIn(dir: string): number {
  const partial = fs.existsSync(dir) ? fs.readdirSync(dir).find((n) => n.includes(".partial-")) : undefined;
  return partial === undefined ? -1 : fs.statSync(path.join(dir, partial)).size;
}

/** Every file under `dir`, relative. */
const filesUnder = (dir: string) =>
  fs.existsSync(dir)
    ? (fs.readdirSync(dir, { recursive: true }) as string[])
        .filter((p) => fs.statSync(path.join(dir, p)).isFile())
        .sort()
    : [];

async function download(proxyUrl: string, out: string) {
  const child = spawnCli(["download", taskId, "--out", out], suite.env({ ASSAY_URL: proxyUrl }));
  const r = await within(collect(child), 120_000, "assay download", () => suite.server.log());
  return { ...r, error: ofKind(jsonLines(r.stdout), "error")[0] };
}

/** The downloaded folder holds the server's bytes: each summary.json and results.csv, nothing else. */
function assertWhole(out: string): void {
  const files = filesUnder(out);
  assert.ok(!files.some((f) => f.includes(".partial-")), `no temporary file: ${files}`);
  assert.equal(files.length, 4, `three outputs and results.csv: ${files}`);
  for (const o of outputs) {
    const file = path.join(out, folderOf(o), "summary.json");
    assert.ok(fs.readFileSync(file).equals(o.bytes), `${o.fileName}: the server's bytes`);
  }
  assert.ok(
    fs.readFileSync(path.join(out, "results.csv")).equals(resultsCsv),
    "results.csv: the server's bytes",
  );
}

test("an output cut mid-body is resumed with one ranged request; results.csv cut, or a 502, is fetched again whole", async () => {
  const [first, second] = outputs as [(typeof outputs)[0], (typeof outputs)[0]];
  const half = Math.floor(first.bytes.length / 2);
  const out = path.join(suite.work, "reprise");
  const proxy = await faultyProxy((p, nth) => {
    if (p === first.route && nth === 1) return { cutAfter: half, heldIn: path.join(out, folderOf(first)) };
    if (p === second.route && nth === 1) return { badGateway: true };
    if (p === resultsRoute && nth === 1) return { cutAfter: Math.floor(resultsCsv.length / 2) };
    return undefined;
  });
  try {
    const r = await download(proxy.url, out);
    assert.equal(r.code, 0, r.stderr);
    assertWhole(out);
    const [cut, resumed, ...more] = proxy.to(first.route);
    assert.deepEqual(more, [], "exactly one retry");
    assert.equal(cut?.range, undefined);
    assert.equal(resumed?.range, `bytes=${half}-`, "resumed from the byte held");
    assert.equal(resumed?.ifRange, cut?.etag, "only if the file is the one held");
    assert.equal(resumed?.status, 206);
    assert.deepEqual(
      proxy.to(second.route).map((s) => [s.range, s.status]),
      [
        [undefined, 502],
        [undefined, 200],
      ],
      "a 502 before any byte: the whole file again",
    );
    assert.deepEqual(
      proxy.to(resultsRoute).map((s) => s.range),
      [undefined, undefined],
      "results.csv cannot resume: fetched again whole",
    );
    assert.match(r.stderr, new RegExp(`summary\\.json of run ${first.runId}: .*resuming from byte ${half}`));
  } finally {
    proxy.close();
  }
});

test("a retry answered whole (the file is not the one held) starts over; a 206 of another range is refused", async () => {
  const [first, second] = outputs as [(typeof outputs)[0], (typeof outputs)[0]];
  const cutAt = 1000;
  const out = path.join(suite.work, "recommencé");
  const proxy = await faultyProxy((p, nth) => {
    // Another ETag than the file's: the server's If-Range check sends the whole file, 200.
    if (p === first.route && nth === 1)
      return { cutAfter: cutAt, heldIn: path.join(out, folderOf(first)), etag: '"un autre fichier"' };
    // The range asked for moved 5 bytes back: a 206 that does not start where the client is.
    if (p === second.route && nth === 1) return { cutAfter: cutAt, heldIn: path.join(out, folderOf(second)) };
    if (p === second.route && nth === 2) return { range: () => `bytes=${cutAt - 5}-` };
    return undefined;
  });
  try {
    const r = await download(proxy.url, out);
    assert.equal(r.code, 0, r.stderr);
    assertWhole(out);
    assert.deepEqual(
      proxy.to(first.route).map((s) => [s.range, s.ifRange, s.status]),
      [
        [undefined, undefined, 200],
        [`bytes=${cutAt}-`, '"un autre fichier"', 200],
      ],
    );
    assert.deepEqual(
      proxy.to(second.route).map((s) => [s.range, s.status]),
      [
        [undefined, 200],
        [`bytes=${cutAt}-`, 206],
        [undefined, 200],
      ],
      "the wrong 206 refused, then the whole file",
    );
  } finally {
    proxy.close();
  }
});

test("a download cut every time gives up after 5 attempts: exit 3 CONNECTION_FAILED, no file, no temporary file", async () => {
  const [first] = outputs as [(typeof outputs)[0]];
  const out = path.join(suite.work, "abandon");
  const proxy = await faultyProxy((p) =>
    p === first.route ? { cutAfter: 300, heldIn: path.join(out, folderOf(first)) } : undefined,
  );
  try {
    const r = await download(proxy.url, out);
    assert.equal(r.code, 3, r.stderr);
    assert.equal(r.error?.code, "CONNECTION_FAILED", r.stdout);
    assert.match(
      String(r.error?.message),
      new RegExp(
        `^summary\\.json of run ${first.runId}: the connection to .* broke .*; gave up after 5 attempts$`,
      ),
    );
    const tries = proxy.to(first.route);
    assert.deepEqual(
      tries.map((s) => s.range),
      [undefined, "bytes=300-", "bytes=600-", "bytes=900-", "bytes=1200-"],
      "each retry resumed from the byte held",
    );
    const files = filesUnder(out);
    assert.ok(!files.some((f) => f.includes(".partial-")), `no temporary file: ${files}`);
    assert.ok(!files.includes(path.join(folderOf(first), "summary.json")), `${files}`);
  } finally {
    proxy.close();
  }
});

test("Ctrl-C (or SIGTERM) while a retry waits stops at once: exit 130 (143), no temporary file, no request after", async () => {
  for (const [signal, code] of [
    ["SIGINT", 130],
    ["SIGTERM", 143],
  ] as const)
    await stoppedWhileRetryWaits(signal, code);
});

async function stoppedWhileRetryWaits(signal: "SIGINT" | "SIGTERM", code: number) {
  const [first] = outputs as [(typeof outputs)[0]];
  // Cut every time: the fourth retry waits 4 s.
  const proxy = await faultyProxy((p) => (p === first.route ? { cutAfter: 300 } : undefined));
  const out = path.join(suite.work, `interrompu-${signal}`);
  try {
    const child = spawnCli(["download", taskId, "--out", out], suite.env({ ASSAY_URL: proxy.url }));
    let stderr = "";
    child.stderr?.on("data", (c: Buffer) => {
      stderr += c.toString();
    });
    const done = collect(child);
    // The fourth attempt cut, the client waits 4 s before the fifth.
    await waitFor(async () => /attempt 5 of 5/.test(stderr), 60_000, "the last retry's pause");
    const t0 = performance.now();
    child.kill(signal);
    const r = await within(done, 10_000, `assay download after ${signal}`);
    assert.equal(r.code, code, r.stderr);
    assert.ok(performance.now() - t0 < 3000, "not after the pause");
    assert.equal(proxy.to(first.route).length, 4, `no request after ${signal}`);
    const files = filesUnder(out);
    assert.ok(!files.some((f) => f.includes(".partial-")), `no temporary file: ${files}`);
  } finally {
    proxy.close();
  }
}

test("a download removes the temporary files a killed download left beside what it writes, not a live one's", async () => {
  const out = path.join(suite.work, "reprise-tuée");
  const first = await collect(spawnCli(["download", taskId, "--out", out], suite.env()));
  assert.equal(first.code, 0, first.stderr);
  const written = filesUnder(out).filter((f) => !f.includes(".partial-"));
  const summary = written.find((f) => f.endsWith("summary.json")) as string;
  assert.ok(summary, `${written}`);
  // As kill -9 leaves them: a process that is gone (no pid is that large), and one that runs (this
  // test's own) — which may still be writing, and stays — and names that are not a download's.
  const dead = (f: string) => `${f}.partial-2147483646-0123456789ab`;
  const stale = [dead("results.csv"), dead(summary)];
  const kept = [
    `${summary}.partial-${process.pid}-0123456789ab`,
    `${summary}.partial-x`,
    "autre.partial-1-0123456789ab",
  ];
  for (const f of [...stale, ...kept]) fs.writeFileSync(path.join(out, f), "half");
  const again = await collect(spawnCli(["download", taskId, "--out", out], suite.env()));
  assert.equal(again.code, 0, again.stderr);
  const after = filesUnder(out);
  for (const f of stale) assert.ok(!after.includes(f), `${f} removed: ${after}`);
  for (const f of kept) assert.ok(after.includes(f), `${f} kept: ${after}`);
  for (const f of written) assert.ok(after.includes(f), f);
});
