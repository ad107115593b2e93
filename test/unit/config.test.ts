import assert from "node:assert/strict";
import path from "node:path";
import { test } from "node:test";
import {
  ConfigError,
  configTable,
  DEFAULT_MAX_UPLOAD_BYTES,
  loadConfig,
  typeSettings,
} from "../../src/config.ts";

test("defaults", () => {
  const c = loadConfig({});
  assert.equal(c.databaseUrl, undefined);
  assert.equal(c.host, "127.0.0.1");
  assert.equal(c.port, 3000);
  assert.equal(c.dataDir, path.resolve(".assay"));
  assert.equal(c.logLevel, "info");
  assert.equal(c.logFormat, "json");
  assert.equal(c.maxUploadBytes, DEFAULT_MAX_UPLOAD_BYTES);
  assert.equal(DEFAULT_MAX_UPLOAD_BYTES, 100 * 1024 * 1024);
});

test("values from the environment; empty strings count as unset", () => {
  const c = loadConfig({
    DATABASE_URL: "postgresql://u:p@db:5432/assay",
    HOST: "0.0.0.0",
    PORT: "8080",
    ASSAY_DATA_DIR: "/srv/assay",
    LOG_LEVEL: "debug",
    LOG_FORMAT: "pretty",
    ASSAY_MAX_UPLOAD_BYTES: "1024",
  });
  const { databaseUrl, host, port, dataDir, logLevel, logFormat, maxUploadBytes } = c;
  assert.deepEqual(
    { databaseUrl, host, port, dataDir, logLevel, logFormat, maxUploadBytes },
    {
      databaseUrl: "postgresql://u:p@db:5432/assay",
      host: "0.0.0.0",
      port: 8080,
      dataDir: "/srv/assay",
      logLevel: "debug",
      logFormat: "pretty",
      maxUploadBytes: 1024,
    },
  );
  assert.equal(loadConfig({ PORT: "" }).port, 3000);
});

test("queue settings and per-type settings (ASSAY_<TYPE>_…, `-` → `_`)", () => {
  const d = loadConfig({});
  assert.deepEqual(
    [d.leaseTtlMs, d.reapIntervalMs, d.pollIntervalMs, d.maxTaskRuns, d.prefetch],
    [30_000, 5000, 2000, 100_000, 0],
  );
  assert.deepEqual(typeSettings(d, "python-stats"), { concurrency: 0, maxAttempts: 3, timeoutMs: 600_000 });
  const c = loadConfig({
    ASSAY_PYTHON_STATS_CONCURRENCY: "2",
    ASSAY_PYTHON_STATS_MAX_ATTEMPTS: "5",
    ASSAY_R_REPORT_TIMEOUT_MS: "1000",
    ASSAY_WORKER_WAIT_MS: "5000",
  });
  assert.deepEqual(typeSettings(c, "python-stats"), { concurrency: 2, maxAttempts: 5, timeoutMs: 600_000 });
  assert.equal(typeSettings(c, "r-report").timeoutMs, 1000);
  assert.equal(c.workerWaitMs, 5000);
  assert.throws(
    () => loadConfig({ ASSAY_SUMMARY_MAX_ATTEMPTS: "0" }),
    /ASSAY_SUMMARY_MAX_ATTEMPTS="0": must be >= 1/,
  );
});

test("invalid values: one clear line per bad field", () => {
  let error: unknown;
  try {
    loadConfig({
      DATABASE_URL: "mysql://x",
      PORT: "eighty",
      LOG_LEVEL: "loud",
      ASSAY_MAX_UPLOAD_BYTES: "0",
      LOG_FORMAT: "xml",
    });
  } catch (err) {
    error = err;
  }
  assert.ok(error instanceof ConfigError);
  assert.deepEqual(error.problems, [
    'DATABASE_URL="mysql://x": must be a postgres:// or postgresql:// URL',
    'PORT="eighty": must be integer',
    'LOG_LEVEL="loud": must be one of fatal, error, warn, info, debug, trace, silent',
    'LOG_FORMAT="xml": must be one of json, pretty',
    'ASSAY_MAX_UPLOAD_BYTES="0": must be >= 1',
  ]);
  assert.throws(() => loadConfig({ PORT: "70000" }), /PORT="70000"/);
});

test("docs/configuration.md's table lists every field", async () => {
  const { readFile } = await import("node:fs/promises");
  const readme = await readFile(new URL("../../docs/configuration.md", import.meta.url), "utf8");
  // Compare cells, not spacing: the formatter aligns the table's columns.
  const cells = (line: string) =>
    line
      .split("|")
      .map((c) => c.trim())
      .join("|");
  const rows = new Set(readme.split("\n").map(cells));
  for (const line of configTable().split("\n").slice(2)) {
    assert.ok(rows.has(cells(line)), `docs/configuration.md is missing: ${line}`);
  }
});

test("durations a timer cannot wait for (over 2^31−1 ms, ~24.8 days) are refused at start-up, naming the field", () => {
  const thirtyDays = String(30 * 24 * 3600 * 1000);
  const durations = configTable()
    .split("\n")
    .map((line) => /^\| `([A-Z0-9_]+_MS)` /.exec(line)?.[1])
    .filter((env): env is string => env !== undefined);
  assert.ok(durations.length >= 12, `found ${durations.length} duration settings`);
  for (const env of durations) {
    assert.throws(
      () => loadConfig({ [env]: thirtyDays }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.problems.length === 1 &&
        err.problems[0]?.startsWith(`${env}="${thirtyDays}"`) === true &&
        /2147483647/.test(err.problems[0] ?? ""),
      env,
    );
    assert.doesNotThrow(() => loadConfig({ [env]: String(2 ** 31 - 1) }), env);
  }
  assert.throws(() => loadConfig({ ASSAY_RETENTION_DAYS: "1e300" }), ConfigError);
});
