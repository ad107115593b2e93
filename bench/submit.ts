// Client benchmark (issue 17): `assay submit` of 1,000 files of 10 KB against a local `assay api`
// (no worker: this measures the client and the upload path, not the analyses), then the same
// submit again (every file already there: nothing to upload), then the start-up of a client command
// (`assay status <id>`, command start to exit). One JSON line:
//   rate             files/s uploaded: N / (command start → every file uploaded), hashing and the
//                    per-file copy lookups included (target ≥ 500 over loopback)
//   upload_phase_rate  files/s of the uploads alone (hash_s, lookup_s, upload_s: the client's phases)
//   created_ms       command start → "task created" line of the first submit
//   resubmit_ms      command start → exit of the re-submit (target < 2,000)
//   p50/p90/p99_ms   `assay status <id>` of a one-run task: wall time, command start to exit (target
//                    p50 ≤ 300); status_1000_runs_p50_ms: the same for the 1,000-run task
//   status_rss_mib   its peak RSS (from /usr/bin/time, when there is one)
// BENCH_SUBMIT_N (1000), BENCH_SUBMIT_KB (10), BENCH_SUBMIT_C (client concurrency, 8),
// BENCH_STATUS_RUNS (20).
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { tokenCreate } from "../src/auth/tokens.ts";
import { createDatabase } from "../src/db/client.ts";
import { freePort } from "../src/db/embedded.ts";
import { benchDatabase, report } from "./lib/db.ts";

const N = Number(process.env.BENCH_SUBMIT_N ?? 1000);
const KB = Number(process.env.BENCH_SUBMIT_KB ?? 10);
const C = Number(process.env.BENCH_SUBMIT_C ?? 8);
const STATUS_RUNS = Number(process.env.BENCH_STATUS_RUNS ?? 20);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const bin = path.join(root, "bin/assay.js");

/** A 10 KB CSV, different for every i. */
function csvFile(i: number): string {
  const lines = [`id,value,label_${i}`];
  for (let r = 0; lines.join("\n").length < KB * 1024 - 40; r++)
    lines.push(`${r},${(r * 31 + i) % 1009},row${r}`);
  return `${lines.join("\n")}\n`;
}

interface Timed {
  code: number | null;
  ms: number;
  /** Milliseconds from start to the first line of each kind. */
  at: Map<string, number>;
  lines: Record<string, unknown>[];
}

/** Runs the client; notes when each kind of JSON line first appeared. */
function timedClient(args: string[], env: NodeJS.ProcessEnv): Promise<Timed> {
  const t0 = performance.now();
  const child = spawn(process.execPath, [bin, ...args], { env, stdio: ["ignore", "pipe", "inherit"] });
  const at = new Map<string, number>();
  const lines: Record<string, unknown>[] = [];
  let buffer = "";
  child.stdout.on("data", (chunk: Buffer) => {
    buffer += chunk.toString();
    for (let nl = buffer.indexOf("\n"); nl >= 0; nl = buffer.indexOf("\n")) {
      const line = JSON.parse(buffer.slice(0, nl)) as { kind: string };
      buffer = buffer.slice(nl + 1);
      if (!at.has(line.kind)) at.set(line.kind, performance.now() - t0);
      lines.push(line);
    }
  });
  return new Promise((resolve) =>
    child.on("close", (code) => resolve({ code, ms: performance.now() - t0, at, lines })),
  );
}

/** Wall times of `runs` runs of a status command, after two unreported warm-up runs. */
async function statusTimes(args: string[], env: NodeJS.ProcessEnv, runs: number): Promise<number[]> {
  const times: number[] = [];
  for (let i = -2; i < runs; i++) {
    const r = await timedClient(args, env);
    if (r.code !== 0) throw new Error(`assay ${args.join(" ")} exited ${r.code}`);
    if (i >= 0) times.push(r.ms);
  }
  return times;
}

async function waitReady(url: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (
      await fetch(`${url}/readyz`).then(
        (r) => r.ok,
        () => false,
      )
    )
      return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("the API did not become ready");
}

const bench = await benchDatabase();
const { sql, close } = createDatabase(bench.url);
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bench-submit-"));
const port = await freePort();
const url = `http://127.0.0.1:${port}`;
const api = spawn(process.execPath, [bin, "api"], {
  env: {
    ...process.env,
    DATABASE_URL: bench.url,
    ASSAY_DATA_DIR: dataDir,
    HOST: "127.0.0.1",
    PORT: String(port),
    LOG_LEVEL: "warn",
  },
  stdio: ["ignore", "ignore", "inherit"],
});
try {
  await waitReady(url);
  const { token } = await tokenCreate(sql, "bench-submit");
  const inputs = path.join(dataDir, "inputs");
  fs.mkdirSync(inputs);
  for (let i = 0; i < N; i++)
    fs.writeFileSync(path.join(inputs, `file-${String(i).padStart(5, "0")}.csv`), csvFile(i));
  const env = { PATH: process.env.PATH ?? "", ASSAY_URL: url, ASSAY_TOKEN: token };
  const submit = ["submit", "--type", "summary", inputs, "--json", "--concurrency", String(C)];

  const first = await timedClient(submit, env);
  const upload = first.lines.find((l) => l.kind === "upload");
  const taskId = first.lines.find((l) => l.kind === "task")?.taskId as string;
  const uploadedMs = first.at.get("upload") ?? Number.NaN;
  const again = await timedClient(submit, env);
  const reupload = again.lines.find((l) => l.kind === "upload");

  // Start-up: `assay status` of a one-run task (the task of the first input again, nothing uploaded),
  // so the time is the command's own; the 1,000-run task's status (10 pages of runs) beside it.
  const one = await timedClient(
    ["submit", "--type", "summary", path.join(inputs, "file-00000.csv"), "--json"],
    env,
  );
  const oneId = one.lines.find((l) => l.kind === "task")?.taskId as string;
  const status = ["status", oneId, "--json"];
  const startups = await statusTimes(status, env, STATUS_RUNS);
  const bigStatus = await statusTimes(["status", taskId, "--json"], env, 5);
  const rss = fs.existsSync("/usr/bin/time")
    ? Number(
        spawnSync("/usr/bin/time", ["-f", "%M", process.execPath, bin, ...status], { env, encoding: "utf8" })
          .stderr.trim()
          .split("\n")
          .at(-1),
      ) / 1024
    : null;

  const sortedStartups = [...startups].sort((a, b) => a - b);
  const median = sortedStartups[Math.floor(sortedStartups.length / 2)] as number;
  const rate = N / (uploadedMs / 1000);
  // ok: the runs did what they should; the targets are reported beside it, to be read.
  const ok = first.code === 0 && again.code === 0 && upload?.uploaded === N && reupload?.uploaded === 0;
  report("submit", N, C, uploadedMs / 1000, startups, ok, {
    rate: Math.round(rate),
    created_ms: Math.round(first.at.get("task") ?? Number.NaN),
    upload_phase_rate: Math.round(N / (upload?.uploadSeconds as number)),
    hash_s: upload?.hashSeconds,
    lookup_s: upload?.lookupSeconds,
    upload_s: upload?.uploadSeconds,
    resubmit_lookup_s: reupload?.lookupSeconds,
    resubmit_ms: Math.round(again.ms),
    resubmit_reused: reupload?.reused,
    status_rss_mib: rss === null ? null : Math.round(rss),
    status_1000_runs_p50_ms: Math.round(
      [...bigStatus].sort((a, b) => a - b)[Math.floor(bigStatus.length / 2)] as number,
    ),
    target_rate_500: rate >= 500,
    target_resubmit_2s: again.ms < 2000,
    target_status_300ms: median <= 300,
  });
} finally {
  api.kill("SIGTERM");
  await new Promise((r) => api.once("close", r));
  await close();
  await bench.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
}
