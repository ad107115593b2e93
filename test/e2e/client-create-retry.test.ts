// `assay submit` when the API restarts while the task is being created: the first create commits
// but its answer is lost, and the API is then down (a reverse proxy answering 502, the closing
// server 503) for longer than a few retries. The client keeps asking with the same Idempotency-Key
// until the API is back, so the task exists once and the command says which; it never exits 3 over
// a task it did create (whose re-run, with a fresh key, would make a second one).
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { collect, spawnCli } from "../helpers/cli.ts";
import { type ClientServer, csv, jsonLines, ofKind, startClientServer, within } from "../helpers/client.ts";
import { idsCrossPowerOfTen, waitFor } from "../helpers/queue.ts";

let server: ClientServer;
let work: string;

before(async () => {
  server = await startClientServer({ concurrency: 1 });
  work = fs.mkdtempSync(path.join(os.tmpdir(), "assay-client-create-"));
});

after(async () => {
  await server.close();
  fs.rmSync(work, { recursive: true, force: true });
});

/**
 * A reverse proxy in front of the server. The first task creation is passed on and committed, then
 * its connection is cut before the answer and the server restarted (`restarted` settles when it is
 * up again); while the server is away every request gets the proxy's 502 page, as nginx answers.
 */
async function restartingProxy() {
  const backend = new URL(server.url);
  const keys: string[] = [];
  let restarted: Promise<void> | undefined;
  const proxy = http.createServer((req, res) => {
    const isCreate = req.method === "POST" && req.url === "/api/analysis-tasks";
    if (isCreate) keys.push(String(req.headers["idempotency-key"]));
    const up = http.request(
      { host: backend.hostname, port: backend.port, method: req.method, path: req.url, headers: req.headers },
      (answer) => {
        if (isCreate && restarted === undefined) {
          answer.resume();
          req.socket.destroy();
          // Started again only once a retry has met the 502 page: under load a quick restart was
          // over before the first retry, which then went straight through.
          restarted = server
            .stop()
            .then(() => waitFor(async () => keys.length >= 2, 60_000, "a retry during the restart"))
            .then(() => server.start());
          return;
        }
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    up.on("error", () => {
      if (res.headersSent) return res.destroy();
      res.writeHead(502, { "content-type": "text/html" });
      res.end("<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>");
    });
    req.pipe(up);
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`,
    keys,
    restarted: () => restarted,
    close: () => {
      proxy.closeAllConnections();
      proxy.close();
    },
  };
}

test("an API restart during the task's creation: the client retries with its key until the API is back, one task", async () => {
  const token = await server.token("érin 🚀");
  const dir = path.join(work, "relevés");
  fs.mkdirSync(dir);
  for (let i = 0; i < 12; i++) fs.writeFileSync(path.join(dir, `mesure ${i} — ✓.csv`), csv(20, i + 1));
  // Task ids past a digit boundary: one compared as text would come out wrong.
  await idsCrossPowerOfTen(server.db.sql, "tasks", 0);
  const proxy = await restartingProxy();
  try {
    const child = spawnCli(["submit", "--type", "summary", dir], server.env(token, { ASSAY_URL: proxy.url }));
    const r = await within(collect(child), 120_000, "submit across the restart", () => server.log());
    await proxy.restarted();
    assert.equal(r.code, 0, r.stderr);
    const [task] = ofKind(jsonLines(r.stdout), "task");
    const rows = await server.db.sql<{ id: string; total: number }[]>`
      select t.id::text as id, t.total_count as total from tasks t join users u on u.id = t.owner_id
      where u.name = 'érin 🚀'`;
    assert.equal(rows.length, 1, "one task, not one per attempt");
    assert.equal(task?.taskId, rows[0]?.id, "the task printed is the one created");
    assert.equal(rows[0]?.total, 12);
    const [files] = await server.db.sql<{ n: number }[]>`
      select count(*)::int as n from files f join users u on u.id = f.owner_id where u.name = 'érin 🚀'`;
    assert.equal(files?.n, 12, "nothing uploaded twice");
    assert.ok(proxy.keys.length >= 3, `retried across the restart (${proxy.keys.length} attempts)`);
    assert.equal(new Set(proxy.keys).size, 1, "every attempt with the same Idempotency-Key");
    assert.match(r.stderr, /retrying/);
  } finally {
    proxy.close();
  }
});
