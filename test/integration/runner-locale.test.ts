// A run's outcome must not depend on which worker ran it: the runner gives every program LANG=C.UTF-8
// and TZ=UTC, whatever the worker's own locale and zone (src/runner/handler.ts, childEnv). It passed the
// worker's LANG and TZ on: a program on a host in Kolkata saw its zone, one on a Turkish host the
// Turkish locale, and R on a host whose LANG names a locale that is not installed warned on stderr
// ("Setting LC_CTYPE failed"), which a failed run keeps as its stderrTail. Through a real worker.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import { findPrograms, type Program } from "../../src/analyses/programs.ts";
import { waitForTerminal } from "../helpers/queue.ts";
import { type RunnerEnv, runnerEnv, runOutputDir, writeProgram } from "../helpers/runner.ts";

let env: RunnerEnv;
const saved: Record<string, string | undefined> = {};
// The worker's own environment: a German and Turkish host in India, with a language list of its own.
const WORKER_ENV: Record<string, string> = {
  LANG: "tr_TR.UTF-8",
  LC_ALL: "de_DE.UTF-8",
  LC_NUMERIC: "fr_FR.UTF-8",
  LANGUAGE: "de:fr",
  TZ: "Asia/Kolkata",
};
before(async () => {
  env = await runnerEnv();
  for (const [k, v] of Object.entries(WORKER_ENV)) {
    saved[k] = process.env[k];
    process.env[k] = v;
  }
});
after(async () => {
  for (const [k, v] of Object.entries(saved)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  await env.close();
});

let typeSeq = 0;
async function runOne(p: Program, content: string, parameters: Record<string, unknown>) {
  const w = env.worker([p]);
  const taskId = await env.task(p.type, [await env.file(content)], parameters);
  await w.start();
  await waitForTerminal(env.db.sql, taskId, 60_000);
  await w.stop();
  const [run] = await env.db.sql<
    { id: string; status: string; error_message: string | null; result: Record<string, unknown> | null }[]
  >`select id::text, status, error_message, result from runs where task_id = ${taskId}`;
  return run as NonNullable<typeof run>;
}

test("a program sees LANG=C.UTF-8 and TZ=UTC, not the worker's locale and zone", async () => {
  const { script, cwd } = writeProgram(
    env.dataDir,
    "locale",
    `const o = Intl.DateTimeFormat().resolvedOptions();
fs.writeFileSync(path.join(out, "seen.json"), JSON.stringify({
  env: process.env,
  timeZone: o.timeZone,
  epoch: new Date(0).toString(),
}));
say({ type: "result", outputFileName: "seen.json", metrics: {} });`,
  );
  const type = `locale-${++typeSeq}`;
  const run = await runOne({ type, executable: process.execPath, script, cwd }, "a\n1\n", {});
  assert.equal(run.status, "succeeded", run.error_message ?? "");
  const seen = JSON.parse(fs.readFileSync(path.join(await runOutputDir(env, run.id), "seen.json"), "utf8"));
  assert.equal(seen.env.LANG, "C.UTF-8");
  assert.equal(seen.env.TZ, "UTC");
  assert.deepEqual(
    Object.keys(seen.env).filter((k) => k.startsWith("LC_") || k === "LANGUAGE"),
    [],
    "no LC_* or LANGUAGE: LANG decides every category",
  );
  assert.equal(seen.timeZone, "UTC");
  assert.match(seen.epoch, /^Thu Jan 01 1970 00:00:00 GMT\+0000/);
});

const rscript = findPrograms({}).available.find((p) => p.type === "r-report");
test("r-report on a worker whose LANG is not installed: no locale warnings in the failed run's stderr", {
  skip: rscript || process.env.CI === "true" ? false : "Rscript is not installed",
}, async () => {
  process.env.LANG = "xx_YY.UTF-8";
  process.env.LC_ALL = "xx_YY.UTF-8";
  try {
    // A text column only: exit 3, and the run keeps the program's stderr.
    const run = await runOne(rscript as Program, "name,ville\nÉmile,İzmir\n", {});
    assert.equal(run.status, "failed");
    assert.match(run.error_message ?? "", /no numeric column/);
    const stderr = String(run.result?.stderrTail ?? "");
    assert.doesNotMatch(stderr, /Setting LC_|LC_CTYPE|failed, using "C"/, stderr);
    assert.equal(stderr.trim(), "no numeric column");
  } finally {
    process.env.LANG = WORKER_ENV.LANG;
    process.env.LC_ALL = WORKER_ENV.LC_ALL;
  }
});
