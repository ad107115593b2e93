import assert from "node:assert/strict";
import path from "node:path";
import { test } from "node:test";
import {
  ConfigError,
  configInEffect,
  configInEffectText,
  configTable,
  DEFAULT_MAX_UPLOAD_BYTES,
  loadConfig,
  typeSettings,
  unknownVariables,
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
    ASSAY_LEASE_TTL_MS: "3000",
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

test("a worker wait shorter than the lease TTL is refused at start-up, naming both (workers stamp their types every TTL/3)", () => {
  const refused = (env: NodeJS.ProcessEnv, wait: number, ttl: number) =>
    assert.throws(
      () => loadConfig(env),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.problems.length === 1 &&
        err.problems[0]?.startsWith(
          `ASSAY_WORKER_WAIT_MS (${wait}) must be at least ASSAY_LEASE_TTL_MS (${ttl}): `,
        ) === true &&
        /heartbeat, every ASSAY_LEASE_TTL_MS \/ 3/.test(err.problems[0] ?? "") &&
        /ANALYSIS_WORKER_UNAVAILABLE/.test(err.problems[0] ?? ""),
      JSON.stringify(env),
    );
  // The reviewer's case: 5 s against the default 30 s lease, whose heartbeat comes every 10 s.
  refused({ ASSAY_WORKER_WAIT_MS: "5000" }, 5000, 30_000);
  refused({ ASSAY_WORKER_WAIT_MS: "29999" }, 29_999, 30_000);
  // A long lease with the wait left unset: the wait is the TTL (this was valid before the rule, and
  // must not fail every command); set explicitly shorter, it is refused.
  assert.equal(loadConfig({ ASSAY_LEASE_TTL_MS: "900000" }).workerWaitMs, 900_000);
  assert.equal(loadConfig({}).workerWaitMs, 600_000);
  refused({ ASSAY_LEASE_TTL_MS: "900000", ASSAY_WORKER_WAIT_MS: "600000" }, 600_000, 900_000);
  assert.equal(loadConfig({ ASSAY_WORKER_WAIT_MS: "30000" }).workerWaitMs, 30_000);
  assert.equal(loadConfig({ ASSAY_WORKER_WAIT_MS: "1000", ASSAY_LEASE_TTL_MS: "1000" }).workerWaitMs, 1000);
  // Either value invalid on its own: that one line only.
  assert.throws(
    () => loadConfig({ ASSAY_WORKER_WAIT_MS: "5000", ASSAY_LEASE_TTL_MS: "0" }),
    (err: unknown) =>
      err instanceof ConfigError &&
      err.problems.length === 1 &&
      err.problems[0]?.startsWith('ASSAY_LEASE_TTL_MS="0"') === true,
  );
});

test("an invalid DATABASE_URL never shows its password: the URL with the password as ***, or no value", () => {
  const problem = (url: string) => {
    try {
      loadConfig({ DATABASE_URL: url });
    } catch (err) {
      assert.ok(err instanceof ConfigError);
      assert.equal(err.problems.length, 1);
      return err.problems[0] as string;
    }
    assert.fail(`${url} was accepted`);
  };
  const rule = "must be a postgres:// or postgresql:// URL";
  assert.equal(
    problem("postgresql+psycopg2://assay:S3cr3tPw@db/assay"),
    `DATABASE_URL="postgresql+psycopg2://assay:***@db/assay": ${rule}`,
  );
  // A password with unescaped @ / # ? in it, and one in a parameter.
  for (const [url, shown] of [
    ["mysql://assay:p@ss/w#rd?x@db:3306/assay", "mysql://assay:***@db:3306/assay"],
    ["jdbc:postgresql://db/assay?user=assay&password=S3cr3tPw", undefined],
    [
      "postgis://db/assay?user=assay&password=S3cr3tPw&ssl=1",
      "postgis://db/assay?user=assay&password=***&ssl=1",
    ],
  ] as const) {
    const p = problem(url);
    assert.ok(!/S3cr3tPw|p@ss|w#rd/.test(p), p);
    assert.equal(
      p,
      shown === undefined
        ? `DATABASE_URL (value not shown: it may hold a secret): ${rule}`
        : `DATABASE_URL=${JSON.stringify(shown)}: ${rule}`,
    );
  }
  // Not a URL at all (a libpq keyword string): not shown.
  const p = problem("host=db user=assay password=S3cr3tPw");
  assert.ok(!p.includes("S3cr3tPw"), p);
  assert.match(p, /^DATABASE_URL .*must be a postgres/);
  // The error's message (what the CLI prints) carries no password either.
  assert.throws(
    () => loadConfig({ DATABASE_URL: "postgresql+psycopg2://assay:S3cr3tPw@db/assay", PORT: "x" }),
    (err: unknown) =>
      err instanceof Error && !err.message.includes("S3cr3tPw") && /PORT="x"/.test(err.message),
  );
});

test("a DATABASE_URL the PostgreSQL client cannot read is refused at start-up, naming it, the password hidden", () => {
  const rule =
    "is not a URL PostgreSQL's client can read: check the host and port, and percent-encode any of : / @ # ? % in the user name and password";
  for (const [url, shown] of [
    ["postgres://assay:S3cr3tPw@db.internal:99999/assay", "postgres://assay:***@db.internal:99999/assay"],
    ["postgresql://assay:S3cr3tPw@db.internal:pg/assay", "postgresql://assay:***@db.internal:pg/assay"],
    // Unescaped # and a stray % in the password.
    ["postgres://assay:S3cr#tPw@db/assay", "postgres://assay:***@db/assay"],
    ["postgres://assay:50%off@db/assay", "postgres://assay:***@db/assay"],
    ["postgres://[::1/assay", "postgres://[::1/assay"],
  ] as const) {
    assert.throws(
      () => loadConfig({ DATABASE_URL: url }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.problems.length === 1 &&
        err.problems[0] === `DATABASE_URL=${JSON.stringify(shown)}: ${rule}`,
      url,
    );
  }
  // What the client does read: several hosts with an escaped @ in the password, an unescaped one with
  // one host (the URL parser takes the last @), no host at all (PGHOST).
  for (const url of [
    "postgres://assay:p%40ss@db1:5432,db2:5433/assay?sslmode=require",
    "postgres://assay:p@ss@db1:5432/assay",
    "postgresql://assay:%23%25@db-ünï.internal:5432/assay",
    "postgres:///assay",
  ]) {
    assert.equal(loadConfig({ DATABASE_URL: url }).databaseUrl, url);
  }
});

test("a DATABASE_URL of several hosts with an unescaped @ in its password is refused: the rest of the password became the first host", () => {
  // postgres.js takes the credentials up to the first @ when there are several hosts: the first host
  // was `ss@db1`, and every connection error printed that part of the password.
  for (const url of [
    "postgres://assay:p@ss@db1:5432,db2:5433/assay?sslmode=require",
    "postgres://u:S3CR@ET@h1,h2/db",
  ]) {
    assert.throws(
      () => loadConfig({ DATABASE_URL: url }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.problems.length === 1 &&
        (err.problems[0] ?? "").endsWith(
          ": has an @ in its user name or password that is not percent-encoded: write it %40",
        ) &&
        !err.message.includes("S3CR") &&
        !err.message.includes("p@ss"),
      url,
    );
  }
});

test("a DATABASE_URL with an IPv6 address in brackets is refused at start-up (exit 2), saying to use a host name", () => {
  // postgres.js (3.4.9) takes each host up to its first `:`: every command failed with
  // `getaddrinfo ENOTFOUND [`, after the start-up check had passed.
  const rule =
    "has an IPv6 address in brackets, which PostgreSQL's client cannot connect to: give the database a host name (one in /etc/hosts will do)";
  for (const [url, shown] of [
    ["postgres://postgres:S3cr3tPw@[::1]:5432/fresh", "postgres://postgres:***@[::1]:5432/fresh"],
    ["postgresql://assay:%23%25@[::1]:5432/assay", "postgresql://assay:***@[::1]:5432/assay"],
    ["postgres://assay@[fd00::2]/assay_ünï", "postgres://assay@[fd00::2]/assay_ünï"],
    [
      "postgres://assay:pw@db1:5432,[2001:db8::1]:5433/assay",
      "postgres://assay:***@db1:5432,[2001:db8::1]:5433/assay",
    ],
  ] as const) {
    assert.throws(
      () => loadConfig({ DATABASE_URL: url }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.problems.length === 1 &&
        err.problems[0] === `DATABASE_URL=${JSON.stringify(shown)}: ${rule}`,
      url,
    );
  }
});

test("ASSAY_ variables nothing reads (a misspelt setting) are found, each with the nearest setting's name", () => {
  assert.deepEqual(
    unknownVariables({
      ASSAY_SHUTDOWN_GRACE: "60000",
      ASSAY_LEASE_TLL_MS: "3000",
      assay_port: "1",
      ASSAY_FROBNICATE: "yes",
      ASSAY_SHUTDOWN_GRACE_MS: "1",
      ASSAY_PYTHON_STATS_CONCURRENCY: "2",
      ASSAY_NODE_FLAGS: "0",
      ASSAY_URL: "http://h",
      ASSAY_TOKEN: "t",
      ASSAY_BUNDLE: "0",
      DATABASE_URL: "postgres://h/db",
      DATABASE_URI: "postgres://h/db",
    }),
    [
      { name: "ASSAY_FROBNICATE" },
      { name: "ASSAY_LEASE_TLL_MS", nearest: "ASSAY_LEASE_TTL_MS" },
      { name: "ASSAY_SHUTDOWN_GRACE", nearest: "ASSAY_SHUTDOWN_GRACE_MS" },
    ],
  );
  assert.deepEqual(unknownVariables({}), []);
});

test("digits are a number only where the field is numeric: HOST=10 and a bucket named 123456 are strings", () => {
  const c = loadConfig({ HOST: "10", ASSAY_STORAGE: "s3", ASSAY_S3_BUCKET: "123456", PORT: "8080" });
  assert.equal(c.host, "10");
  assert.equal(c.s3Bucket, "123456");
  assert.equal(c.port, 8080);
});

test("a bucket name S3 would refuse (a path, a space, too short or long) is refused at start-up, saying what a name is", () => {
  for (const bad of ["assay/prod", "assay prod", "ab", "a".repeat(64), "-assay", "assay.", "bücket"]) {
    assert.throws(
      () => loadConfig({ ASSAY_STORAGE: "s3", ASSAY_S3_BUCKET: bad }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.problems.some((p) => p.startsWith("ASSAY_S3_BUCKET=") && p.includes("must be a bucket name")) &&
        // Said once: not also "is required", as if none had been given.
        err.problems.filter((p) => p.startsWith("ASSAY_S3_BUCKET")).length === 1,
      bad,
    );
  }
  assert.throws(
    () => loadConfig({ ASSAY_STORAGE: "s3" }),
    (err: unknown) =>
      err instanceof ConfigError &&
      err.problems.includes("ASSAY_S3_BUCKET: is required with ASSAY_STORAGE=s3"),
  );
  for (const good of ["abc", "assay-prod.eu_1", "Legacy_Bucket", "a".repeat(63)])
    assert.equal(loadConfig({ ASSAY_STORAGE: "s3", ASSAY_S3_BUCKET: good }).s3Bucket, good);
});

test("a path, host or name with white space at an end or a control character (a CRLF env file) is refused", () => {
  const why =
    "must not begin or end with white space, nor hold control characters (a line ending from a file written on Windows?)";
  let error: unknown;
  try {
    loadConfig({
      // Each was used as given: another (empty) data directory, a host nothing resolves, a Python no
      // worker found — without a word.
      ASSAY_DATA_DIR: "/srv/assay\r",
      HOST: " ",
      ASSAY_PYTHON: "/usr/bin/python3 ",
      ASSAY_RSCRIPT: "Rscript\u0000",
      ASSAY_S3_REGION: "\teu-west-1",
    });
  } catch (err) {
    error = err;
  }
  assert.ok(error instanceof ConfigError);
  assert.deepEqual(error.problems, [
    `HOST=" ": ${why}`,
    `ASSAY_DATA_DIR="/srv/assay\\r": ${why}`,
    `ASSAY_S3_REGION="\\teu-west-1": ${why}`,
    `ASSAY_PYTHON="/usr/bin/python3 ": ${why}`,
    `ASSAY_RSCRIPT="Rscript\\u0000": ${why}`,
  ]);
  // White space inside is a name's own; numbers are still trimmed; a URL's parser drops a trailing
  // line break itself (a secret mounted from a file), so DATABASE_URL keeps working with one.
  const c = loadConfig({
    ASSAY_DATA_DIR: "/srv/my assay 李",
    PORT: " 8080\r\n",
    DATABASE_URL: "postgres://u:p@db:5432/assay\n",
  });
  assert.equal(c.dataDir, "/srv/my assay 李");
  assert.equal(c.port, 8080);
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
    // (The worker wait as long: it must be at least the lease TTL.)
    assert.doesNotThrow(
      () => loadConfig({ ASSAY_WORKER_WAIT_MS: String(2 ** 31 - 1), [env]: String(2 ** 31 - 1) }),
      env,
    );
  }
  assert.throws(() => loadConfig({ ASSAY_RETENTION_DAYS: "1e300" }), ConfigError);
});

test("the configuration's schema checks agree with TypeBox's on every shape they build", async () => {
  const { Type: TB } = await import("typebox");
  const { Value } = await import("typebox/value");
  const { schemaError, Type } = await import("../../src/config-schema.ts");
  const pairs = [
    [Type.Integer({ minimum: 0, maximum: 65535 }), TB.Integer({ minimum: 0, maximum: 65535 })],
    [Type.Integer({ minimum: 1 }), TB.Integer({ minimum: 1 })],
    [
      Type.Number({ exclusiveMinimum: 0, maximum: 36_500 }),
      TB.Number({ exclusiveMinimum: 0, maximum: 36_500 }),
    ],
    [Type.String({ minLength: 3, maxLength: 63 }), TB.String({ minLength: 3, maxLength: 63 })],
    [Type.String({ pattern: "^https?://" }), TB.String({ pattern: "^https?://" })],
    [
      Type.Union([Type.Literal("json"), Type.Literal("pretty")]),
      TB.Union([TB.Literal("json"), TB.Literal("pretty")]),
    ],
  ] as const;
  const values = [
    -1,
    0,
    0.5,
    1,
    30,
    36_500,
    36_500.5,
    65535,
    65536,
    Number.NaN,
    Number.POSITIVE_INFINITY,
    "",
    "ab",
    "abc",
    "é".repeat(3),
    "x".repeat(63),
    "x".repeat(64),
    "http://h",
    "https://h",
    "ftp://h",
    "json",
    "pretty",
    "xml",
    "1",
    undefined,
    null,
    true,
  ];
  for (const [ours, theirs] of pairs) {
    for (const v of values) {
      const error = schemaError(ours, v);
      assert.equal(
        error === undefined,
        Value.Check(theirs, v),
        `${JSON.stringify(ours)} on ${String(v)}: ${error}`,
      );
      if (error !== undefined) assert.match(error, /^must /);
    }
  }
  assert.equal(schemaError(Type.Integer({ minimum: 1 }), 0), "must be >= 1");
  assert.equal(schemaError(Type.Integer({ maximum: 9 }), 10), "must be <= 9");
  assert.equal(schemaError(Type.Integer(), 1.5), "must be integer");
  assert.equal(schemaError(Type.Number({ exclusiveMinimum: 0 }), 0), "must be > 0");
  assert.equal(schemaError(Type.String({ minLength: 3 }), "ab"), "must not have fewer than 3 characters");
  assert.equal(schemaError(Type.String({ maxLength: 2 }), "abc"), "must not have more than 2 characters");
  assert.equal(schemaError(Type.String({ pattern: "^a" }), "b"), 'must match pattern "^a"');
});

test("the configuration does not load TypeBox (a worker's start-up would pay for it)", async () => {
  const { spawnSync } = await import("node:child_process");
  const out = spawnSync(
    process.execPath,
    [
      "--input-type=module",
      "-e",
      `import { registerHooks } from "node:module";
       const seen = [];
       registerHooks({ resolve(s, c, next) { const r = next(s, c); seen.push(r.url); return r; } });
       await import(${JSON.stringify(new URL("../../src/config.ts", import.meta.url).href)});
       console.log(JSON.stringify(seen));`,
    ],
    { encoding: "utf8" },
  );
  assert.equal(out.status, 0, out.stderr);
  const seen = JSON.parse(out.stdout) as string[];
  assert.ok(
    seen.some((u) => u.endsWith("/src/analyses/names.ts")),
    "the trace saw config.ts's imports",
  );
  assert.deepEqual(
    seen.filter((u) => u.includes("/node_modules/")),
    [],
  );
});

test("an ASSAY_S3_ENDPOINT the AWS SDK cannot parse is refused at start-up, naming it, its password hidden", () => {
  // The SDK parses the endpoint only on the first request: `assay api` and `assay worker` waited for
  // the store for ever, logging a bare "Invalid URL" that named no setting.
  const s3 = { ASSAY_STORAGE: "s3", ASSAY_S3_BUCKET: "assay-prod" };
  const rule = "is not a URL: check the host and the port (at most 65535), and percent-encode any space";
  for (const [endpoint, shown] of [
    ["http://minio.internal:90000", "http://minio.internal:90000"],
    ["https://", "https://"],
    ["http://minio internal:9000", "http://minio internal:9000"],
    ["https://assay:S3cr3tPw@[minio.ünï:9000", "https://assay:***@[minio.ünï:9000"],
  ] as const) {
    assert.throws(
      () => loadConfig({ ...s3, ASSAY_S3_ENDPOINT: endpoint }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.problems.length === 1 &&
        err.problems[0] === `ASSAY_S3_ENDPOINT=${JSON.stringify(shown)}: ${rule}`,
      endpoint,
    );
  }
  for (const endpoint of [
    "http://127.0.0.1:9000",
    "https://s3.eu-central-003.backblazeb2.com",
    "https://minio.ünï.example:65535/base/",
  ])
    assert.equal(loadConfig({ ...s3, ASSAY_S3_ENDPOINT: endpoint }).s3Endpoint, endpoint);
});

test("PGSSLMODE asking for TLS is refused when DATABASE_URL says nothing of it: PostgreSQL's client would connect without TLS", () => {
  // postgres.js reads sslmode from the URL only (and its own PGSSL), never libpq's PGSSLMODE.
  const url = "postgres://assay:S3cr3tPw@db-1000.internal:5432/assay_ünï";
  for (const [mode, databaseUrl] of [
    ["require", url],
    ["verify-ca", url],
    ["verify-full", "postgres://assay:S3cr3tPw@db1:5432,db2:5433/assay"],
  ] as const) {
    assert.throws(
      () => loadConfig({ DATABASE_URL: databaseUrl, PGSSLMODE: mode }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.problems.length === 1 &&
        err.problems[0] ===
          `PGSSLMODE=${JSON.stringify(mode)}: is not read by PostgreSQL's client here (postgres.js), which would connect to DATABASE_URL without TLS: put sslmode=${mode} in DATABASE_URL (…?sslmode=${mode}), or unset PGSSLMODE for a server without TLS` &&
        !err.message.includes("S3cr3tPw"),
      mode,
    );
  }
  // TLS asked for in the URL or by postgres.js's own PGSSL; a mode that does not insist; a socket;
  // the embedded database (no DATABASE_URL).
  for (const env of [
    { DATABASE_URL: `${url}?sslmode=verify-full`, PGSSLMODE: "require" },
    { DATABASE_URL: `${url}?ssl=true`, PGSSLMODE: "require" },
    // postgres.js verifies against the system's roots (verify-full) with this one.
    { DATABASE_URL: `${url}?sslrootcert=system`, PGSSLMODE: "require" },
    { DATABASE_URL: url, PGSSLMODE: "require", PGSSL: "require" },
    { DATABASE_URL: url, PGSSLMODE: "prefer" },
    { DATABASE_URL: url, PGSSLMODE: "disable" },
    { DATABASE_URL: "postgres://assay:pw@db1:5432,db2:5433/assay?sslmode=require", PGSSLMODE: "require" },
    { DATABASE_URL: "postgres:///assay", PGHOST: "/var/run/postgresql", PGSSLMODE: "require" },
    { DATABASE_URL: "postgres://assay@%2Fvar%2Frun%2Fpostgresql/assay", PGSSLMODE: "verify-full" },
    { PGSSLMODE: "require" },
  ])
    assert.doesNotThrow(() => loadConfig(env), JSON.stringify(env));
});

test("ASSAY_MAX_UPLOAD_BYTES: no more than a number holds exactly, nor, with S3, than one upload can hold (10,000 parts of 5 MiB)", () => {
  // 99999999999999999999 became 1e20, 9007199254740993 became …992, without a word.
  for (const bad of ["99999999999999999999", "9007199254740993"])
    assert.throws(
      () => loadConfig({ ASSAY_MAX_UPLOAD_BYTES: bad }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.problems[0] === `ASSAY_MAX_UPLOAD_BYTES="${bad}": must be <= 9007199254740991`,
    );
  assert.equal(loadConfig({ ASSAY_MAX_UPLOAD_BYTES: "1099511627776" }).maxUploadBytes, 2 ** 40);
  // lib-storage sends a body of unknown length in 5 MiB parts, and S3 takes at most 10,000: a larger
  // upload would fail (lib-storage: "Exceeded 10000 parts") once 48.8 GiB had been sent.
  const s3 = { ASSAY_STORAGE: "s3", ASSAY_S3_BUCKET: "assay-prod" };
  assert.equal(loadConfig({ ...s3, ASSAY_MAX_UPLOAD_BYTES: "52428800000" }).maxUploadBytes, 52_428_800_000);
  assert.throws(
    () => loadConfig({ ...s3, ASSAY_MAX_UPLOAD_BYTES: "52428800001" }),
    (err: unknown) =>
      err instanceof ConfigError &&
      err.problems.length === 1 &&
      /^ASSAY_MAX_UPLOAD_BYTES \(52428800001\) must be at most 52428800000 with ASSAY_STORAGE=s3/.test(
        err.problems[0] ?? "",
      ),
  );
});

test("a HOST with a port, a scheme or an IPv6 address in brackets is refused at start-up, naming HOST", () => {
  // Each passed, and `assay api` started its database, then failed with a bare
  // "getaddrinfo ENOTFOUND 0.0.0.0:8080" (exit 1) that named no setting.
  const rule =
    "must be an address or a host name, without a port (that is PORT), a scheme or a path; an IPv6 address without brackets (::, not [::])";
  for (const bad of [
    "0.0.0.0:8080",
    "http://0.0.0.0",
    "[::]",
    "[::1]:3000",
    "assay-api.internal/",
    "localhost:3000",
  ]) {
    assert.throws(
      () => loadConfig({ HOST: bad }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.problems.length === 1 &&
        err.problems[0] === `HOST=${JSON.stringify(bad)}: ${rule}`,
      bad,
    );
  }
  for (const good of [
    "::",
    "::1",
    "fe80::1%eth0",
    "0.0.0.0",
    "assay-api.internal",
    "xn--bcher-kva.example",
    "10",
  ])
    assert.equal(loadConfig({ HOST: good }).host, good);
});

test("an ASSAY_S3_PREFIX with a . or .. segment is refused: its keys landed outside the prefix, or in another bucket", () => {
  // With ASSAY_S3_PREFIX=.. the key ../files/1 was stored as files/1 (another installation's), and with
  // ../other-bucket in the bucket other-bucket: dot segments of the request's path are resolved.
  const s3 = { ASSAY_STORAGE: "s3", ASSAY_S3_BUCKET: "assay-prod" };
  const rule =
    "must not have a . or .. segment: the bucket's path resolves them, and keys would land outside the prefix or in another bucket";
  for (const bad of ["..", ".", "../assay-other", "assay/../", "./assay/", "assay/."]) {
    assert.throws(
      () => loadConfig({ ...s3, ASSAY_S3_PREFIX: bad }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.problems.length === 1 &&
        err.problems[0] === `ASSAY_S3_PREFIX=${JSON.stringify(bad)}: ${rule}`,
      bad,
    );
  }
  for (const good of ["assay/", "assay", "tenant-1000/assay.v2/", ".assay/", "assay..old/", "..."])
    assert.equal(loadConfig({ ...s3, ASSAY_S3_PREFIX: good }).s3Prefix, good);
});

test("configInEffect: each value in effect and where it came from; secrets masked or withheld", () => {
  const settings = configInEffect({
    DATABASE_URL: "postgres://bob:s3cr%40t@db.example:5432/assay?password=hunter2",
    ASSAY_S3_ENDPOINT: "https://key:topsecret@minio.internal:9000",
    PORT: " 8080 ",
    ASSAY_LEASE_TTL_MS: "900000",
  });
  const by = new Map(settings.map((s) => [s.variable, s]));
  assert.deepEqual(by.get("DATABASE_URL"), {
    variable: "DATABASE_URL",
    value: "postgres://bob:***@db.example:5432/assay?password=***",
    masked: true,
    from: "environment",
  });
  assert.equal(by.get("ASSAY_S3_ENDPOINT")?.value, "https://key:***@minio.internal:9000");
  assert.deepEqual(by.get("PORT"), { variable: "PORT", value: 8080, masked: false, from: "environment" });
  assert.deepEqual(by.get("HOST"), { variable: "HOST", value: "127.0.0.1", masked: false, from: "default" });
  assert.deepEqual(by.get("ASSAY_S3_BUCKET"), {
    variable: "ASSAY_S3_BUCKET",
    value: null,
    masked: false,
    from: "not set",
  });
  // Left unset, the worker wait is raised to a longer lease TTL: derived, not the default.
  assert.deepEqual(by.get("ASSAY_WORKER_WAIT_MS"), {
    variable: "ASSAY_WORKER_WAIT_MS",
    value: 900000,
    masked: false,
    from: "derived",
  });
  assert.equal(by.get("ASSAY_DATA_DIR")?.value, path.resolve(".assay"));
  assert.equal(settings.length, configTable().split("\n").length - 2, "one entry per setting of the table");
  const text = configInEffectText(settings);
  assert.doesNotMatch(text, /s3cr|hunter2|topsecret/);
  assert.match(text, /^ASSAY_S3_PREFIX +"" +default$/m);
  assert.match(text, /^ASSAY_S3_BUCKET +— +not set$/m);
});

test("configInEffect: a bad setting is the ConfigError the servers give", () => {
  assert.throws(
    () => configInEffect({ PORT: "x", LOG_LEVEL: "loud" }),
    (err: unknown) => {
      assert.ok(err instanceof ConfigError);
      assert.match(err.message, /PORT="x"/);
      assert.match(err.message, /LOG_LEVEL/);
      return true;
    },
  );
});

test("ASSAY_SSE_STALL_MS: raised to twice the heartbeat when unset, refused when set below it", () => {
  const raised = loadConfig({ ASSAY_SSE_HEARTBEAT_MS: "40000" });
  assert.equal(raised.sseStallMs, 80_000);
  const shown = configInEffect({ ASSAY_SSE_HEARTBEAT_MS: "40000" }).find(
    (s) => s.variable === "ASSAY_SSE_STALL_MS",
  );
  assert.deepEqual(shown, { variable: "ASSAY_SSE_STALL_MS", value: 80_000, masked: false, from: "derived" });
  assert.equal(loadConfig({}).sseStallMs, 60_000, "the defaults agree");
  assert.equal(loadConfig({ ASSAY_SSE_STALL_MS: "30000" }).sseStallMs, 30_000, "exactly twice is enough");
  assert.throws(
    () => loadConfig({ ASSAY_SSE_STALL_MS: "20000" }),
    (err: unknown) =>
      err instanceof ConfigError &&
      err.problems.some((p) =>
        p.startsWith("ASSAY_SSE_STALL_MS (20000) must be at least twice ASSAY_SSE_HEARTBEAT_MS (15000)"),
      ),
  );
});
