// A proxy's own 4xx page in front of a real `assay all` (nginx's HTML 404 for a path it does not
// route, its 413 for a body over its limit): the answer did not come from the API, so the real client
// (a child process) says so — exit 3 `CONNECTION_FAILED`, asked once — like any other answer that is
// not the API's, rather than exit 2 `HTTP_404` as if the user had named a task that is not theirs;
// the `follow` stream is not retried for ten minutes either. The API's own 4xx through the same
// proxy stays what it is (exit 2 with the API's code).
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { collect, spawnCli } from "../helpers/cli.ts";
import {
  apiProxy,
  clientSuite,
  csv,
  jsonLines,
  type Line,
  ofKind,
  submitHostilePair,
  within,
} from "../helpers/client.ts";

/** A task that ended, submitted straight to the server. */
let taskId: string;

const suite = clientSuite({
  user: "nginx «победа» ✓",
  scratch: "assay-client-proxy-pages-",
  ids: { tasks: 0, runs: 1 },
  setup: async () => {
    taskId = await submitHostilePair(suite);
  },
});

const PAGE = (status: number, text: string) =>
  `<html>\r\n<head><title>${status} ${text}</title></head>\r\n<body>\r\n<center><h1>${status} ${text}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n`;

/**
 * A proxy in front of the server: a request `page` picks (by method and path) gets that status and
 * an HTML page of the proxy's own, the server never asked; every other passes through.
 */
async function proxy(page: (method: string, path: string) => [number, string] | undefined) {
  const asked: string[] = [];
  const p = await apiProxy(suite.server.url, (req, res) => {
    const method = req.method ?? "GET";
    const url = req.url ?? "/";
    const own = page(method, url.split("?")[0] ?? url);
    if (!own) return false;
    asked.push(`${method} ${url.split("?")[0]}`);
    req.resume();
    req.on("end", () => {
      res.writeHead(own[0], { "content-type": "text/html" });
      res.end(PAGE(own[0], own[1]));
    });
    return true;
  });
  return {
    ...p,
    /** The requests the proxy answered itself. */
    asked,
  };
}

async function run(args: string[], url: string) {
  const r = await within(
    collect(spawnCli(args, suite.env({ ASSAY_URL: url }))),
    60_000,
    `assay ${args.join(" ")}`,
    () => suite.server.log(),
  );
  const [error] = ofKind(jsonLines(r.stdout), "error") as (Line & { code: string; message: string })[];
  return { ...r, error };
}

/** Exit 3, CONNECTION_FAILED, naming the status and that it is not the API's answer. */
function notTheApi(r: Awaited<ReturnType<typeof run>>, status: number) {
  assert.equal(r.code, 3, `${r.stdout}\n${r.stderr}`);
  assert.equal(r.error?.code, "CONNECTION_FAILED", r.stdout);
  assert.match(r.error?.message ?? "", new RegExp(`HTTP ${status} .*not the API's`));
  assert.doesNotMatch(r.stderr, /trying again/, "not asked again");
}

test("a proxy's HTML 404 for the API's reads is exit 3 CONNECTION_FAILED; the API's own 404 through it is exit 2", async () => {
  const p = await proxy((_method, route) =>
    route.startsWith(`/api/analysis-tasks/${taskId}`) ? [404, "Not Found"] : undefined,
  );
  try {
    for (const args of [
      ["status", taskId],
      ["download", taskId, "--out", path.join(suite.work, "dl-404")],
    ]) {
      notTheApi(await run(args, p.url), 404);
    }
    assert.ok(p.asked.length >= 2, "the proxy answered");
    // A task that is not there, asked through the same proxy: the API's own 404.
    const missing = await run(["status", "999999999"], p.url);
    assert.equal(missing.code, 2, missing.stderr);
    assert.equal(missing.error?.code, "ANALYSIS_TASK_NOT_FOUND");
  } finally {
    p.close();
  }
});

test("a proxy's HTML 404 for an output or the event stream, and its 413 for an upload, are exit 3, asked once", async () => {
  const p = await proxy((method, route) => {
    if (route.includes("/outputs/")) return [404, "Not Found"];
    if (route.endsWith("/events")) return [404, "Not Found"];
    if (method === "POST" && route === "/api/files") return [413, "Request Entity Too Large"];
    return undefined;
  });
  try {
    const started = Date.now();
    const follow = await run(["follow", taskId], p.url);
    notTheApi(follow, 404);
    assert.ok(Date.now() - started < 30_000, "the stream was not retried");

    const out = path.join(suite.work, "dl-outputs");
    notTheApi(await run(["download", taskId, "--out", out], p.url), 404);
    const left = (fs.readdirSync(out, { recursive: true }) as string[]).filter((f) =>
      fs.statSync(path.join(out, f)).isFile(),
    );
    assert.deepEqual(left, [], "no file, whole or temporary");

    const big = path.join(suite.work, "grand fichier ✓.csv");
    fs.writeFileSync(big, csv(500, 13));
    const upload = await run(["submit", "--type", "summary", big], p.url);
    notTheApi(upload, 413);
    assert.equal(ofKind(jsonLines(upload.stdout), "task").length, 0, "no task created");
    assert.equal(p.asked.filter((a) => a === "POST /api/files").length, 1, "the upload was sent once");
  } finally {
    p.close();
  }
});

test("a proxy's 200 page (an app's index.html) or redirect for the event stream ends follow at once with exit 3, not a loop", async () => {
  // A task that runs for a while: each file keeps a worker slot busy (python-stats' median).
  const slow = path.join(suite.work, "lent");
  fs.mkdirSync(slow);
  for (let i = 0; i < 6; i++) fs.writeFileSync(path.join(slow, `lent ${i} ✓.csv`), csv(60_000, i + 3));
  const created = await collect(
    spawnCli(["submit", "--type", "python-stats", "--param", "method=median", slow], suite.env()),
  );
  assert.equal(created.code, 0, created.stderr);
  const running = String(ofKind(jsonLines(created.stdout), "task")[0]?.taskId);
  // The stream alone: a 200 page of HTML, then a redirect (a proxy that moved it).
  let stream: [number, string] = [200, "OK"];
  const p = await proxy((_method, route) => (route.endsWith("/events") ? stream : undefined));
  try {
    for (const [answer, says] of [
      [[200, "OK"], /"text\/html", not text\/event-stream: not the API's answer/],
      [[301, "Moved Permanently"], /answers with a redirect/],
    ] as const) {
      stream = [...answer];
      for (const args of [
        ["follow", running],
        ["logs", running, "--follow"],
      ]) {
        const before = p.asked.length;
        const r = await run(args, p.url);
        assert.equal(r.code, 3, `${r.stdout}\n${r.stderr}`);
        assert.equal(r.error?.code, "CONNECTION_FAILED", r.stdout);
        assert.match(r.error?.message ?? "", says);
        assert.equal(p.asked.length - before, 1, `the stream was asked once: ${p.asked.length - before}`);
      }
    }
  } finally {
    p.close();
    await collect(spawnCli(["cancel", running], suite.env()));
  }
});
