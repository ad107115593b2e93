// The whole /metrics text of a process serving both the API's and a worker's metrics (as `assay all`
// does), parsed strictly: every family's HELP and TYPE once and before its samples, its samples
// together, no series twice, label values escaped (analysis types holding `"`, `\` and a newline),
// histogram buckets ascending and cumulative with +Inf equal to _count, and no label value taken from
// a request's URL (a /view/ link's secret, a 404's path).
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { loadConfig } from "../../src/config.ts";
import { expectedMigrationCount } from "../../src/db/migrate.ts";
import { buildServer } from "../../src/http/server.ts";
import { createLogger } from "../../src/log.ts";
import { processRegistry } from "../../src/metrics/registry.ts";
import { workerMetrics } from "../../src/metrics/worker.ts";
import type { QueueObserver } from "../../src/queue/observer.ts";
import { LocalStore } from "../../src/storage/local.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser } from "../helpers/queue.ts";

const WEIRD = 'we"ird\\type\nnext';
const SECRET = "SeCrEt0123456789";

let db: TestDatabase;
let app: FastifyInstance;
let observer: QueueObserver;
let dataDir: string;
before(async () => {
  db = await createTestDatabase();
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-metrics-exposition-"));
  const registry = processRegistry();
  observer = workerMetrics(registry, ["summary", WEIRD]);
  app = await buildServer(
    {
      config: loadConfig({ ASSAY_DATA_DIR: dataDir, DATABASE_URL: db.url }),
      database: db,
      storage: new LocalStore(dataDir),
      expectedMigrations: expectedMigrationCount(),
      metrics: registry,
    },
    createLogger({ level: "silent" }),
  );
});
after(async () => {
  await app.close();
  await db.drop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

interface Sample {
  name: string;
  labels: Map<string, string>;
  value: number;
}
interface Family {
  help?: string;
  type?: string;
  samples: Sample[];
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const SUFFIXES: Record<string, string[]> = {
  histogram: ["_bucket", "_sum", "_count"],
  summary: ["_sum", "_count", ""],
  counter: ["", "_total"],
  gauge: [""],
};

/** Parses Prometheus text format 0.0.4 strictly; throws on anything it does not allow. */
function parse(text: string): Map<string, Family> {
  assert.ok(text.endsWith("\n"), "the text ends with a line feed");
  const families = new Map<string, Family>();
  const seen = new Set<string>();
  let current: string | undefined;
  const family = (name: string) => {
    let f = families.get(name);
    if (!f) {
      f = { samples: [] };
      families.set(name, f);
    }
    return f;
  };
  const lines = text.slice(0, -1).split("\n");
  for (const [i, line] of lines.entries()) {
    const where = `line ${i + 1}: ${JSON.stringify(line)}`;
    if (line === "") continue; // the format ignores empty lines (prom-client ends each family so)
    const meta = /^# (HELP|TYPE) (\S+) (.*)$/.exec(line);
    if (meta) {
      const [, kind, name, rest] = meta as unknown as [string, string, string, string];
      assert.match(name, NAME, where);
      const f = family(name);
      assert.equal(f.samples.length, 0, `${where}: ${kind} after the family's samples`);
      if (current !== name) assert.ok(f.help === undefined && f.type === undefined, `${where}: family split`);
      current = name;
      if (kind === "HELP") {
        assert.equal(f.help, undefined, `${where}: a second HELP`);
        assert.ok(!/\\(?![\\n])/.test(rest), `${where}: a bad escape in HELP`);
        f.help = rest;
      } else {
        assert.equal(f.type, undefined, `${where}: a second TYPE`);
        assert.ok(rest in SUFFIXES || rest === "untyped", `${where}: unknown type`);
        f.type = rest;
      }
      continue;
    }
    assert.ok(!line.startsWith("#"), `${where}: not a sample`);
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$/.exec(line);
    assert.ok(m, `${where}: not a sample`);
    const [, name, body, raw] = m as unknown as [string, string, string | undefined, string];
    const labels = new Map<string, string>();
    if (body !== undefined) {
      let rest = body.slice(1, -1);
      while (rest.length > 0) {
        const l = /^([^=]+)="((?:[^"\\]|\\[\\"n])*)"(,?)/.exec(rest);
        assert.ok(l, `${where}: bad labels at ${JSON.stringify(rest)}`);
        const [all, key, escaped, comma] = l as unknown as [string, string, string, string];
        assert.match(key, LABEL, where);
        assert.ok(!labels.has(key), `${where}: label ${key} twice`);
        labels.set(
          key,
          escaped.replace(/\\([\\"n])/g, (_, c: string) => (c === "n" ? "\n" : c)),
        );
        rest = rest.slice(all.length);
        assert.ok(comma === "," || rest.length === 0, `${where}: labels not separated`);
      }
    }
    const value = raw === "+Inf" ? Infinity : raw === "-Inf" ? -Infinity : raw === "NaN" ? NaN : Number(raw);
    assert.ok(raw === "NaN" || !Number.isNaN(value), `${where}: bad value`);
    assert.ok(current !== undefined, `${where}: a sample before any TYPE`);
    const f = families.get(current) as Family;
    const suffix = name.slice(current.length);
    assert.ok(
      name.startsWith(current) && (SUFFIXES[f.type ?? ""] ?? [""]).includes(suffix),
      `${where}: not a sample of ${current} (${f.type})`,
    );
    const key = `${name}{${[...labels].sort().map(([k, v]) => `${k}=${JSON.stringify(v)}`)}}`;
    assert.ok(!seen.has(key), `${where}: series ${key} twice`);
    seen.add(key);
    f.samples.push({ name, labels, value });
  }
  for (const [name, f] of families) {
    assert.ok(f.help !== undefined && f.type !== undefined, `${name}: HELP and TYPE`);
    if (f.type === "histogram") checkHistogram(name, f);
  }
  return families;
}

function checkHistogram(name: string, f: Family): void {
  const groups = new Map<string, { buckets: [number, number][]; sum?: number; count?: number }>();
  for (const s of f.samples) {
    const rest = [...s.labels].filter(([k]) => k !== "le").sort();
    const key = JSON.stringify(rest);
    const g = groups.get(key) ?? { buckets: [] };
    groups.set(key, g);
    if (s.name.endsWith("_bucket")) {
      const le = s.labels.get("le");
      assert.ok(le !== undefined, `${name}: a bucket without le`);
      g.buckets.push([le === "+Inf" ? Infinity : Number(le), s.value]);
    } else if (s.name.endsWith("_sum")) g.sum = s.value;
    else g.count = s.value;
  }
  for (const [key, g] of groups) {
    const at = `${name}${key}`;
    assert.ok(g.buckets.length > 0 && g.sum !== undefined && g.count !== undefined, `${at}: complete`);
    for (let i = 1; i < g.buckets.length; i++) {
      const [prev, cur] = [g.buckets[i - 1] as [number, number], g.buckets[i] as [number, number]];
      assert.ok(prev[0] < cur[0], `${at}: le ascending`);
      assert.ok(prev[1] <= cur[1], `${at}: buckets cumulative`);
    }
    const last = g.buckets.at(-1) as [number, number];
    assert.equal(last[0], Infinity, `${at}: a +Inf bucket last`);
    assert.equal(last[1], g.count, `${at}: +Inf = _count`);
  }
}

test("the whole /metrics text of an API and worker in one process parses strictly", async () => {
  const owner = await seedUser(db.sql, "expo");
  await createTask(db.sql, owner, WEIRD, 2);
  await createTask(db.sql, owner, "summary", 1);
  observer.claimed(WEIRD, 0.002, [0.5, 3]);
  observer.attemptLive(WEIRD, 1);
  observer.attemptEnded(WEIRD, "succeeded", 1.5);
  observer.attemptEnded(WEIRD, "retried", 0.2);
  observer.leaseLost(WEIRD, "fenced");
  observer.reaped({ requeued: 1, failed: 0, cancelled: 0, finishedTasks: 0, staleWorkers: 1 });
  // Requests whose URL holds a secret or grows without bound: a view link, a 404, a bad method.
  for (const [method, url] of [
    ["GET", `/view/${SECRET}/out.csv`],
    ["GET", `/view/download/${SECRET}/out.csv`],
    ["GET", `/no/such/${SECRET}`],
    ["DELETE", `/api/analysis-tasks/${SECRET}`],
    ["GET", `/api/analysis-tasks/${SECRET}?x=${SECRET}`],
    ["GET", "/healthz"],
  ] as const)
    await app.inject({ method, url });
  const res = await app.inject({ url: "/metrics" });
  assert.equal(res.statusCode, 200);
  assert.match(String(res.headers["content-type"]), /^text\/plain; version=0\.0\.4/);
  const families = parse(res.body);

  const all = [...families.values()].flatMap((f) => f.samples);
  for (const s of all)
    for (const [k, v] of s.labels) assert.ok(!v.includes(SECRET), `${s.name}: label ${k}=${v} holds a URL`);
  const routes = new Set(
    (families.get("assay_http_request_duration_seconds")?.samples ?? []).map((s) => s.labels.get("route")),
  );
  for (const r of routes)
    assert.ok(r === "unmatched" || /^\/[a-zA-Z0-9/:._*-]*$/.test(r ?? ""), `route ${r}`);
  assert.ok(routes.has("/view/:link/:name") && routes.has("/healthz"), [...routes].join(" "));

  // The type with `"`, `\` and a newline is read back as it was written, in both halves.
  const value = (name: string, labels: Record<string, string>) =>
    all.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels.get(k) === v))
      ?.value;
  assert.equal(value("assay_queue_depth", { analysis_type: WEIRD }), 2);
  assert.equal(value("assay_queue_depth", { analysis_type: "summary" }), 1);
  assert.equal(value("assay_worker_attempts_live", { analysis_type: WEIRD }), 1);
  assert.equal(value("assay_run_duration_seconds_count", { analysis_type: WEIRD, outcome: "succeeded" }), 1);
  assert.equal(value("assay_claim_latency_seconds_count", { analysis_type: WEIRD }), 2);
  assert.equal(value("assay_lease_losses_total", { analysis_type: WEIRD, how: "fenced" }), 1);
  assert.equal(value("assay_metrics_scrape_errors_total", {}), 0);
  // Every family of the API and of the worker is there once.
  for (const name of [
    "assay_queue_depth",
    "assay_queue_oldest_age_seconds",
    "assay_runs_live",
    "assay_runs_lease_expired",
    "assay_runs_finished",
    "assay_sse_subscribers",
    "assay_event_notifications_total",
    "assay_http_request_duration_seconds",
    "assay_claim_duration_seconds",
    "assay_claim_latency_seconds",
    "assay_worker_attempts_live",
    "assay_run_duration_seconds",
    "assay_run_retries_total",
    "assay_lease_losses_total",
    "assay_reaped_runs_total",
    "assay_reaped_workers_total",
    "assay_process_resident_memory_bytes",
  ])
    assert.ok(families.has(name), `${name} is served`);
});

test("the strict parser refuses what it must (it can fail)", () => {
  const ok = "# HELP a x\n# TYPE a gauge\na 1\n";
  parse(ok);
  for (const bad of [
    `${ok}# HELP a x\n`,
    "# HELP a x\n# TYPE a gauge\na 1\na 2\n",
    '# HELP a x\n# TYPE a gauge\na{l="x\ny"} 1\n',
    '# HELP a x\n# TYPE a gauge\na{l="x"y"} 1\n',
    '# HELP h x\n# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n',
    '# HELP h x\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 1\nh_count 3\n',
    "# HELP a x\n# TYPE a gauge\na 1\n# HELP b x\n# TYPE b gauge\nb 1\na 2\n",
  ])
    assert.throws(() => parse(bad), JSON.stringify(bad));
});
