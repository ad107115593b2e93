// Memory of a zip download from S3: one task of 1,000 succeeded runs, each with a 64 KiB output object in
// an S3-compatible server (s3rver, in a process of its own), downloaded as a zip through the real API
// by a client that reads as fast as it can. Prints one JSON line: bytes, seconds, and the API process's
// peak growth in heap, external/array buffers and RSS while it streamed — what "holds no more than a
// few objects in memory at once" means, in numbers.
//
//   BENCH_ZIP_RUNS=1000 BENCH_ZIP_OBJECT_KIB=64 node --import tsx bench/zip.ts
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import v8 from "node:v8";
import { runInNewContext } from "node:vm";
import { CreateBucketCommand } from "@aws-sdk/client-s3";
import { tokenCreate } from "../src/auth/tokens.ts";
import { loadConfig } from "../src/config.ts";
import { createDatabase } from "../src/db/client.ts";
import { expectedMigrationCount } from "../src/db/migrate.ts";
import { buildServer } from "../src/http/server.ts";
import { createLogger } from "../src/log.ts";
import { runClaim, runComplete } from "../src/queue/sql.ts";
import { S3Store } from "../src/storage/s3.ts";
import { benchDatabase } from "./lib/db.ts";
import { createNoopTask, seedOwnerAndFiles } from "./lib/drain.ts";

const RUNS = Number(process.env.BENCH_ZIP_RUNS ?? 1000);
const OBJECT_BYTES = Number(process.env.BENCH_ZIP_OBJECT_KIB ?? 64) * 1024;
const HERE = path.dirname(fileURLToPath(import.meta.url));
const MiB = 1024 * 1024;

process.env.AWS_ACCESS_KEY_ID ??= "S3RVER";
process.env.AWS_SECRET_ACCESS_KEY ??= "S3RVER";
process.env.AWS_REGION ??= "us-east-1";
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= "true";

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bench-zip-"));
const s3 = spawn(
  process.execPath,
  ["--openssl-legacy-provider", path.join(HERE, "../test/fixtures/s3-server.mjs"), path.join(scratch, "s3")],
  { stdio: ["pipe", "pipe", "inherit"] },
);
const port = await new Promise<string>((resolve) => {
  let out = "";
  s3.stdout?.on("data", (c: Buffer) => {
    out += c.toString();
    const m = /listening (\d+)/.exec(out);
    if (m?.[1]) resolve(m[1]);
  });
});
const endpoint = `http://127.0.0.1:${port}`;
const db = await benchDatabase();
const database = createDatabase(db.url);
const { sql } = database;
try {
  const store = new S3Store({ bucket: "assay-bench", endpoint, forcePathStyle: true });
  await store.client.send(new CreateBucketCommand({ Bucket: "assay-bench" }));
  const { owner, fileIds } = await seedOwnerAndFiles(sql, "bench-zip", RUNS);
  const taskId = await createNoopTask(sql, owner, fileIds);
  for (let done = 0; done < RUNS; ) {
    const runs = await runClaim(sql, {
      workerId: "bench",
      analysisType: "noop",
      limit: 100,
      globalLimit: 0,
      leaseTtlMs: 60_000,
    });
    const outcomes = runs.map((r) => ({
      id: r.id,
      token: r.leaseToken,
      status: "succeeded" as const,
      result: { outputFileName: "out.txt", metrics: {} },
      outputKey: `${r.taskId}/${r.id}.${r.attempt}.${r.leaseToken}`,
    }));
    await Promise.all(
      outcomes.map((o) =>
        store.put(
          `outputs/${o.outputKey}/out.txt`,
          Readable.from([randomBytes(OBJECT_BYTES / 2).toString("hex")]),
        ),
      ),
    );
    await runComplete(sql, outcomes);
    done += runs.length;
  }
  const config = loadConfig({
    DATABASE_URL: db.url,
    ASSAY_DATA_DIR: scratch,
    ASSAY_STORAGE: "s3",
    ASSAY_S3_BUCKET: "assay-bench",
    ASSAY_S3_ENDPOINT: endpoint,
    ASSAY_S3_FORCE_PATH_STYLE: "true",
  });
  const app = await buildServer(
    { config, database, storage: store, expectedMigrations: expectedMigrationCount() },
    createLogger({ level: "warn", destination: process.stderr }),
  );
  await app.listen({ host: "127.0.0.1", port: 0 });
  const apiPort = (app.server.address() as { port: number }).port;
  const token = (await tokenCreate(sql, "bench-zip-reader", "admin")).token;

  // Live memory, not garbage: a full collection before each sample (every 50 ms; it slows the
  // download a little, which only makes buffers pile up more if anything held them).
  v8.setFlagsFromString("--expose-gc");
  const gc = runInNewContext("gc") as () => void;
  gc();
  const base = process.memoryUsage();
  const peak = { heapUsed: 0, arrayBuffers: 0, rss: 0 };
  const sampler = setInterval(() => {
    gc();
    const m = process.memoryUsage();
    peak.heapUsed = Math.max(peak.heapUsed, m.heapUsed - base.heapUsed);
    peak.arrayBuffers = Math.max(peak.arrayBuffers, m.arrayBuffers - base.arrayBuffers);
    peak.rss = Math.max(peak.rss, m.rss - base.rss);
  }, 50);
  const t0 = performance.now();
  const { status, bytes } = await new Promise<{ status: number; bytes: number }>((resolve, reject) => {
    http
      .get(
        {
          host: "127.0.0.1",
          port: apiPort,
          path: `/api/analysis-tasks/${taskId}/download`,
          headers: { authorization: `Bearer ${token}` },
        },
        (res) => {
          let n = 0;
          res.on("data", (c: Buffer) => (n += c.length));
          res.on("end", () => resolve({ status: res.statusCode ?? 0, bytes: n }));
          res.on("error", reject);
        },
      )
      .on("error", reject);
  });
  const seconds = (performance.now() - t0) / 1000;
  clearInterval(sampler);
  await app.close();
  const mb = (x: number) => Math.round((x / MiB) * 10) / 10;
  console.log(
    JSON.stringify({
      workload: "zip:s3",
      runs: RUNS,
      objectKiB: OBJECT_BYTES / 1024,
      zipMiB: mb(bytes),
      seconds: Math.round(seconds * 100) / 100,
      peakLiveHeapGrowthMiB: mb(peak.heapUsed),
      peakLiveBufferGrowthMiB: mb(peak.arrayBuffers),
      peakRssGrowthMiB: mb(peak.rss),
      ok: status === 200 && bytes > RUNS * (OBJECT_BYTES / 2),
    }),
  );
} finally {
  await database.close();
  await db.stop();
  s3.kill("SIGTERM");
  fs.rmSync(scratch, { recursive: true, force: true });
}
