// Many machines, proven on one: `assay api` and two `assay worker`s as separate hosts — each its own OS
// user with a 0700 data directory and its own network namespace, reaching PostgreSQL and the S3 server
// only over veth addresses — with ASSAY_STORAGE=s3. Files live only in the bucket: tasks of all three
// analysis types run to the end under a live SSE stream, their zips hold every output, no host keeps a
// file, a worker SIGKILLed mid-run is replaced by the other (counted once, nothing orphaned), and a
// cancel reaches a run on another host. Needs root (CI runs as root).
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { collect, watch } from "../helpers/cli.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createHosts, type Host, type Hosts } from "../helpers/hosts.ts";
import { waitFor } from "../helpers/queue.ts";
import { createTestBucket, type TestBucket } from "../helpers/s3.ts";
import { openSse } from "../helpers/sse.ts";
import { zipNames } from "../helpers/zip.ts";

const isRoot = process.getuid?.() === 0;
const skip = isRoot ? false : "needs root: OS users, network namespaces and veth pairs";

let hosts: Hosts;
let db: TestDatabase;
let bucket: TestBucket;
let api: string;
let token: string;
const processes = new Map<string, ChildProcess>();
const envOf = new Map<string, Record<string, string>>();

/** Files under `dir` (recursively), relative to it: a host that keeps no file has none. */
function filesUnder(dir: string): string[] {
  const found: string[] = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (!entry.isDirectory()) found.push(path.relative(dir, path.join(entry.parentPath, entry.name)));
  }
  return found;
}

async function startWorker(name: string): Promise<ChildProcess> {
  const host = hosts.hosts[name] as Host;
  const child = hosts.assay(
    host,
    ["worker", "--concurrency", "2"],
    envOf.get(name) as Record<string, string>,
  );
  processes.set(name, child);
  await watch(child).waitFor(/"msg":"worker started"/);
  return child;
}

before(async () => {
  if (!isRoot) return;
  hosts = await createHosts(["api", "w1", "w2"]);
  db = await createTestDatabase();
  bucket = await createTestBucket();
  const dbUrl = new URL(db.url);
  const s3Port = Number(new URL(bucket.endpoint).port);
  for (const host of Object.values(hosts.hosts)) {
    const pg = await hosts.forward(host, Number(dbUrl.port));
    const s3 = await hosts.forward(host, s3Port);
    const url = new URL(db.url);
    url.hostname = host.gateway;
    url.port = String(pg);
    envOf.set(host.name, {
      ...bucket.env,
      ASSAY_S3_ENDPOINT: `http://${host.gateway}:${s3}`,
      ASSAY_DATA_DIR: host.dataDir,
      DATABASE_URL: url.toString(),
      LOG_LEVEL: "info",
      ASSAY_PYTHON: fs.existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3",
      ASSAY_LEASE_TTL_MS: "3000",
      ASSAY_REAP_INTERVAL_MS: "500",
      ASSAY_POLL_INTERVAL_MS: "500",
      ASSAY_SSE_HEARTBEAT_MS: "1000",
      HOST: host.address,
      PORT: "0",
    });
  }
  const apiProcess = hosts.assay(
    hosts.hosts.api as Host,
    ["api"],
    envOf.get("api") as Record<string, string>,
  );
  processes.set("api", apiProcess);
  api = (await watch(apiProcess).waitFor(/Server listening at (http:\/\/[0-9.]+:\d+)/))[1] as string;
  await startWorker("w1");
  await startWorker("w2");
  token = (await tokenCreate(db.sql, "analyst")).token;
});

after(async () => {
  if (!isRoot) return;
  for (const p of processes.values()) p.kill("SIGTERM");
  await Promise.all(
    [...processes.values()].map((p) =>
      p.exitCode !== null || p.signalCode !== null ? undefined : collect(p),
    ),
  );
  await hosts.close();
  await bucket.drop();
  await db.drop();
});

const auth = () => ({ authorization: `Bearer ${token}` });

async function upload(name: string, content: string | Buffer): Promise<string> {
  const form = new FormData();
  form.append("file", new Blob([content]), name);
  const res = await fetch(`${api}/api/files`, { method: "POST", body: form, headers: auth() });
  assert.equal(res.status, 201, await res.clone().text());
  return ((await res.json()) as { data: { fileId: string } }).data.fileId;
}

async function createTask(analysisType: string, inputFileIds: string[], parameters: object = {}) {
  const res = await fetch(`${api}/api/analysis-tasks`, {
    method: "POST",
    headers: { ...auth(), "content-type": "application/json" },
    body: JSON.stringify({ analysisType, inputFileIds, parameters }),
  });
  assert.equal(res.status, 201, await res.clone().text());
  return ((await res.json()) as { data: { taskId: string } }).data.taskId;
}

async function taskOf(taskId: string) {
  const res = await fetch(`${api}/api/analysis-tasks/${taskId}`, { headers: auth() });
  return ((await res.json()) as { data: Record<string, unknown> & { status: string } }).data;
}

const finished = (taskId: string, timeoutMs = 120_000) =>
  waitFor(
    async () => {
      const t = await taskOf(taskId);
      return ["succeeded", "partially_succeeded", "failed", "timed_out", "cancelled"].includes(t.status)
        ? t
        : undefined;
    },
    timeoutMs,
    `task ${taskId} to end`,
  );

/** A CSV that takes r-report several seconds: the run is still going when the test acts on it. */
function slowCsv(rows: number): string {
  const lines = ["id,a,b,c"];
  for (let i = 0; i < rows; i++) lines.push(`${i},${(i * 7) % 101}.5,${(i * 13) % 97},${i % 5}`);
  return `${lines.join("\n")}\n`;
}

test("a host cannot read another host's files, even by an absolute path", { skip }, async () => {
  const w1 = hosts.hosts.w1 as Host;
  const res = await hosts.node(
    hosts.hosts.api as Host,
    `try { require("fs").readdirSync(${JSON.stringify(w1.dataDir)}); console.log("read") } catch (e) { console.log(e.code) }`,
  );
  assert.equal(res.output.trim(), "EACCES");
});

test("50 files through all three analysis types across hosts: SSE to the end, whole zips, no file on any host", {
  skip,
  timeout: 300_000,
}, async () => {
  const ids: string[] = [];
  for (let i = 0; i < 50; i++) {
    const name = [`données ${i}.csv`, `../../etc/passwd ${i}.csv`, `"quoted" — ${i}.csv`, `ünïcödé-${i}.csv`][
      i % 4
    ] as string;
    ids.push(await upload(name, `x,y,label\n${i},${i * 2.5},a\n${i + 1},${i * 3},b\n${i + 2},1.25,c\n`));
  }
  const tasks = {
    summary: await createTask("summary", ids),
    "python-stats": await createTask("python-stats", ids, { method: "mean" }),
    "r-report": await createTask("r-report", ids),
  };
  const stream = await openSse(`${api}/api/analysis-tasks/${tasks.summary}/events`, token);
  assert.equal(stream.status, 200);
  await stream.ended;
  assert.equal(stream.events.at(-1)?.event, "task.succeeded");
  assert.equal(stream.events.filter((e) => e.event === "run.succeeded").length, 50);
  for (const [type, taskId] of Object.entries(tasks)) {
    const t = await finished(taskId);
    assert.equal(t.status, "succeeded", `${type}: ${JSON.stringify(t)}`);
    const res = await fetch(`${api}/api/analysis-tasks/${taskId}/download`, { headers: auth() });
    assert.equal(res.status, 200);
    const zip = Buffer.from(await res.arrayBuffer());
    const names = zipNames(zip);
    assert.equal(names[0], "results.csv", `${type}: the results table at the root`);
    const folders = new Set(names.slice(1).map((n) => n.split("/")[0]));
    assert.equal(folders.size, 50, `${type}: a folder per input file`);
  }
  // Files live in the bucket only: the API keeps none, and idle workers keep none.
  assert.deepEqual(filesUnder((hosts.hosts.api as Host).dataDir), []);
  for (const name of ["w1", "w2"])
    assert.deepEqual(filesUnder((hosts.hosts[name] as Host).dataDir), [], name);
});

test("a worker SIGKILLed mid-run: the other host finishes the run, counted once, nothing orphaned", {
  skip,
  timeout: 180_000,
}, async () => {
  const fileId = await upload("slow.csv", slowCsv(400_000));
  const taskId = await createTask("r-report", [fileId]);
  const [run] = await waitFor(
    async () => {
      const rows = await db.sql<{ id: string; owner: string | null }[]>`
        select r.id::text as id, r.lease_owner as owner from runs r
        where r.task_id = ${taskId} and r.status = 'running'`;
      return rows.length > 0 ? rows : undefined;
    },
    60_000,
    "the run to be running",
  );
  const victim = [...processes.entries()].find(
    ([name, p]) => name !== "api" && run?.owner?.split(":")[1] === String(p.pid),
  );
  assert.ok(victim, `the worker holding the run (${run?.owner}) is one of ours`);
  const [victimName, victimProcess] = victim;
  const gone = collect(victimProcess);
  victimProcess.kill("SIGKILL");
  await gone;
  processes.delete(victimName);
  const t = await finished(taskId, 120_000);
  assert.equal(t.status, "succeeded");
  assert.equal(t.succeededCount, 1);
  const [row] = await db.sql<{ attempt: number; key: string }[]>`
    select r.attempt, r.output_key as key from runs r where r.task_id = ${taskId}`;
  assert.equal(row?.attempt, 2, "the second attempt, on the other host");
  const objects = (await bucket.store().list(`outputs/${taskId}/`)).map((o) => o.key);
  assert.ok(objects.length > 0);
  assert.ok(
    objects.every((k) => k.startsWith(`outputs/${row?.key}/`)),
    `only the winner's objects remain: ${objects.join(", ")}`,
  );
  // The killed worker's scratch folder stays on its host until a worker starts there again.
  await startWorker(victimName);
  assert.deepEqual(filesUnder((hosts.hosts[victimName] as Host).dataDir), []);
});

test("a cancel sent to the API reaches a run on a worker host", { skip, timeout: 180_000 }, async () => {
  const fileId = await upload("slow-cancel.csv", slowCsv(400_000));
  const taskId = await createTask("r-report", [fileId]);
  await waitFor(
    async () =>
      (await db.sql`select 1 from runs where task_id = ${taskId} and status = 'running'`).length > 0,
    60_000,
    "the run to be running",
  );
  const res = await fetch(`${api}/api/analysis-tasks/${taskId}/cancel`, { method: "POST", headers: auth() });
  assert.equal(res.status, 202, await res.clone().text());
  const t = await finished(taskId, 30_000);
  assert.equal(t.status, "cancelled");
  assert.deepEqual(await bucket.store().list(`outputs/${taskId}/`), []);
});
