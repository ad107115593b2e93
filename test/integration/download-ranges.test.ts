// Resumable downloads of one stored object (a run's output, through each route that serves one): a
// strong ETag, If-None-Match → 304, one Range → 206, an unsatisfiable one → 416, If-Range. Against
// both stores — a local directory and an S3-compatible server — with real programs and a real worker;
// the resume goes over a real socket.
import assert from "node:assert/strict";
import fs from "node:fs";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import type { LocalStore } from "../../src/storage/local.ts";
import { bearer } from "../helpers/app.ts";
import { waitFor, waitForTerminal } from "../helpers/queue.ts";
import { type RunnerEnv, runnerEnv, writeProgram } from "../helpers/runner.ts";
import { startTcpProxy } from "../helpers/tcp-proxy.ts";

/** Past a local read's 64 KiB buffer and not a round number: every byte value, in no simple order. */
const SIZE = 70_003;
const content = Buffer.from(Array.from({ length: SIZE }, (_, i) => (i * 7 + (i >> 8)) & 0xff));
const NOTES = "naïve café ✓ — «quoted» 日本語\n";

/** What a run of the program writes: `report.png` (its result), `notes.txt` and an empty `empty.txt`. */
const PROGRAM = `
const bytes = Buffer.from(Array.from({ length: ${SIZE} }, (_, i) => (i * 7 + (i >> 8)) & 0xff));
fs.writeFileSync(path.join(out, "report.png"), bytes);
fs.writeFileSync(path.join(out, "notes.txt"), ${JSON.stringify(NOTES)});
fs.writeFileSync(path.join(out, "empty.txt"), "");
say({ type: "result", outputFileName: "report.png", metrics: { bytes: bytes.length } });`;

interface Setup {
  env: RunnerEnv;
  app: FastifyInstance;
  token: string;
  taskId: string;
  runId: string;
}

async function setup(env: RunnerEnv): Promise<Setup> {
  const app = await env.app();
  const { token } = await tokenCreate(env.db.sql, "runner");
  const type = "ranges";
  const program = writeProgram(env.dataDir, type, PROGRAM);
  const file = await env.file("a,b\n1,2\n");
  // A name a user could give: not ASCII, with quotes and a path-like part.
  await env.db.sql`update files set name = ${'../Ünïcödé "résumé" 1.csv'} where id = ${file}`;
  const taskId = await env.task(type, [file], {});
  const w = env.worker([{ type, executable: process.execPath, ...program }]);
  await w.start();
  await waitForTerminal(env.db.sql, taskId);
  await w.stop();
  const [run] = await env.db.sql<{ id: string; status: string }[]>`
    select id::text, status from runs where task_id = ${taskId}`;
  assert.equal(run?.status, "succeeded");
  return { env, app, token, taskId, runId: run?.id as string };
}

/** A request the S3 server was sent: its method, path and Range header. */
interface S3Request {
  method: string;
  path: string;
  range: string | undefined;
}

/**
 * Each store; the bucket's is reached through a TCP proxy that notes every request sent to it (the
 * requests of a download are GETs and HEADs: no body follows their headers).
 */
const backends: [
  string,
  () => Promise<{ env: RunnerEnv; requests?: S3Request[]; drop?: () => Promise<void> }>,
][] = [
  ["local", async () => ({ env: await runnerEnv() })],
  [
    "s3",
    async () => {
      const { createTestBucket } = await import("../helpers/s3.ts");
      const { S3Store } = await import("../../src/storage/s3.ts");
      const bucket = await createTestBucket();
      const requests: S3Request[] = [];
      const proxy = await startTcpProxy(bucket.endpoint, {
        fromClient: (chunk) => {
          for (const head of chunk.toString("latin1").split("\r\n\r\n")) {
            const m = /^(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP\/1\.1\r\n/.exec(head);
            if (m) {
              const range = /\r\nrange: *([^\r]*)/i.exec(head)?.[1];
              requests.push({ method: m[1] as string, path: m[2] as string, range });
            }
          }
          return "pass";
        },
      });
      const store = new S3Store({
        bucket: bucket.name,
        prefix: "ranges/",
        endpoint: proxy.url,
        forcePathStyle: true,
      });
      const env = await runnerEnv({
        store,
        configEnv: { ...bucket.env, ASSAY_S3_PREFIX: "ranges/" },
      });
      return {
        env,
        requests,
        drop: async () => {
          store.client.destroy();
          await proxy.close();
          await bucket.drop();
        },
      };
    },
  ],
];

for (const [kind, make] of backends) {
  describe(`${kind} store`, () => {
    let s: Setup;
    let requests: S3Request[] | undefined;
    let drop: (() => Promise<void>) | undefined;
    before(async () => {
      const made = await make();
      drop = made.drop;
      requests = made.requests;
      s = await setup(made.env);
    });
    after(async () => {
      await s.env.close();
      await drop?.();
    });

    /** The routes that serve report.png whole. */
    const urls = () => [
      `/api/analysis-tasks/${s.taskId}/download`,
      `/api/analysis-tasks/${s.taskId}/runs/${s.runId}/download`,
      `/api/analysis-tasks/${s.taskId}/runs/${s.runId}/outputs/report.png`,
    ];
    const get = (url: string, headers: Record<string, string> = {}) =>
      s.app.inject({ url, headers: { ...bearer(s.token), ...headers } });
    const etagOf = async (url: string) => String((await get(url)).headers.etag);

    test("the whole file advertises ranges and a strong ETag, the same on every route that serves it", async () => {
      const tags = new Set<string>();
      for (const url of urls()) {
        const res = await get(url);
        assert.equal(res.statusCode, 200, url);
        assert.equal(res.headers["accept-ranges"], "bytes", url);
        assert.equal(res.headers["content-length"], String(SIZE), url);
        assert.equal(res.headers["content-range"], undefined, url);
        assert.deepEqual(res.rawPayload, content, url);
        const etag = String(res.headers.etag);
        assert.match(etag, /^"[A-Za-z0-9_-]{27}"$/, "strong, and nothing of the key or the user");
        tags.add(etag);
      }
      assert.equal(tags.size, 1);
      // Another object of the same run has another ETag.
      const notes = await get(`/api/analysis-tasks/${s.taskId}/runs/${s.runId}/outputs/notes.txt`);
      assert.equal(notes.body, NOTES);
      assert.notEqual(notes.headers.etag, [...tags][0]);
    });

    test("one range → 206 with exactly its bytes, Content-Range and Content-Length; type and disposition kept", async () => {
      const cases: [string, number, number][] = [
        ["bytes=0-99", 0, 99],
        ["bytes=5-5", 5, 5],
        ["bytes=65530-65545", 65530, 65545],
        ["bytes=70000-", 70000, SIZE - 1],
        ["bytes=-5", SIZE - 5, SIZE - 1],
        ["bytes=100-99999999999", 100, SIZE - 1],
        ["bytes=-99999999999999999999999", 0, SIZE - 1],
        ["BYTES = 1-2", 1, 2],
        ["bytes=, 10-19 ,", 10, 19],
        [`bytes=${SIZE - 1}-${SIZE - 1}`, SIZE - 1, SIZE - 1],
      ];
      for (const url of urls()) {
        const whole = await get(url);
        for (const [range, start, end] of cases) {
          const res = await get(url, { range });
          assert.equal(res.statusCode, 206, `${url} ${range}`);
          assert.equal(res.headers["content-range"], `bytes ${start}-${end}/${SIZE}`, range);
          assert.equal(res.headers["content-length"], String(end - start + 1), range);
          assert.deepEqual(res.rawPayload, content.subarray(start, end + 1), range);
          assert.equal(res.headers.etag, whole.headers.etag);
          assert.equal(res.headers["content-type"], "image/png");
          assert.equal(res.headers["content-disposition"], whole.headers["content-disposition"]);
          assert.equal(res.headers["x-content-type-options"], "nosniff");
        }
      }
      // A range of a UTF-8 text cuts through a character: bytes, not characters.
      const res = await get(`/api/analysis-tasks/${s.taskId}/runs/${s.runId}/outputs/notes.txt`, {
        range: "bytes=3-4",
      });
      assert.equal(res.statusCode, 206);
      assert.deepEqual(res.rawPayload, Buffer.from(NOTES).subarray(3, 5));
      assert.equal(res.headers["content-security-policy"], "sandbox");
    });

    test("a range that selects no byte → 416 with Content-Range: bytes */size and an error envelope", async () => {
      for (const url of urls()) {
        for (const range of [
          `bytes=${SIZE}-`,
          `bytes=${SIZE + 10}-${SIZE + 20}`,
          "bytes=-0",
          "bytes=99999999999999999999999-",
        ]) {
          const res = await get(url, { range });
          assert.equal(res.statusCode, 416, `${url} ${range}`);
          assert.equal(res.headers["content-range"], `bytes */${SIZE}`);
          assert.match(String(res.headers["content-type"]), /^application\/json/);
          assert.deepEqual(res.json(), {
            code: "RANGE_NOT_SATISFIABLE",
            message: "The requested range is not satisfiable.",
          });
        }
      }
      // An empty file has no byte to send: every range is unsatisfiable, its whole is a 200.
      const empty = `/api/analysis-tasks/${s.taskId}/runs/${s.runId}/outputs/empty.txt`;
      for (const range of ["bytes=0-", "bytes=0-0", "bytes=-1"]) {
        const res = await get(empty, { range });
        assert.equal(res.statusCode, 416, range);
        assert.equal(res.headers["content-range"], "bytes */0");
      }
      const whole = await get(empty);
      assert.equal(whole.statusCode, 200);
      assert.equal(whole.headers["content-length"], "0");
    });

    test("several ranges, a malformed range or another unit → the whole file, 200", async () => {
      for (const range of [
        "bytes=0-1,5-6",
        "bytes=0-1, -3",
        "bytes=5-1",
        "bytes=abc",
        "bytes=--5",
        "bytes=1-2-3",
        "bytes=0x10-",
        "bytes 0-5",
        "items=0-5",
        "bytes=",
        "bytes=-",
        "bytes=٠-٥",
        `bytes=${"1".repeat(4000)}-x`,
      ]) {
        const res = await get(urls()[1] as string, { range });
        assert.equal(res.statusCode, 200, range);
        assert.equal(res.headers["content-range"], undefined, range);
        assert.deepEqual(res.rawPayload, content, range);
      }
    });

    test("If-None-Match naming the ETag (weakly, in a list, or *) → 304 without a body, before any range", async () => {
      for (const url of urls()) {
        const etag = await etagOf(url);
        for (const inm of [etag, `W/${etag}`, `"other", ${etag}`, "*"]) {
          for (const range of [undefined, "bytes=0-9", `bytes=${SIZE}-`]) {
            const res = await get(url, { "if-none-match": inm, ...(range ? { range } : {}) });
            assert.equal(res.statusCode, 304, `${url} ${inm} ${range}`);
            assert.equal(res.rawPayload.length, 0);
            assert.equal(res.headers.etag, etag);
            assert.equal(res.headers["content-range"], undefined);
          }
        }
        const other = await get(url, { "if-none-match": '"not-it", W/"neither"' });
        assert.equal(other.statusCode, 200);
        assert.deepEqual(other.rawPayload, content);
      }
    });

    test("If-Range: the range when it names the ETag, else the whole file", async () => {
      for (const url of urls()) {
        const etag = await etagOf(url);
        const same = await get(url, { range: "bytes=10-19", "if-range": etag });
        assert.equal(same.statusCode, 206);
        assert.deepEqual(same.rawPayload, content.subarray(10, 20));
        for (const ifRange of ['"an-older-version"', `W/${etag}`, "Wed, 21 Oct 2015 07:28:00 GMT"]) {
          const res = await get(url, { range: "bytes=10-19", "if-range": ifRange });
          assert.equal(res.statusCode, 200, ifRange);
          assert.equal(res.headers["content-length"], String(SIZE));
          assert.deepEqual(res.rawPayload, content, ifRange);
        }
        // An unsatisfiable range of another version: the whole current one, not a 416.
        const moved = await get(url, { range: `bytes=${SIZE}-`, "if-range": '"an-older-version"' });
        assert.equal(moved.statusCode, 200);
        assert.deepEqual(moved.rawPayload, content);
        // If-Range without a Range changes nothing.
        assert.equal((await get(url, { "if-range": '"x"' })).statusCode, 200);
      }
    });

    test("a view link serves ranges too, and keeps its no-store", async () => {
      const made = await s.app.inject({
        method: "POST",
        url: `/api/analysis-tasks/${s.taskId}/runs/${s.runId}/outputs/report.png/link`,
        headers: bearer(s.token),
      });
      assert.equal(made.statusCode, 200);
      const res = await s.app.inject({ url: made.json().data.url, headers: { range: "bytes=-3" } });
      assert.equal(res.statusCode, 206);
      assert.deepEqual(res.rawPayload, content.subarray(SIZE - 3));
      assert.equal(res.headers["cache-control"], "private, no-store");
    });

    test("results.csv is generated: its Range is ignored and it advertises none", async () => {
      const res = await get(`/api/analysis-tasks/${s.taskId}/results.csv`, { range: "bytes=0-3" });
      assert.equal(res.statusCode, 200);
      assert.equal(res.headers["accept-ranges"], undefined);
      assert.equal(res.headers.etag, undefined);
      assert.match(res.body, /^run_id,/);
    });

    test("a download cut off midway resumes over a real socket with Range and If-Range", async () => {
      const served = await s.env.app();
      await served.listen({ host: "127.0.0.1", port: 0 });
      try {
        const { port } = served.server.address() as AddressInfo;
        const url = `http://127.0.0.1:${port}${urls()[0]}`;
        // The first attempt: the client takes part of the body and goes away.
        const first = await fetch(url, { headers: bearer(s.token) });
        assert.equal(first.status, 200);
        const etag = first.headers.get("etag") as string;
        const reader = (first.body as ReadableStream<Uint8Array>).getReader();
        const got: Buffer[] = [];
        let have = 0;
        while (have < 1000) {
          const { value, done } = await reader.read();
          if (done) break;
          got.push(Buffer.from(value));
          have += value.length;
        }
        await reader.cancel();
        assert.ok(have < SIZE, "cut off before the end");
        // The resume: the rest, from where it stopped.
        const rest = await fetch(url, {
          headers: { ...bearer(s.token), range: `bytes=${have}-`, "if-range": etag },
        });
        assert.equal(rest.status, 206);
        assert.equal(rest.headers.get("content-range"), `bytes ${have}-${SIZE - 1}/${SIZE}`);
        const whole = Buffer.concat([...got, Buffer.from(await rest.arrayBuffer())]);
        assert.deepEqual(whole, content);
      } finally {
        await served.close();
      }
    });

    if (kind === "s3") {
      test("a 304 opens no body (one HEAD); an If-Range opens only the bytes it sends", async () => {
        const sent = requests as S3Request[];
        /** The requests for report.png that `headers` cost on each route, as `method range`. */
        const cost = async (headers: Record<string, string>, status: number) => {
          const each: string[][] = [];
          for (const url of urls()) {
            sent.length = 0;
            const res = await get(url, headers);
            assert.equal(res.statusCode, status, `${url} ${JSON.stringify(headers)}`);
            each.push(
              sent
                .filter((r) => r.path.includes("report.png"))
                .map((r) => `${r.method} ${r.range ?? ""}`.trim()),
            );
          }
          assert.ok(
            each.every((e) => JSON.stringify(e) === JSON.stringify(each[0])),
            JSON.stringify(each),
          );
          return each[0];
        };
        const etag = await etagOf(urls()[1] as string);
        assert.deepEqual(await cost({ "if-none-match": etag }, 304), ["HEAD"]);
        assert.deepEqual(await cost({ "if-none-match": etag, range: "bytes=0-9" }, 304), ["HEAD"]);
        assert.deepEqual(await cost({ "if-none-match": '"other"' }, 200), ["HEAD", "GET"]);
        assert.deepEqual(await cost({ range: "bytes=10-19", "if-range": '"older"' }, 200), ["HEAD", "GET"]);
        assert.deepEqual(await cost({ range: "bytes=10-19", "if-range": etag }, 206), [
          "HEAD",
          "GET bytes=10-19",
        ]);
        // Without a condition the object is opened at once.
        assert.deepEqual(await cost({}, 200), ["GET"]);
        assert.deepEqual(await cost({ range: "bytes=10-19" }, 206), ["GET bytes=10-19"]);
      });
    }

    if (kind === "local") {
      test("what a 304, an If-Range that does not match and a 416 open is closed again", async () => {
        const url = urls()[1] as string;
        const etag = await etagOf(url);
        for (let i = 0; i < 3; i++) {
          assert.equal((await get(url, { "if-none-match": etag, range: "bytes=1-2" })).statusCode, 304);
          assert.equal((await get(url, { range: "bytes=1-2", "if-range": '"x"' })).statusCode, 200);
          assert.equal((await get(url, { range: `bytes=${SIZE}-` })).statusCode, 416);
        }
        const outputs = path.join((s.env.storage as LocalStore).root, "outputs");
        const openOutputs = () =>
          fs
            .readdirSync("/proc/self/fd")
            .map((fd) => {
              try {
                return fs.readlinkSync(`/proc/self/fd/${fd}`);
              } catch {
                return "";
              }
            })
            .filter((target) => target.startsWith(outputs));
        await waitFor(async () => openOutputs().length === 0, 5000, "output descriptors to close");
      });
    }
  });
}
