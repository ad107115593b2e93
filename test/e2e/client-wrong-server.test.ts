// The real client (`bin/assay.js`, a child process) pointed at something that is not quite the API:
// a proxy that redirects, another service's JSON, a download whose connection breaks off. Each is
// exit 3 with the error code `CONNECTION_FAILED` and a message that says what is wrong — not a
// crash on a missing field, not "check ASSAY_TOKEN", not a 3xx taken for the user's mistake (exit 2),
// and never a file under its own name that is not whole. These servers are the test's own: the
// faults are what matters, and a real API does not make them.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { cleanEnv, collect, spawnCli } from "../helpers/cli.ts";
import { jsonLines, ofKind } from "../helpers/client.ts";

const work = fs.mkdtempSync(path.join(os.tmpdir(), "assay-client-wrong-"));
after(() => fs.rmSync(work, { recursive: true, force: true }));

const TOKEN = "assay_0123456789abcdef";

async function serve(handler: http.RequestListener): Promise<{ url: string; close: () => void }> {
  const server = http.createServer(handler);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

const json = (res: http.ServerResponse, status: number, body: unknown) => {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
};

async function run(args: string[], url: string, token = TOKEN) {
  const r = await collect(spawnCli(args, cleanEnv({ ASSAY_URL: url, ASSAY_TOKEN: token })));
  const [error] = ofKind(jsonLines(r.stdout), "error");
  assert.ok(!`${r.stdout}${r.stderr}`.includes(TOKEN), "the token is not printed");
  return { ...r, error };
}

test("a redirect is not followed: exit 3 saying where it points, and the token goes nowhere else", async () => {
  const elsewhere: http.IncomingHttpHeaders[] = [];
  const target = await serve((req, res) => {
    elsewhere.push(req.headers);
    json(res, 401, { code: "UNAUTHORIZED", message: "Missing or invalid token." });
  });
  // A proxy that sends the API's reads to another address, and its uploads with a 307.
  const proxy = await serve((req, res) => {
    if (req.method === "GET" && req.url === "/api/analysis-types")
      return json(res, 200, {
        code: "OK",
        message: "OK",
        data: {
          items: [
            {
              name: "summary",
              description: "",
              parameters: { type: "object", properties: {}, additionalProperties: false },
              available: true,
              reason: null,
              workers: 1,
            },
          ],
        },
      });
    if (req.method === "GET" && req.url?.startsWith("/api/files"))
      return json(res, 200, { code: "OK", message: "OK", data: { items: [], nextCursor: null } });
    req.resume();
    // A presigned-looking query: where it points is said, its secrets are not.
    res.writeHead(req.method === "POST" ? 307 : 301, {
      location: `${target.url}${req.url}${req.url?.includes("?") ? "&" : "?"}X-Amz-Signature=s3cr3t`,
    });
    res.end();
  });
  const file = path.join(work, "relevé — ✓ 1000000.csv");
  fs.writeFileSync(file, "id,value\n1,2\n");
  try {
    const read = await run(["status", "100000042"], proxy.url);
    const upload = await run(["submit", "--type", "summary", file], proxy.url);
    for (const r of [read, upload]) {
      assert.equal(r.code, 3, r.stderr);
      assert.equal(r.error?.code, "CONNECTION_FAILED", r.stdout);
      assert.match(String(r.error?.message), new RegExp(`redirect to ${target.url}/api/`));
      assert.doesNotMatch(`${r.stdout}${r.stderr}`, /s3cr3t/);
    }
    assert.equal(elsewhere.length, 0, "nothing was sent where the redirect pointed");
  } finally {
    proxy.close();
    target.close();
  }
});

test("another service's JSON at ASSAY_URL is exit 3 asking whether it is an Assay server, not a crash", async () => {
  const other = await serve((req, res) => {
    req.resume();
    json(res, 200, { status: "ok", version: "1.2.3" });
  });
  try {
    for (const args of [["tasks"], ["status", "100000042"], ["types"]]) {
      const r = await run(args, other.url);
      assert.equal(r.code, 3, r.stderr);
      assert.equal(r.error?.code, "CONNECTION_FAILED", r.stdout);
      assert.match(String(r.error?.message), /is it an Assay server\?/);
    }
  } finally {
    other.close();
  }
});

test("a download whose connection breaks off mid-body is exit 3 CONNECTION_FAILED and leaves no file", async () => {
  const task = {
    taskId: "100000042",
    status: "succeeded",
    analysisType: "summary",
    totalCount: 1,
    succeededCount: 1,
    failedCount: 0,
    timedOutCount: 0,
    cancelledCount: 0,
    createdAt: "2026-12-06T00:00:00.000Z",
    finishedAt: "2026-12-06T00:00:01.000Z",
  };
  const run999 = { runId: "999999999", fileName: "entrée ✓.csv", status: "succeeded" };
  const ok = (data: unknown) => ({ code: "OK", message: "OK", data });
  const server = await serve((req, res) => {
    const url = req.url ?? "";
    if (url === "/api/analysis-tasks/100000042") return json(res, 200, ok(task));
    if (url.startsWith("/api/analysis-tasks/100000042/runs?"))
      return json(res, 200, ok({ items: [run999], nextCursor: null }));
    if (url === "/api/analysis-tasks/100000042/runs/999999999/outputs")
      return json(res, 200, ok({ items: [{ name: "résumé.json", sizeBytes: 100_000 }] }));
    // The output's body: half of it, then the connection is gone.
    res.writeHead(200, { "content-type": "application/json", "content-length": "100000" });
    res.write(Buffer.alloc(50_000, "x"));
    setTimeout(() => req.socket.destroy(), 20);
  });
  const out = path.join(work, "sortie");
  try {
    const r = await run(["download", "100000042", "--out", out], server.url);
    assert.equal(r.code, 3, r.stderr);
    assert.equal(r.error?.code, "CONNECTION_FAILED", r.stdout);
    assert.match(String(r.error?.message), /résumé\.json of run 999999999: the connection to .* broke/);
    const files = (fs.readdirSync(out, { recursive: true }) as string[]).filter((p) =>
      fs.statSync(path.join(out, p)).isFile(),
    );
    assert.deepEqual(files, [], "neither résumé.json nor its temporary file");
  } finally {
    server.close();
  }
});
