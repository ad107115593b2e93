// API reads under load (issue 18, target 6): an authenticated GET /api/analysis-tasks/:id and a runs
// page of a real `assay api` at 50 connections (autocannon), each beside a bare Fastify route that
// returns the same body (bench/lib/bare-server.ts) in the same run. One JSON line per route:
//   rate        requests/s of the real route; bare_rate: of the bare route; ratio (target ≥ 0.3)
//   p50/p99_ms  latency of the real route (target p99 ≤ 20 ms); errors: non-2xx or failed requests
// The task has BENCH_API_RUNS runs (20), some finished, one live; BENCH_API_SECONDS per measure (10);
// the bare and real routes alternate, twice each (ABBA), and the medians are reported.
import { type ChildProcess, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import autocannon from "autocannon";
import { bundleEntry } from "../bin/bundle.js";
import { tokenCreate } from "../src/auth/tokens.ts";
import { createDatabase } from "../src/db/client.ts";
import { freePort } from "../src/db/embedded.ts";
import { taskCreate } from "../src/tasks/create.ts";
import { benchDatabase } from "./lib/db.ts";

const RUNS = Number(process.env.BENCH_API_RUNS ?? 20);
// Five finished and one live, below.
if (!(RUNS >= 6)) throw new Error(`BENCH_API_RUNS must be at least 6, got ${process.env.BENCH_API_RUNS}`);
const SECONDS = Number(process.env.BENCH_API_SECONDS ?? 10);
const CONNECTIONS = 50;
const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN = path.join(HERE, "..", "bin", "assay.js");

const bench = await benchDatabase();
const { sql, close } = createDatabase(bench.url, { max: 2 });
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bench-api-"));
const children: ChildProcess[] = [];

/** Starts a process and resolves with the first line matching `ready` on its stdout. */
function start(args: string[], env: NodeJS.ProcessEnv, ready: RegExp): Promise<string> {
  const child = spawn(process.execPath, args, { env, stdio: ["ignore", "pipe", "inherit"] });
  children.push(child);
  return new Promise((resolve, reject) => {
    let out = "";
    child.stdout?.on("data", (c: Buffer) => {
      out += c.toString();
      const m = ready.exec(out);
      if (m) resolve(m[0]);
    });
    child.once("exit", (code) => reject(new Error(`${args.join(" ")} exited (${code})`)));
  });
}

interface Measured {
  rate: number;
  p50: number;
  p99: number;
  errors: number;
}

async function load(url: string, headers: Record<string, string>): Promise<Measured> {
  const r = await autocannon({ url, connections: CONNECTIONS, duration: SECONDS, headers });
  return {
    rate: r.requests.average,
    p50: r.latency.p50,
    p99: r.latency.p99,
    errors: r.errors + r.timeouts + r.non2xx,
  };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

try {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const apiEnv = {
    PATH: process.env.PATH ?? "",
    DATABASE_URL: bench.url,
    ASSAY_DATA_DIR: dataDir,
    HOST: "127.0.0.1",
    PORT: String(port),
    LOG_LEVEL: "warn",
    // For A/B runs: the Node flags (bin/node-flags.js) and the bundle or the sources (bin/bundle.js).
    ...(process.env.ASSAY_NODE_FLAGS === undefined ? {} : { ASSAY_NODE_FLAGS: process.env.ASSAY_NODE_FLAGS }),
    ...(process.env.ASSAY_BUNDLE === undefined ? {} : { ASSAY_BUNDLE: process.env.ASSAY_BUNDLE }),
  };
  children.push(
    spawn(process.execPath, [BIN, "api"], { env: apiEnv, stdio: ["ignore", "ignore", "inherit"] }),
  );
  for (let i = 0; ; i++) {
    if (
      await fetch(`${base}/readyz`).then(
        (r) => r.ok,
        () => false,
      )
    )
      break;
    if (i > 600) throw new Error("the API did not become ready");
    await new Promise((r) => setTimeout(r, 100));
  }
  const { token, userId } = await tokenCreate(sql, "bench-api", "user");
  const fileIds = (
    await sql<{ id: string }[]>`
      with next as (select nextval(pg_get_serial_sequence('files', 'id')) as id from generate_series(1, ${RUNS}))
      insert into files (id, owner_id, name, content_type, size_bytes, sha256, storage_key)
      select id, ${userId}, 'f-' || id || '.csv', 'text/csv', 10, repeat('0', 64), 'files/' || id from next
      returning id::text`
  ).map((r) => r.id);
  const created = await taskCreate(
    sql,
    { userId, name: "bench-api", role: "user" },
    { analysisType: "summary", fileIds, parameters: {}, maxAttempts: 3 },
  );
  if (created.kind !== "created") throw new Error("create failed");
  // Some runs finished, one live: the shape of a task a user watches.
  await sql`update runs set status = 'starting', attempt = 1, lease_token = gen_random_uuid(),
    lease_owner = 'bench', lease_expires_at = now() + interval '1 hour'
    where task_id = ${created.taskId} and id in (select id from runs where task_id = ${created.taskId} order by id limit 6)`;
  await sql`update runs set status = 'succeeded', finished_at = now()
    where task_id = ${created.taskId} and id in (select id from runs where task_id = ${created.taskId} order by id limit 5)`;
  await sql`update tasks set succeeded_count = 5, status = 'running', started_at = now() where id = ${created.taskId}`;
  await sql`vacuum analyze`;

  const auth = { authorization: `Bearer ${token}` };
  const routes = {
    "api:task": `/api/analysis-tasks/${created.taskId}`,
    "api:runs": `/api/analysis-tasks/${created.taskId}/runs?limit=20`,
  };
  for (const [workload, route] of Object.entries(routes)) {
    const res = await fetch(`${base}${route}`, { headers: auth });
    if (!res.ok) throw new Error(`${route}: ${res.status} ${await res.text()}`);
    const bodyFile = path.join(dataDir, `${workload.replace(":", "-")}.json`);
    fs.writeFileSync(bodyFile, await res.text());
    const bareUrl = await start(
      [path.join(HERE, "lib", "bare-server.ts")],
      { PATH: process.env.PATH ?? "", BARE_BODY_FILE: bodyFile },
      /http:\/\/[\d.:]+/,
    );
    const real: Measured[] = [];
    const bare: Measured[] = [];
    // ABBA: bare, real, real, bare.
    bare.push(await load(`${bareUrl}/bare/1`, {}));
    real.push(await load(`${base}${route}`, auth));
    real.push(await load(`${base}${route}`, auth));
    bare.push(await load(`${bareUrl}/bare/1`, {}));
    children.pop()?.kill("SIGTERM");
    const rate = median(real.map((m) => m.rate));
    const bareRate = median(bare.map((m) => m.rate));
    const p99 = median(real.map((m) => m.p99));
    const errors = real.reduce((n, m) => n + m.errors, 0);
    console.log(
      JSON.stringify({
        workload,
        N: real.length,
        C: CONNECTIONS,
        seconds: SECONDS,
        rate: Math.round(rate),
        p50_ms: median(real.map((m) => m.p50)),
        p90_ms: null,
        p99_ms: p99,
        ok: errors === 0,
        errors,
        bare_rate: Math.round(bareRate),
        bare_p99_ms: median(bare.map((m) => m.p99)),
        ratio: Number((rate / bareRate).toFixed(2)),
        runs: RUNS,
        target_ratio_0_3: rate / bareRate >= 0.3,
        target_p99_20ms: p99 <= 20,
        bundled: bundleEntry(apiEnv) !== undefined,
      }),
    );
  }
} finally {
  for (const c of children) c.kill("SIGTERM");
  await close();
  await bench.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
}
