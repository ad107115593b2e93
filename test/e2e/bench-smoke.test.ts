// Every benchmark runs, at sizes small enough for the suite: `make bench` stops at the first one that
// fails, and nothing else ran them (bench/retention.ts inserted runs without the owner_id that fair
// share made NOT NULL, and `make bench` stopped there, unnoticed, until someone ran it). What the
// figures say is the benchmarks' business; this checks that each one runs to the end on a fresh
// database and prints its JSON lines.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { after, test } from "node:test";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";

const root = path.resolve(import.meta.dirname, "../..");

/** Each benchmark with the smallest sizes it runs with (its own knobs; see bench/README.md). */
const BENCHES: [string, Record<string, string> | null][] = [
  ["retention.ts", { BENCH_N: "200", BENCH_HISTORY: "2000" }],
  [
    "queue.ts",
    {
      BENCH_N: "300",
      BENCH_LATENCY_N: "4",
      BENCH_WARMUP: "0",
      BENCH_FAIR_PAIRS: "1",
      BENCH_FAIR_BIG: "300",
    },
  ],
  ["e2e.ts", { BENCH_E2E_N: "4", BENCH_E2E_ROUNDS: "1" }],
  ["scale.ts", { BENCH_SCALE_N: "40", BENCH_SCALE_WORKERS: "1,2" }],
  ["big-task.ts", { BENCH_BIG_N: "300" }],
  ["api.ts", { BENCH_API_RUNS: "6", BENCH_API_SECONDS: "1" }],
  // It hung once here under the full suite's load (2026-12-04, a fresh-clone CI run), before printing
  // anything; its waits now end (its client processes give up on streams without headers after
  // 60 s or closed by the server; processes that outlive SIGTERM are killed and fail it), so a
  // repeat fails with its cause.
  ["sse.ts", { BENCH_SSE_N: "50", BENCH_SSE_SECONDS: "1" }],
  ["submit.ts", { BENCH_SUBMIT_N: "10", BENCH_SUBMIT_KB: "1", BENCH_STATUS_RUNS: "2" }],
  ["startup.ts", { BENCH_STARTUP_N: "1" }],
  ["zip.ts", { BENCH_ZIP_RUNS: "10", BENCH_ZIP_OBJECT_KIB: "4" }],
];

test("every benchmark in bench/ is in this list", () => {
  const files = fs
    .readdirSync(path.join(root, "bench"))
    .filter((f) => f.endsWith(".ts"))
    .sort();
  assert.deepEqual(BENCHES.map(([f]) => f).sort(), files);
});

/** Under the runner's limit for a test (180 s): a benchmark that hangs fails with its stderr. */
const BENCH_TIMEOUT_MS = 150_000;

const dbs: TestDatabase[] = [];
after(async () => {
  for (const db of dbs) await db.drop();
});

for (const [file, knobs] of BENCHES) {
  if (knobs === null) continue;
  test(`bench/${file} runs to the end at small sizes and prints its JSON lines`, async () => {
    const db = await createTestDatabase();
    dbs.push(db);
    const { code, stdout, stderr } = await new Promise<{
      code: number | null;
      stdout: string;
      stderr: string;
    }>((resolve, reject) => {
      let out = "";
      let err = "";
      // Its own process group, so a benchmark that hangs goes with everything it started.
      const child = spawn(process.execPath, ["--import", "tsx", path.join("bench", file)], {
        cwd: root,
        env: { ...process.env, ...knobs, DATABASE_URL: db.url },
        stdio: ["ignore", "pipe", "pipe"],
        detached: true,
      });
      const timer = setTimeout(() => {
        err += `\n(killed after ${BENCH_TIMEOUT_MS} ms)`;
        try {
          process.kill(-(child.pid as number), "SIGKILL");
        } catch {}
      }, BENCH_TIMEOUT_MS);
      // Whatever it started goes with it, so nothing outlives the test or holds its pipes open.
      child.on("exit", () => {
        clearTimeout(timer);
        try {
          process.kill(-(child.pid as number), "SIGKILL");
        } catch {}
      });
      child.stdout.on("data", (d: Buffer) => {
        out += d;
      });
      child.stderr.on("data", (d: Buffer) => {
        err += d;
      });
      child.on("error", (e) => {
        clearTimeout(timer);
        reject(e);
      });
      child.on("close", (c) => resolve({ code: c, stdout: out, stderr: err }));
    });
    assert.equal(
      code,
      0,
      `bench/${file} exited ${code}:\n${stderr.slice(-3000)}\nits stdout (end):\n${stdout.slice(-1500)}`,
    );
    const lines = stdout.trim().split("\n").filter(Boolean);
    assert.ok(lines.length > 0, `bench/${file} printed nothing`);
    for (const line of lines) {
      const parsed = JSON.parse(line) as { workload?: unknown };
      assert.equal(typeof parsed.workload, "string", line);
    }
  });
}
