// GET /api/analysis-tasks/:taskId/results.csv, and the same table at the root of the task's zip:
// hostile file names and messages, metric columns, failed runs, a task still running, and a task of
// thousands of runs read back in id order.
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { loadConfig } from "../../src/config.ts";
import type { Sql } from "../../src/db/client.ts";
import { expectedMigrationCount } from "../../src/db/migrate.ts";
import { buildServer } from "../../src/http/server.ts";
import { createLogger } from "../../src/log.ts";
import { runClaim, runComplete } from "../../src/queue/sql.ts";
import { guardFormula, resultMetricKeys, resultsCsv } from "../../src/tasks/results.ts";
import { bearer } from "../helpers/app.ts";
import { createTask, idsCrossPowerOfTen, waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";
import { zipNames, zipRead } from "../helpers/zip.ts";

let env: RunnerEnv;
let app: FastifyInstance;
let token: string;
let stranger: string;
let admin: string;

before(async () => {
  env = await runnerEnv();
  app = await env.app();
  token = (await tokenCreate(env.db.sql, "runner")).token;
  stranger = (await tokenCreate(env.db.sql, "stranger")).token;
  admin = (await tokenCreate(env.db.sql, "root", "admin")).token;
});
after(() => env.close());

const get = (url: string, t = token) => app.inject({ url, headers: bearer(t) });

/** RFC 4180, strictly: quoted fields with doubled quotes, CRLF between records, nothing else. */
function parseCsv(text: string): string[][] {
  const records: string[][] = [];
  let record: string[] = [];
  let i = 0;
  for (;;) {
    let field = "";
    if (text[i] === '"') {
      i++;
      for (;;) {
        const q = text.indexOf('"', i);
        assert.ok(q >= 0, "unterminated quoted field");
        field += text.slice(i, q);
        i = q + 1;
        if (text[i] === '"') {
          field += '"';
          i++;
        } else break;
      }
    } else {
      const m = /[,\r\n"]/.exec(text.slice(i));
      const end = m ? i + m.index : text.length;
      assert.notEqual(text[end], '"', "a quote inside an unquoted field");
      field = text.slice(i, end);
      i = end;
    }
    record.push(field);
    if (text[i] === ",") {
      i++;
      continue;
    }
    records.push(record);
    record = [];
    if (i === text.length) break;
    assert.equal(text.slice(i, i + 2), "\r\n", `records end with CRLF (at ${i})`);
    i += 2;
    if (i === text.length) break;
  }
  return records;
}

/** The CSV as records of objects keyed by the header; checks every record is as wide as the header. */
function table(text: string): { header: string[]; rows: Record<string, string>[] } {
  const [header, ...records] = parseCsv(text) as [string[], ...string[][]];
  for (const r of records) assert.equal(r.length, header.length, JSON.stringify(r));
  return { header, rows: records.map((r) => Object.fromEntries(header.map((h, i) => [h, r[i] as string]))) };
}

const FIXED = [
  "run_id",
  "input_file",
  "status",
  "attempt",
  "error_code",
  "error_message",
  "started_at",
  "finished_at",
  "duration_ms",
];

const HOSTILE_NAMES = [
  "plain.csv",
  "with, comma.csv",
  'with "quotes".csv',
  "with\nnewline\r\n.csv",
  "=cmd|' /C calc'!A0",
  "+1+2.csv",
  "-2.csv",
  "@SUM(A1).csv",
  "ünïcødé — 数据.csv",
  "results.csv",
];

async function hostileTask(): Promise<{ taskId: string; names: Map<string, string> }> {
  // Programs report finite numbers (the runner refuses anything else), but the table must not rely on
  // that, nor on messages being fixed texts: other values are written into the rows below.
  const metrics = [
    { rows: 3, mean: -1.5 },
    { rows: 4, 'weird, "key"': 2 },
    { rows: 0, "=1+1": 5 },
  ];
  const files: string[] = [];
  for (const [i, name] of HOSTILE_NAMES.entries()) {
    const spec =
      i === 3
        ? { exit: 3 }
        : { files: { "out.json": "{}" }, result: "out.json", metrics: metrics[i % metrics.length] };
    const id = await env.file(JSON.stringify(spec));
    await env.db.sql`update files set name = ${name} where id = ${id}`;
    files.push(id);
  }
  const taskId = await env.task("csv", files, { mode: "input" });
  const w = env.worker([fixtureProgram("csv")]);
  await w.start();
  await waitForTerminal(env.db.sql, taskId);
  await w.stop();
  // A hostile message too (programs' messages are fixed today; the table must not trust that).
  await env.db.sql`
    update runs set error_message = ${'-1, "oops"\n=2+3'} where task_id = ${taskId} and status = 'failed'`;
  const more: Record<string, Record<string, unknown>> = {
    "plain.csv": { label: '=HYPERLINK("http://x")', nested: { a: [1, "b,c"] }, ok: true },
    "with, comma.csv": { 'weird, "key"': "line\nbreak", empty: null },
    'with "quotes".csv': { list: [1, 2] },
  };
  for (const [name, m] of Object.entries(more)) {
    await env.db.sql`
      update runs set result = jsonb_set(result, '{metrics}', (result -> 'metrics') || ${env.db.sql.json(m as never)})
      where task_id = ${taskId} and input_name = ${name}`;
  }
  const rows = await env.db.sql<{ id: string; name: string }[]>`
    select r.id::text as id, r.input_name as name from runs r where r.task_id = ${taskId} order by r.id`;
  return { taskId, names: new Map(rows.map((r) => [r.id, r.name])) };
}

let hostile: { taskId: string; names: Map<string, string> } | undefined;
const hostileOnce = async () => (hostile ??= await hostileTask());

test("results.csv: a row per run in id order, hostile text escaped and formula-guarded, metric columns", async () => {
  const { taskId } = await hostileOnce();
  const res = await get(`/api/analysis-tasks/${taskId}/results.csv`);
  assert.equal(res.statusCode, 200);
  assert.equal(res.headers["content-type"], "text/csv; charset=utf-8");
  assert.equal(res.headers["x-content-type-options"], "nosniff");
  assert.match(
    String(res.headers["content-disposition"]),
    new RegExp(`^attachment; filename="task-${taskId}-results.csv"`),
  );
  const { header, rows } = table(res.body);
  assert.deepEqual(header, [
    ...FIXED,
    "'=1+1",
    "empty",
    "label",
    "list",
    "mean",
    "nested",
    "ok",
    "rows",
    'weird, "key"',
  ]);

  const runs = await env.db.sql<
    {
      id: string;
      name: string;
      status: string;
      attempt: number;
      errorCode: string | null;
      errorMessage: string | null;
      startedAt: Date;
      finishedAt: Date;
      metrics: Record<string, unknown> | null;
    }[]
  >`
    select r.id::text as id, r.input_name as name, r.status, r.attempt, r.error_code as "errorCode",
           r.error_message as "errorMessage", r.started_at as "startedAt", r.finished_at as "finishedAt",
           r.result -> 'metrics' as metrics
    from runs r where r.task_id = ${taskId} order by r.id`;
  assert.equal(rows.length, HOSTILE_NAMES.length);
  for (const [i, run] of runs.entries()) {
    const row = rows[i] as Record<string, string>;
    assert.equal(row.run_id, run.id);
    assert.equal(row.input_file, guardFormula(run.name));
    assert.equal(row.status, run.status);
    assert.equal(row.attempt, String(run.attempt));
    assert.equal(row.error_code, run.errorCode ?? "");
    assert.equal(row.error_message, run.errorMessage === null ? "" : guardFormula(run.errorMessage));
    assert.equal(row.started_at, run.startedAt.toISOString());
    assert.equal(row.finished_at, run.finishedAt.toISOString());
    assert.equal(row.duration_ms, String(run.finishedAt.getTime() - run.startedAt.getTime()));
    const m = run.metrics ?? {};
    assert.equal(row.rows, m.rows === undefined ? "" : String(m.rows));
  }
  const byName = new Map(rows.map((r) => [r.input_file, r]));
  // Text that a spreadsheet would evaluate starts with a quote; every other cell is as it was.
  assert.ok(byName.has("'=cmd|' /C calc'!A0"));
  assert.ok(byName.has("'+1+2.csv") && byName.has("'-2.csv") && byName.has("'@SUM(A1).csv"));
  assert.ok(byName.has("with, comma.csv") && byName.has('with "quotes".csv'));
  assert.ok(byName.has("ünïcødé — 数据.csv") && byName.has("results.csv"));
  const failed = byName.get("with\nnewline\r\n.csv");
  assert.deepEqual(
    [failed?.status, failed?.error_code, failed?.error_message, failed?.rows],
    ["failed", "ANALYSIS_DATA_INVALID", '\'-1, "oops"\n=2+3', ""],
  );
  const first = byName.get("plain.csv") as Record<string, string>;
  // Numbers as they are (a negative one unguarded), strings guarded, objects and arrays as JSON.
  assert.deepEqual(
    [first.rows, first.mean, first.label, first.nested, first.ok, first.list, first.empty],
    ["3", "-1.5", '\'=HYPERLINK("http://x")', '{"a":[1,"b,c"]}', "true", "", ""],
  );
  const second = byName.get("with, comma.csv") as Record<string, string>;
  assert.deepEqual([second.rows, second['weird, "key"'], second.empty], ["4", "line\nbreak", ""]);
  assert.equal(byName.get('with "quotes".csv')?.list, "[1,2]");
});

test("results.csv: owner and admin; another user's task or an odd id → 404", async () => {
  const { taskId } = await hostileOnce();
  assert.equal((await get(`/api/analysis-tasks/${taskId}/results.csv`, admin)).statusCode, 200);
  for (const [url, t] of [
    [`/api/analysis-tasks/${taskId}/results.csv`, stranger],
    ["/api/analysis-tasks/999999999999999/results.csv", token],
    ["/api/analysis-tasks/01/results.csv", token],
  ] as const) {
    const res = await get(url, t);
    assert.equal(res.statusCode, 404, url);
    assert.equal(res.json().code, "ANALYSIS_TASK_NOT_FOUND", url);
  }
});

test("the task's zip holds the same results.csv at its root (an input named results.csv gets its own folder)", async () => {
  const { taskId, names } = await hostileOnce();
  const zip = await get(`/api/analysis-tasks/${taskId}/download`);
  assert.equal(zip.statusCode, 200);
  const entries = zipNames(zip.rawPayload);
  assert.equal(entries[0], "results.csv");
  assert.equal(entries.filter((n) => !n.includes("/")).length, 1);
  const resultsRun = [...names].find(([, n]) => n === "results.csv")?.[0];
  assert.ok(entries.includes(`results.csv (run ${resultsRun})/out.json`), entries.join(" | "));
  const csv = (await get(`/api/analysis-tasks/${taskId}/results.csv`)).body;
  assert.equal(zipRead(zip.rawPayload, "results.csv").toString("utf8"), csv);
});

test("results.csv while the task runs: queued and live runs have empty outcome cells", async () => {
  const taskId = await createTask(env.db.sql, env.owner, "csv-live", 3);
  const [claimed] = await runClaim(env.db.sql, {
    workerId: "w",
    analysisType: "csv-live",
    limit: 1,
    globalLimit: 0,
    leaseTtlMs: 30_000,
  });
  assert.ok(claimed);
  const { header, rows } = table((await get(`/api/analysis-tasks/${taskId}/results.csv`)).body);
  assert.deepEqual(header, FIXED);
  assert.deepEqual(
    rows.map((r) => [r.status, r.attempt, r.finished_at, r.duration_ms]),
    [
      ["starting", "1", "", ""],
      ["queued", "0", "", ""],
      ["queued", "0", "", ""],
    ],
  );
  assert.match(rows[0]?.started_at ?? "", /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  assert.equal(rows[1]?.started_at, "");
});

test("a task of 3,000 runs streams every row once, in numeric id order across pages", async () => {
  const n = 3000;
  // Ids go from 10^k - 1500 to 10^k + 1499: text order would put the second half first.
  await idsCrossPowerOfTen(env.db.sql, "runs", n / 2);
  const taskId = await createTask(env.db.sql, env.owner, "csv-big", n);
  // Every other run succeeds with a metric; the rest stay queued.
  const claimed = await runClaim(env.db.sql, {
    workerId: "w",
    analysisType: "csv-big",
    limit: n / 2,
    globalLimit: 0,
    leaseTtlMs: 30_000,
  });
  await runComplete(
    env.db.sql,
    claimed.map((r) => ({
      id: r.id,
      token: r.leaseToken,
      status: "succeeded" as const,
      result: { outputFileName: "out.json", metrics: { n: r.id % 7 } },
    })),
  );
  const res = await get(`/api/analysis-tasks/${taskId}/results.csv`);
  assert.equal(res.statusCode, 200);
  const { header, rows } = table(res.body);
  assert.deepEqual(header, [...FIXED, "n"]);
  const ids = await env.db.sql<{ id: string }[]>`
    select r.id::text as id from runs r where r.task_id = ${taskId} order by r.id`;
  assert.equal(rows.length, n);
  assert.deepEqual(
    rows.map((r) => r.run_id),
    ids.map((r) => r.id),
  );
  const succeeded = rows.filter((r) => r.status === "succeeded");
  assert.equal(succeeded.length, n / 2);
  for (const r of succeeded) assert.equal(r.n, String(Number(r.run_id) % 7));
  // The run ids of the test template cross a power of ten: text order would differ from this.
  assert.ok(new Set(ids.map((r) => r.id.length)).size > 1, "the ids cross a power of ten");
});

test("a wide table (many metric keys) is streamed a few rows at a time, not a page of 1,000 rows in one piece", async () => {
  // Each run reports metrics of its own (a program that names them after its input's columns): the
  // table is as wide as all of them together, and a page of 1,000 such rows was one string of every
  // row (1,000 × 30,000 cells here; past V8's longest string, or the API's memory, for wider ones).
  const n = 1000;
  const perRun = 30;
  const taskId = await createTask(env.db.sql, env.owner, "csv-wide", n);
  await env.db.sql`
    update runs r set result = jsonb_build_object('outputFileName', 'out.json',
      'metrics', (select jsonb_object_agg('m' || r.id || '_' || k, k) from generate_series(1, ${perRun}) k))
    where r.task_id = ${taskId}`;
  const keys = await resultMetricKeys(env.db.sql, taskId);
  assert.equal(keys.length, n * perRun);
  let largest = 0;
  const chunks: Buffer[] = [];
  await pipeline(
    resultsCsv(env.db.sql, taskId, keys),
    new Writable({
      write(chunk: Buffer, _encoding, done) {
        largest = Math.max(largest, chunk.length);
        chunks.push(chunk);
        done();
      },
    }),
  );
  const [header = "", ...rows] = Buffer.concat(chunks).toString().split("\r\n").slice(0, -1);
  assert.equal(rows.length, n);
  // The header is one line (it is as long as the keys are); rows come a few at a time: no piece
  // holds more than a header, or 64 KiB of rows and one more (a page joined was 1,000 rows).
  const row = Math.max(...rows.map((r) => r.length + 2));
  assert.ok(row >= n * perRun, "a row has a cell per metric key");
  assert.ok(
    largest <= Math.max(header.length + 2, 64 * 1024 + row),
    `the largest piece held at once: ${largest} bytes; the header ${header.length}, a row ${row}`,
  );
});

test("results.csv of a task deleted between two pages is broken off, never ended as a shorter table", async () => {
  const n = 1500; // more than a page (1,000 runs)
  await idsCrossPowerOfTen(env.db.sql, "runs", n / 2);
  const taskId = await createTask(env.db.sql, env.owner, "csv-gone", n);
  await env.db.sql`
    update runs set input_name = 'ünïcødé — ' || id || '.csv', error_message = ${'=1+1, "x"\n'}
    where task_id = ${taskId}`;
  // Retention's delete (the task row, and its runs by trigger), committed just before the second page
  // is read: a page query is the one naming this task and a run id to read after.
  let pages = 0;
  const sql = new Proxy(env.db.sql, {
    apply(target, thisArg, args: unknown[]) {
      const [strings, ...values] = args;
      const page = Array.isArray(strings) && strings.join("?").includes("r.id > ") && values.includes(taskId);
      if (page && ++pages === 2) {
        return (async () => {
          await env.db.sql`delete from tasks where id = ${taskId}`;
          return Reflect.apply(target, thisArg, args);
        })();
      }
      return Reflect.apply(target, thisArg, args);
    },
  }) as Sql;
  const logs: Record<string, unknown>[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split("\n")) if (line) logs.push(JSON.parse(line));
      done();
    },
  });
  const raced = await buildServer(
    {
      config: loadConfig({ ASSAY_DATA_DIR: env.dataDir, DATABASE_URL: env.db.url }),
      database: { ...env.db, sql },
      storage: env.storage,
      expectedMigrations: expectedMigrationCount(),
    },
    createLogger({ level: "info", destination }),
  );
  try {
    const outcome = await raced
      .inject({ url: `/api/analysis-tasks/${taskId}/results.csv`, headers: bearer(token) })
      .then(
        (res) => ({ status: res.statusCode, rows: table(res.body).rows.length }),
        (err: unknown) => err,
      );
    assert.equal(pages, 2, "the task was deleted after the first page");
    assert.ok(outcome instanceof Error, `ended whole: ${JSON.stringify(outcome)}`);
    assert.match(outcome.message, /destroyed before completion/);
    assert.ok(
      logs.some(
        (l) =>
          l.msg === "results.csv broken off" &&
          l.taskId === taskId &&
          (l.err as { type?: string }).type === "ResultsTaskGoneError",
      ),
      JSON.stringify(logs.filter((l) => (l.level as number) >= 40)),
    );
  } finally {
    await raced.close();
  }
});
