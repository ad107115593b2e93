// The client's small requests and its uploads through an API that restarts or a proxy's 5xx: the
// real client (a child process) against a real `assay all`, with a small HTTP proxy between them
// that fails chosen requests — a 502 page of its own, a connection dropped before any answer, an
// upload cut off mid-body, an upload whose answer is lost after the server committed it. Every GET
// is asked again with growing pauses, each retry said on stderr; an upload whose answer was lost is
// found on the server and reused, never made twice; a 500 or a 4xx is not asked again; a server that
// stays away is given up (exit 3) and Ctrl-C during a pause ends the command at once (exit 130).
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { test } from "node:test";
import { collect, spawnCli } from "../helpers/cli.ts";
import {
  apiAll,
  clientSuite,
  csv,
  jsonLines,
  type Line,
  ofKind,
  submitHostilePair,
  within,
} from "../helpers/client.ts";

const USER = "zoë «retry» 🚀";

/** A task that ended, submitted straight to the server: what status, download and the rest read. */
let taskId: string;

const suite = clientSuite({
  user: USER,
  scratch: "assay-client-retry-",
  ids: { tasks: 0, runs: 1, files: 1 },
  setup: async () => {
    taskId = await submitHostilePair(suite);
  },
});

/** What the proxy does with a request. */
type Fault =
  | "pass"
  /** Answer a 502 page of the proxy's own, the server never asked (nginx with its upstream down). */
  | "badGateway"
  /** Answer 500 and 404 in the API's envelope, the server never asked. */
  | "serverError"
  | "notFound"
  /** Close the connection once the request has arrived, without an answer. */
  | "drop"
  /** Pass the first 100 bytes of the body on, then cut both connections: the upload never ends. */
  | "cutBody"
  /** Pass the request on; the server commits it, and its answer is lost (the connection cut). */
  | "loseAnswer"
  /** Pass the request on; the server commits it, and the proxy answers 502 in its place. */
  | "answer502"
  /** Pass the request on, and answer 504 as soon as its body has arrived (a proxy that gave up). */
  | "timeout504"
  /** Answer 504 once the body has arrived, the server never asked. */
  | "gatewayTimeout"
  /** Answer an empty page of files, the server never asked (a look-up by hash that misses). */
  | "noFiles";

interface Seen {
  method: string;
  path: string;
  /** An upload's file name (its multipart head). */
  file?: string;
  fault: Fault;
}

const BAD_GATEWAY = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>";

/**
 * An HTTP proxy in front of the server. `fault` decides each request's fate from its method, its
 * path (without the query), an upload's file name and how many requests of that kind (method, path,
 * file) came before it, counting from 1.
 */
async function faultyProxy(
  fault: (r: { method: string; path: string; query: string; file?: string; nth: number }) => Fault,
) {
  const backend = new URL(suite.server.url);
  const seen: Seen[] = [];
  const counts = new Map<string, number>();
  const decide = (method: string, url: string, file?: string): Fault => {
    const [p = url, query = ""] = url.split("?");
    const key = `${method} ${p} ${file ?? ""}`;
    const nth = (counts.get(key) ?? 0) + 1;
    counts.set(key, nth);
    const f = fault({ method, path: p, query, ...(file === undefined ? {} : { file }), nth });
    seen.push({ method, path: p, ...(file === undefined ? {} : { file }), fault: f });
    return f;
  };
  const proxy = http.createServer((req, res) => {
    const method = req.method ?? "GET";
    const url = req.url ?? "/";
    const upload = method === "POST" && url === "/api/files";
    // An upload's file name is in its multipart head, the first bytes of its body.
    let head = Buffer.alloc(0);
    const start = (f: Fault, first: Buffer[]) => {
      if (
        f === "badGateway" ||
        f === "gatewayTimeout" ||
        f === "serverError" ||
        f === "notFound" ||
        f === "drop" ||
        f === "noFiles"
      ) {
        const answer = () => {
          if (f === "drop") return req.socket.destroy();
          const [status, body, type] =
            f === "noFiles"
              ? [
                  200,
                  '{"code":"OK","message":"OK","data":{"items":[],"nextCursor":null}}',
                  "application/json",
                ]
              : f === "badGateway"
                ? [502, BAD_GATEWAY, "text/html"]
                : f === "gatewayTimeout"
                  ? [504, "<html><body>504 Gateway Time-out</body></html>", "text/html"]
                  : f === "serverError"
                    ? [500, '{"code":"INTERNAL","message":"Internal server error."}', "application/json"]
                    : [404, '{"code":"NOT_FOUND","message":"Route not found."}', "application/json"];
          res.writeHead(status, { "content-type": type });
          res.end(body);
        };
        if (req.readableEnded) answer();
        else {
          req.on("end", answer);
          req.resume();
        }
        return;
      }
      const up = http.request(
        { host: backend.hostname, port: backend.port, method, path: url, headers: req.headers },
        (answer) => {
          if (f === "timeout504") {
            // The proxy has answered already (below); the server's answer goes nowhere.
            answer.resume();
            return;
          }
          if (f === "loseAnswer" || f === "answer502") {
            // Read to its end: the server has committed the upload by then.
            answer.resume();
            answer.on("end", () => {
              if (f === "loseAnswer") return req.socket.destroy();
              res.writeHead(502, { "content-type": "text/html" });
              res.end(BAD_GATEWAY);
            });
            return;
          }
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          answer.pipe(res);
        },
      );
      up.on("error", () => {
        if (res.headersSent) return res.destroy();
        res.writeHead(502, { "content-type": "text/html" });
        res.end(BAD_GATEWAY);
      });
      if (f === "cutBody") {
        const sent = Buffer.concat(first).subarray(0, 100);
        up.write(sent, () => {
          up.destroy();
          req.socket.destroy();
        });
        return;
      }
      for (const chunk of first) up.write(chunk);
      req.pipe(up);
      if (f === "timeout504")
        req.on("end", () => {
          res.writeHead(504, { "content-type": "text/html" });
          res.end("<html><body>504 Gateway Time-out</body></html>");
        });
    };
    if (!upload) return start(decide(method, url), []);
    const chunks: Buffer[] = [];
    const onData = (chunk: Buffer) => {
      chunks.push(chunk);
      head = Buffer.concat([head, chunk]).subarray(0, 4096);
      const name = /filename="([^"]*)"/.exec(head.toString("utf8"))?.[1];
      if (name === undefined && head.length < 4096) return;
      req.off("data", onData);
      req.pause();
      start(decide(method, url, name), chunks);
      if (!req.destroyed) req.resume();
    };
    req.on("data", onData);
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`,
    seen,
    close: () => {
      proxy.closeAllConnections();
      proxy.close();
    },
  };
}

/** The first two requests of every GET fail: a 502 page, then a connection dropped without answer. */
const everyGetTwice = (r: { method: string; nth: number }): Fault =>
  r.method !== "GET" ? "pass" : r.nth === 1 ? "badGateway" : r.nth === 2 ? "drop" : "pass";

/** `assay <args>` through `proxyUrl`, as JSON lines. */
function run(args: string[], proxyUrl: string, ms = 120_000) {
  return within(
    collect(spawnCli(args, suite.env({ ASSAY_URL: proxyUrl }))),
    ms,
    `assay ${args.join(" ")}`,
    () => suite.server.log(),
  );
}

/** The lines a command prints, without what changes from one run to the next. */
const steady = (lines: Line[]) =>
  lines.map((l) => {
    const {
      seconds: _s,
      hashSeconds: _h,
      lookupSeconds: _l,
      uploadSeconds: _u,
      dir: _d,
      resultsCsv: _r,
      ...rest
    } = l;
    return rest;
  });

test("status, tasks, files, types, logs, follow and download each survive a 502 and a dropped connection on every GET", async () => {
  const commands = [
    ["status", taskId],
    ["tasks", "--limit", "5"],
    ["files"],
    ["types"],
    ["logs", taskId],
    ["follow", taskId],
    ["download", taskId, "--out", path.join(suite.work, "direct")],
  ];
  // Side by side: none of them changes what another reads, and each waits out its own retries' pauses.
  const survive = async (args: string[]) => {
    const direct = await run(args, suite.server.url);
    assert.equal(direct.code, 0, `${args[0]} straight to the server: ${direct.stderr}`);
    const proxy = await faultyProxy(everyGetTwice);
    try {
      const through = await run(
        args[0] === "download" ? ["download", taskId, "--out", path.join(suite.work, "through")] : args,
        proxy.url,
      );
      assert.equal(through.code, 0, `${args[0]} through the failing proxy: ${through.stderr}`);
      // Runs are downloaded side by side: their lines come in the order they end.
      const inOrder = (stdout: string) => {
        const lines = steady(jsonLines(stdout));
        return args[0] === "download" ? lines.map((l) => JSON.stringify(l)).sort() : lines;
      };
      assert.deepEqual(
        inOrder(through.stdout),
        inOrder(direct.stdout),
        `${args[0]}: the same answer as straight to the server`,
      );
      const gets = proxy.seen.filter((s) => s.method === "GET");
      assert.ok(gets.some((s) => s.fault === "badGateway") && gets.some((s) => s.fault === "drop"));
      for (const p of new Set(gets.map((s) => s.path)))
        assert.ok(
          gets.some((s) => s.path === p && s.fault === "pass"),
          `${args[0]}: ${p} was asked again until it was answered`,
        );
      // Each small GET's retries are said on stderr (downloads say theirs their own way).
      assert.match(
        through.stderr,
        /reading \/api\/\S+: HTTP 502 Bad Gateway \(HTTP_502\); trying again \(attempt 2 of 6\)/,
      );
      assert.match(through.stderr, /reading \/api\/\S+: .*\(attempt 3 of 6\)/);
      assert.ok(!through.stderr.includes(suite.token), "the token is not printed");
    } finally {
      proxy.close();
    }
  };
  await Promise.all(commands.map(survive));
  for (const name of fs.readdirSync(path.join(suite.work, "direct"), { recursive: true }) as string[]) {
    const file = path.join(suite.work, "direct", name);
    if (fs.statSync(file).isFile())
      assert.deepEqual(fs.readFileSync(path.join(suite.work, "through", name)), fs.readFileSync(file), name);
  }
});

test("submit --out survives a 502 and a dropped connection on its type, file and run GETs", async () => {
  const dir = path.join(suite.work, "soumission");
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, "mesure — 1.csv"), csv(12, 11));
  fs.writeFileSync(path.join(dir, "mesure — 2.csv"), csv(12, 13));
  const proxy = await faultyProxy(everyGetTwice);
  try {
    const out = path.join(suite.work, "soumission-out");
    const r = await run(["submit", "--type", "summary", dir, "--out", out], proxy.url);
    assert.equal(r.code, 0, r.stderr);
    for (const p of ["/api/analysis-types", "/api/files"])
      assert.deepEqual(
        proxy.seen.filter((s) => s.method === "GET" && s.path === p).map((s) => s.fault),
        ["badGateway", "drop", "pass"],
        p,
      );
    assert.ok(proxy.seen.some((s) => /\/runs$/.test(s.path) && s.fault === "drop"));
    assert.ok(fs.existsSync(path.join(out, "mesure — 1.csv", "summary.json")));
    assert.ok(fs.existsSync(path.join(out, "results.csv")));
    assert.equal(ofKind(jsonLines(r.stdout), "task").length, 1);
  } finally {
    proxy.close();
  }
});

test("uploads through lost answers, 502s and cut bodies: each local file one file on the server, none made twice", async () => {
  const dir = path.join(suite.work, "envois");
  const same = "relevé ✓.csv";
  const sameBytes = csv(40, 17);
  for (const sub of ["a", "b", "c", "d"]) {
    fs.mkdirSync(path.join(dir, sub), { recursive: true });
    fs.writeFileSync(path.join(dir, sub, same), sameBytes);
  }
  fs.writeFileSync(path.join(dir, "日本語 データ.csv"), csv(40, 19));
  fs.writeFileSync(path.join(dir, "rapport \u202efdp.csv"), csv(40, 23));
  // A large one, so that its connection is cut while the client is still writing its body.
  fs.writeFileSync(path.join(dir, "grand fichier ✓.csv"), csv(150_000, 29));
  // A copy of the shared bytes the user uploaded before: `a` reuses it; a lost upload must not.
  const form = new FormData();
  form.append("file", new Blob([sameBytes]), same);
  const pre = await fetch(`${suite.server.url}/api/files`, {
    method: "POST",
    headers: { authorization: `Bearer ${suite.token}` },
    body: form,
  });
  assert.equal(pre.status, 201);
  const preId = ((await pre.json()) as { data: { fileId: string } }).data.fileId;
  const before = new Set(
    (await apiAll<{ fileId: string }>(suite.server, suite.token, "/api/files")).map((f) => f.fileId),
  );

  const proxy = await faultyProxy(({ method, file, nth }) => {
    if (method !== "POST" || file === undefined) return "pass";
    // b's answer is lost; c goes through; d's first body is cut (nothing kept): d must not take c's.
    if (file === same) return nth === 1 ? "loseAnswer" : nth === 3 ? "cutBody" : "pass";
    if (file === "日本語 データ.csv") return nth === 1 ? "badGateway" : "pass";
    if (file === "rapport \u202efdp.csv") return nth === 1 ? "answer502" : "pass";
    if (file === "grand fichier ✓.csv") return nth === 1 ? "cutBody" : nth === 2 ? "drop" : "pass";
    return "pass";
  });
  try {
    const r = await run(["submit", "--type", "summary", dir, "--follow"], proxy.url);
    assert.equal(r.code, 0, r.stderr);
    const lines = jsonLines(r.stdout);
    const files = ofKind(lines, "file") as (Line & { path: string; fileId: string; uploaded: boolean })[];
    assert.equal(files.length, 7);
    assert.equal(files.find((f) => f.path === `a/${same}`)?.fileId, preId, "a reuses the earlier copy");
    const ids = files.map((f) => f.fileId);
    assert.equal(new Set(ids).size, 7, `every local file a file of its own: ${ids}`);

    const now = await apiAll<{ fileId: string; name: string }>(suite.server, suite.token, "/api/files");
    const made = now.filter((f) => !before.has(f.fileId));
    assert.deepEqual(
      made.map((f) => f.fileId).sort(),
      ids.filter((id) => id !== preId).sort(),
      "one file per upload, none left over from an attempt whose answer was lost",
    );
    const uploads = (file: string) => proxy.seen.filter((s) => s.file === file).map((s) => s.fault);
    assert.deepEqual(
      uploads(same),
      ["loseAnswer", "pass", "cutBody", "pass"],
      "b not sent again; d sent again",
    );
    assert.deepEqual(uploads("日本語 データ.csv"), ["badGateway", "pass"]);
    assert.deepEqual(
      uploads("rapport \u202efdp.csv"),
      ["answer502"],
      "a 502 after the commit: not sent again",
    );
    assert.deepEqual(uploads("grand fichier ✓.csv"), ["cutBody", "drop", "pass"]);
    assert.equal((r.stderr.match(/it had arrived whole/g) ?? []).length, 2, r.stderr);
    assert.match(
      r.stderr,
      /b\/relevé ✓\.csv: .*asking the server whether it arrived, else uploading it again \(attempt 2 of 6\)/,
    );
    const [task] = ofKind(lines, "task");
    const [summary] = ofKind(lines, "summary");
    assert.equal(summary?.taskId, task?.taskId);
    assert.equal(summary?.succeededCount, 7);
  } finally {
    proxy.close();
  }
});

test("an upload answered 504 is sent again with its key: the server answers the first try's file, never a second", async () => {
  const dir = path.join(suite.work, "lents");
  fs.mkdirSync(dir, { recursive: true });
  const bytes = csv(40, 31);
  fs.writeFileSync(path.join(dir, "lent «a».csv"), bytes);
  const sha256 = createHash("sha256").update(bytes).digest("hex");
  const before = new Set(
    (await apiAll<{ fileId: string }>(suite.server, suite.token, "/api/files")).map((f) => f.fileId),
  );
  // The first try is stored and its answer replaced by a 504; every look-up by its hash misses (a
  // server older than the key would not find it either, or not yet): the retry sends it again.
  const resent = async () => {
    const proxy = await faultyProxy(({ method, path: p, query, file, nth }) => {
      if (method === "POST" && file === "lent «a».csv") return nth === 1 ? "timeout504" : "pass";
      if (method === "GET" && p === "/api/files" && query.includes(sha256)) return "noFiles";
      return "pass";
    });
    try {
      const r = await run(["submit", "--type", "summary", dir, "--follow"], proxy.url);
      assert.equal(r.code, 0, r.stderr);
      assert.deepEqual(
        proxy.seen.filter((x) => x.file !== undefined).map((x) => x.fault),
        ["timeout504", "pass"],
        "sent again after the 504",
      );
      const [file] = ofKind(jsonLines(r.stdout), "file") as (Line & { fileId: string })[];
      const made = (
        await apiAll<{ fileId: string; sha256: string }>(suite.server, suite.token, "/api/files")
      ).filter((f) => !before.has(f.fileId));
      assert.deepEqual(
        made.map((f) => f.fileId),
        [file?.fileId],
        "one file: the resend was answered with the first try's",
      );
      assert.equal(made[0]?.sha256, sha256);
      assert.equal(ofKind(jsonLines(r.stdout), "summary")[0]?.succeededCount, 1);
    } finally {
      proxy.close();
    }
  };
  // Side by side with the above (its pauses take 12.5 s): a 504 from the proxy alone, the server never
  // asked, makes no file there.
  const givenUp = async () => {
    const elsewhere = path.join(suite.work, "jamais");
    fs.mkdirSync(elsewhere);
    fs.writeFileSync(path.join(elsewhere, "jamais.csv"), csv(40, 37));
    const never = await faultyProxy(({ method, file }) =>
      method === "POST" && file === "jamais.csv" ? "gatewayTimeout" : "pass",
    );
    try {
      const r = await run(["submit", "--type", "summary", path.join(elsewhere, "jamais.csv")], never.url);
      assert.equal(r.code, 3, r.stderr);
      assert.deepEqual(
        never.seen.filter((x) => x.file !== undefined).map((x) => x.fault),
        Array(6).fill("gatewayTimeout"),
        "sent again after each 504, 6 attempts in all",
      );
      assert.match(r.stderr, /gave up after 6 attempts/);
    } finally {
      never.close();
    }
  };
  await Promise.all([resent(), givenUp()]);
});

test("a 500 or a 4xx is not asked again; a gateway that stays down is given up after 6 attempts (exit 3)", async () => {
  // Side by side: none of the four reaches the server, and two wait out all 5 pauses (12.5 s).
  await Promise.all([
    (async () => {
      const down = await faultyProxy(({ method }) => (method === "GET" ? "serverError" : "pass"));
      try {
        const r = await run(["status", taskId], down.url);
        assert.equal(r.code, 3, r.stderr);
        assert.ok(down.seen.length > 0);
        const asked = down.seen.map((s) => s.path);
        assert.equal(new Set(asked).size, asked.length, `each asked once: ${asked}`);
        assert.doesNotMatch(r.stderr, /trying again/);
      } finally {
        down.close();
      }
    })(),
    (async () => {
      const missing = await faultyProxy(({ method }) => (method === "GET" ? "notFound" : "pass"));
      try {
        const r = await run(["tasks"], missing.url);
        assert.equal(r.code, 2, r.stderr);
        assert.equal(missing.seen.length, 1);
      } finally {
        missing.close();
      }
    })(),
    (async () => {
      const gone = await faultyProxy(() => "badGateway");
      try {
        const r = await run(["tasks"], gone.url);
        assert.equal(r.code, 3, r.stderr);
        assert.equal(gone.seen.length, 6);
        const [error] = ofKind(jsonLines(r.stdout), "error");
        assert.equal(error?.code, "HTTP_502");
        assert.equal(error?.exitCode, 3);
        assert.match(
          String(error?.message),
          /^reading \/api\/analysis-tasks: HTTP 502 Bad Gateway; gave up after 6 attempts \(HTTP_502\)$/,
        );
        assert.equal((r.stderr.match(/trying again/g) ?? []).length, 5);
      } finally {
        gone.close();
      }
    })(),
    (async () => {
      const dropping = await faultyProxy(() => "drop");
      try {
        const r = await run(["files"], dropping.url);
        assert.equal(r.code, 3, r.stderr);
        assert.equal(dropping.seen.length, 6);
        const [error] = ofKind(jsonLines(r.stdout), "error");
        assert.equal(error?.code, "CONNECTION_FAILED");
        assert.match(String(error?.message), /^reading \/api\/files: .*; gave up after 6 attempts$/);
      } finally {
        dropping.close();
      }
    })(),
  ]);
});

/** Resolves once `child` has printed `pattern` on stderr. */
function stderrShows(child: ChildProcess, pattern: RegExp): Promise<void> {
  let text = "";
  return new Promise((resolve, reject) => {
    child.stderr?.on("data", (c: Buffer) => {
      text += c.toString();
      if (pattern.test(text)) resolve();
    });
    child.on("close", () => reject(new Error(`exited before printing ${pattern}:\n${text}`)));
  });
}

test("Ctrl-C during a retry's pause ends the command at once (exit 130): a GET's, and an upload's with no task created", async () => {
  // Side by side: the GET never reaches the server, and the upload makes no task there.
  await Promise.all([
    (async () => {
      const proxy = await faultyProxy(() => "badGateway");
      try {
        const child = spawnCli(["tasks"], suite.env({ ASSAY_URL: proxy.url }));
        const done = collect(child);
        // Said just before the pause of 4 s.
        await within(stderrShows(child, /attempt 5 of 6/), 30_000, "the fourth retry's note");
        const t0 = performance.now();
        child.kill("SIGINT");
        const r = await within(done, 10_000, "tasks to end after Ctrl-C");
        assert.equal(r.code, 130, r.stderr);
        assert.ok(performance.now() - t0 < 2000, `ended within the pause (${performance.now() - t0} ms)`);
        assert.equal(ofKind(jsonLines(r.stdout), "interrupted").length, 1);
      } finally {
        proxy.close();
      }
    })(),
    (async () => {
      const dir = path.join(suite.work, "interrompu");
      fs.mkdirSync(dir);
      fs.writeFileSync(path.join(dir, "jamais envoyé ✓.csv"), csv(10, 31));
      const tasksBefore = (await apiAll(suite.server, suite.token, "/api/analysis-tasks")).length;
      const uploads = await faultyProxy(({ method }) => (method === "POST" ? "badGateway" : "pass"));
      try {
        const child = spawnCli(["submit", "--type", "summary", dir], suite.env({ ASSAY_URL: uploads.url }));
        const done = collect(child);
        await within(
          stderrShows(child, /jamais envoyé ✓\.csv: .*\(attempt 5 of 6\)/),
          30_000,
          "the upload's fourth retry",
        );
        const t0 = performance.now();
        child.kill("SIGINT");
        const r = await within(done, 10_000, "submit to end after Ctrl-C");
        assert.equal(r.code, 130, r.stderr);
        assert.ok(performance.now() - t0 < 2000, `ended within the pause (${performance.now() - t0} ms)`);
        assert.match(r.stderr, /interrupted: no task was created/);
        assert.equal((await apiAll(suite.server, suite.token, "/api/analysis-tasks")).length, tasksBefore);
        assert.ok(!uploads.seen.some((s) => s.method === "POST" && s.path === "/api/analysis-tasks"));
      } finally {
        uploads.close();
      }
    })(),
  ]);
});
