// Downloads to a client that stops reading: a paused browser download, a hung program. Each holds its
// connection and what it reads (a local file's descriptor, an S3 socket) until DOWNLOAD_STALL_MS of
// no progress cuts it off.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { once } from "node:events";
import fs from "node:fs";
import http from "node:http";
import type net from "node:net";
import path from "node:path";
import type { Readable } from "node:stream";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { DOWNLOAD_STALL_MS } from "../../src/http/routes/downloads.ts";
import { LocalStore } from "../../src/storage/local.ts";
import { bearer } from "../helpers/app.ts";
import { waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";
import { scratchDir } from "../helpers/tmp.ts";

let env: RunnerEnv;
let app: FastifyInstance;
let token: string;
let port: number;
const logs: Record<string, unknown>[] = [];
/** The server's side of each connection, in the order they came. */
const serverSockets: net.Socket[] = [];
/** Every output stream the store opened. */
const opened: Readable[] = [];
/** The test's clients, ended before the app closes (a paused one would hold its connection). */
const clients: http.ClientRequest[] = [];

/** More than the sockets' buffers hold, zipped or not (random: deflate cannot shrink it much). */
const big = () => randomBytes(8 * 1024 * 1024).toString("base64");

before(async () => {
  const local = new LocalStore(scratchDir("assay-dl-stall-"));
  const store = new Proxy(local, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (prop !== "open" || typeof value !== "function") return value;
      return async (key: string) => {
        const real = await value.call(target, key);
        if (key.startsWith("outputs/")) opened.push(real.stream);
        return real;
      };
    },
  });
  env = await runnerEnv({ store });
  app = await env.app(logs);
  token = (await tokenCreate(env.db.sql, "pausé-user")).token;
  await app.listen({ port: 0, host: "127.0.0.1" });
  app.server.on("connection", (s: net.Socket) => serverSockets.push(s));
  port = (app.server.address() as net.AddressInfo).port;
});
after(async () => {
  for (const c of clients) c.destroy();
  await env.close();
});

/** A client that reads the response's head and then nothing; resolves with the server's side. */
async function stalledClient(url: string): Promise<{ client: http.ClientRequest; server: net.Socket }> {
  const known = serverSockets.length;
  const req = http.get({ host: "127.0.0.1", port, path: url, headers: bearer(token), agent: false });
  req.on("error", () => {});
  clients.push(req);
  const [res] = (await once(req, "response")) as [http.IncomingMessage];
  assert.equal(res.statusCode, 200, url);
  res.pause();
  for (;;) {
    const server = serverSockets[known];
    // Stalled: the kernel's buffers are full, the response waits in the server's own.
    if (server && server.writableLength > 0) return { client: req, server };
    await new Promise((r) => setTimeout(r, 20));
  }
}

test("a download whose client stops reading is cut off after DOWNLOAD_STALL_MS; what it read is released", {
  timeout: 120_000,
}, async () => {
  const w = env.worker([fixtureProgram("dl-paused")]);
  await w.start();
  const spec = (name: string, content: string) =>
    env.file(JSON.stringify({ files: { [name]: content }, result: name, metrics: { rows: 1 } }));
  const one = await env.task("dl-paused", [await spec("report.html", big())], { mode: "input" });
  const many = await env.task("dl-paused", [await spec("r.json", big()), await spec("r.json", "{}")], {
    mode: "input",
  });
  await waitForTerminal(env.db.sql, one);
  await waitForTerminal(env.db.sql, many);
  await w.stop();
  await env.db.sql`update tasks set owner_id = (select id from users where name = 'pausé-user')`;
  // A results table wider than the socket buffers: many metric keys on every row.
  await env.db.sql`
    update runs set result = jsonb_set(result, '{metrics}',
      (select jsonb_object_agg('métrique, "n°' || i || '"', i) from generate_series(1, 300000) i))
    where task_id = ${many}`;
  const [run] = await env.db.sql<{ id: string }[]>`
    select r.id::text as id from runs r where r.task_id = ${one}`;
  const link = await app.inject({
    method: "POST",
    url: `/api/analysis-tasks/${one}/runs/${run?.id}/outputs/report.html/link`,
    headers: bearer(token),
  });
  assert.equal(link.statusCode, 200, link.body);
  const urls = [
    `/api/analysis-tasks/${one}/download`,
    `/api/analysis-tasks/${many}/download`,
    `/api/analysis-tasks/${many}/results.csv`,
    `/api/analysis-tasks/${one}/runs/${run?.id}/outputs/report.html`,
    link.json().data.url as string,
  ];
  for (const url of urls) {
    const streams = opened.length;
    const { client, server } = await stalledClient(url);
    // The bound is armed on the connection while the response waits for its reader.
    assert.equal(server.timeout, DOWNLOAD_STALL_MS, url);
    const reading = opened.slice(streams).filter((s) => !s.destroyed);
    const cut = logs.filter((l) => l.msg === "download cut off: its client took nothing for too long").length;
    // Its timer, made short: the connection is cut, and what the response read is released.
    server.setTimeout(50);
    if (!server.destroyed) await once(server, "close");
    client.destroy(); // (a paused client would never read the end)
    for (const s of reading) if (!s.closed) await once(s, "close");
    if (!url.startsWith("/view/")) {
      // (A view link's requests log at `warn` only: the link is a capability.)
      assert.equal(
        logs.filter((l) => l.msg === "download cut off: its client took nothing for too long").length,
        cut + 1,
        url,
      );
    }
  }
  // No output file is left open by the process.
  const outputs = path.join((env.storage as LocalStore).root, "outputs");
  const open = fs
    .readdirSync("/proc/self/fd")
    .map((fd) => {
      try {
        return fs.readlinkSync(`/proc/self/fd/${fd}`);
      } catch {
        return "";
      }
    })
    .filter((target) => target.startsWith(outputs));
  assert.deepEqual(open, []);
});
