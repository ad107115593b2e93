// Downloads through a real listening server (issue 14): an output that disappears mid-zip, clients that
// leave mid-stream, retention deleting tasks while they are downloaded — the process survives, answers,
// and holds no descriptor afterwards.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import type { Program } from "../../src/analyses/programs.ts";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { Retention } from "../../src/queue/retention.ts";
import { ROOT } from "../helpers/cli.ts";
import { taskRow, waitFor, waitForTerminal } from "../helpers/queue.ts";
import { type RunnerEnv, runnerEnv, runOutputDir } from "../helpers/runner.ts";
import { zipNames } from "../helpers/zip.ts";

const COPY = path.join(ROOT, "test/fixtures/scripts/copy.sh");
/** A program that starts in a millisecond: many runs, or large outputs, cheaply. */
const copyProgram = (type: string): Program => ({
  type,
  executable: "/bin/sh",
  script: COPY,
  cwd: path.dirname(COPY),
});

let env: RunnerEnv;
let app: FastifyInstance;
let port: number;
let token: string;
const logs: Record<string, unknown>[] = [];

before(async () => {
  env = await runnerEnv();
  app = await env.app(logs);
  await app.listen({ host: "127.0.0.1", port: 0 });
  port = (app.server.address() as { port: number }).port;
  token = (await tokenCreate(env.db.sql, "runner")).token;
});
after(() => env.close());

const hex = (bytes: number) => randomBytes(bytes).toString("hex");

async function finishedTask(type: string, contents: string[]): Promise<string> {
  const files: string[] = [];
  for (const c of contents) files.push(await env.file(c));
  const taskId = await env.task(type, files, {});
  const w = env.worker([copyProgram(type)], { concurrency: 2 });
  await w.start();
  await waitForTerminal(env.db.sql, taskId, 120_000);
  await w.stop();
  assert.equal((await taskRow(env.db.sql, taskId)).status, "succeeded");
  return taskId;
}

interface Download {
  status: number;
  bytes: number;
  /** The whole response arrived (a broken-off one did not). */
  complete: boolean;
  body: Buffer;
}

function download(
  url: string,
  o: { keep?: boolean; dropAfter?: number; slowMs?: number; atFirstChunk?: () => Promise<unknown> } = {},
): Promise<Download> {
  return new Promise((resolve) => {
    const req = http.get(
      { host: "127.0.0.1", port, path: url, agent: false, headers: { authorization: `Bearer ${token}` } },
      (res) => {
        let bytes = 0;
        let first = true;
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => {
          bytes += chunk.length;
          if (o.keep) chunks.push(chunk);
          if (first && o.atFirstChunk) {
            first = false;
            res.pause();
            void o.atFirstChunk().then(() => res.resume());
          } else if (o.dropAfter !== undefined && bytes >= o.dropAfter) req.destroy();
          else if (o.slowMs) {
            res.pause();
            setTimeout(() => res.resume(), o.slowMs);
          }
        });
        res.on("error", () => {});
        res.on("close", () =>
          resolve({
            status: res.statusCode ?? 0,
            bytes,
            complete: res.complete,
            body: Buffer.concat(chunks),
          }),
        );
      },
    );
    req.on("error", () => resolve({ status: 0, bytes: 0, complete: false, body: Buffer.alloc(0) }));
  });
}

const zipUrl = (taskId: string) => `/api/analysis-tasks/${taskId}/download`;

/** Descriptors of this process (server and clients both) open on anything under the data directory. */
function descriptorsUnder(dir: string): string[] {
  const open: string[] = [];
  for (const fd of fs.readdirSync("/proc/self/fd")) {
    try {
      const target = fs.readlinkSync(`/proc/self/fd/${fd}`);
      if (target.startsWith(dir)) open.push(target);
    } catch {
      // closed while we looked
    }
  }
  return open;
}
const descriptorCount = () => fs.readdirSync("/proc/self/fd").length;

const noDescriptorsLeft = () =>
  waitFor(
    async () => descriptorsUnder(env.dataDir).length === 0,
    10_000,
    `descriptors under the data directory to close: ${descriptorsUnder(env.dataDir).join(", ")}`,
  );

async function healthy(): Promise<void> {
  const res = await download("/healthz");
  assert.equal(res.status, 200);
  assert.equal(res.complete, true);
}

test("an output deleted mid-download breaks the zip off; the error is logged; the process goes on", async () => {
  const taskId = await finishedTask("dl-vanish", [hex(2 << 20), hex(2 << 20), hex(2 << 20)]);
  const runs = await env.db.sql<{ id: string }[]>`
    select r.id::text as id from runs r where r.task_id = ${taskId} order by r.id`;
  const victim = path.join(await runOutputDir(env, runs[2]?.id as string), "out.txt");
  const d = await download(zipUrl(taskId), { atFirstChunk: async () => fs.rmSync(victim) });
  assert.equal(d.status, 200);
  assert.equal(d.complete, false, "the response was broken off, not ended as if whole");
  assert.ok(
    logs.some((l) => l.msg === "zip download broken off: an output could not be read" && l.level === 50),
  );
  await healthy();
  await noDescriptorsLeft();
  // Before any byte: a recorded output that is gone is a logged 500, for a zip and for one run.
  const again = await download(zipUrl(taskId), { keep: true });
  assert.equal(again.status, 500);
  assert.equal(JSON.parse(again.body.toString()).code, "ANALYSIS_OUTPUT_MISSING");
  const single = await download(`${zipUrl(taskId).replace("/download", "")}/runs/${runs[2]?.id}/download`, {
    keep: true,
  });
  assert.equal(single.status, 500);
  assert.ok(logs.some((l) => l.msg === "a succeeded run's output is missing"));
});

test("clients that leave mid-download leave no descriptor open (zip and single file)", async () => {
  const many = await finishedTask("dl-leave", [hex(2 << 20), hex(2 << 20)]);
  const one = await finishedTask("dl-leave-one", [hex(4 << 20)]);
  for (const url of [zipUrl(many), zipUrl(many), zipUrl(many), zipUrl(one), zipUrl(one)]) {
    const d = await download(url, { dropAfter: 1 });
    assert.equal(d.status, 200);
    assert.equal(d.complete, false);
  }
  await noDescriptorsLeft();
  await healthy();
  const whole = await download(zipUrl(many), { keep: true });
  assert.equal(whole.complete, true);
  assert.equal(zipNames(whole.body).length, 3); // results.csv and a file per run
});

test("stress: zips of a 500-run task while clients drop and retention deletes tasks being downloaded", {
  timeout: 300_000,
}, async () => {
  const big = await finishedTask(
    "dl-500",
    Array.from({ length: 500 }, () => hex(1024)),
  );
  // Zips far larger than the sockets between server and client can buffer: a paused client holds the
  // server mid-zip, whatever the kernel's buffer sizes.
  const doomed: string[] = [];
  for (let i = 0; i < 4; i++) {
    doomed.push(
      await finishedTask(
        "dl-doomed",
        Array.from({ length: 24 }, () => hex(256 * 1024)),
      ),
    );
  }
  // Warm up (the pool opens its connections), then count.
  await Promise.all(Array.from({ length: 4 }, () => download(zipUrl(big))));
  const baseline = descriptorCount();

  let retentionDone: () => void = () => {};
  const retentionRan = new Promise<void>((r) => {
    retentionDone = r;
  });
  const full = Array.from({ length: 6 }, (_, i) => download(zipUrl(big), { keep: i === 0, slowMs: i % 2 }));
  const dropped = Array.from({ length: 8 }, (_, i) =>
    download(zipUrl(big), { dropAfter: 1 + i * 60_000, slowMs: i % 3 }),
  );
  // Each doomed download has begun (headers and a first chunk) when retention deletes its task.
  const firstChunks: Promise<void>[] = [];
  const doomedDownloads = doomed.flatMap((taskId) =>
    [0, 1].map(() => {
      let arrived: () => void = () => {};
      firstChunks.push(
        new Promise<void>((r) => {
          arrived = r;
        }),
      );
      return download(zipUrl(taskId), {
        atFirstChunk: () => {
          arrived();
          return retentionRan;
        },
      });
    }),
  );
  await Promise.all(firstChunks);
  await env.db.sql`
    update tasks set finished_at = now() - interval '40 days'
    where id = any(${env.db.sql.array(doomed, 20)}::bigint[])`;
  const removed = await new Retention({
    sql: env.db.sql,
    logger: createLogger({ level: "silent" }),
    store: env.storage,
    retentionDays: 30,
    intervalMs: 60_000,
  }).runOnce();
  assert.equal(removed, 4);
  retentionDone();

  const fulls = await Promise.all(full);
  for (const d of fulls) {
    assert.equal(d.status, 200);
    assert.equal(d.complete, true);
  }
  const entries = zipNames(fulls[0]?.body as Buffer);
  assert.equal(entries.length, 501); // results.csv and a file per run
  for (const d of await Promise.all(dropped)) assert.equal(d.complete, false);
  const broken = await Promise.all(doomedDownloads);
  for (const d of broken) {
    assert.equal(d.status, 200);
    assert.equal(d.complete, false, "a download whose outputs were deleted is broken off, never whole");
  }
  await healthy();
  await noDescriptorsLeft();
  await waitFor(async () => descriptorCount() <= baseline, 10_000, `descriptors back to ${baseline}`);
  await waitFor(
    async () => new Promise<boolean>((resolve) => app.server.getConnections((_e, n) => resolve(n === 0))),
    10_000,
    "every connection closed",
  );
});
