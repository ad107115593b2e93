// The test runner behind `make test`: one PostgreSQL for the whole run (DATABASE_URL when given,
// else an embedded cluster in a temporary directory), one migrated template database, one
// S3-compatible server (s3rver, from npm) on 127.0.0.1, then node:test over the given files,
// concurrently — each file clones its own database from the template (test/helpers/db.ts) and makes
// its own bucket when it needs one (test/helpers/s3.ts). Fails when zero tests ran.
//
//   npx tsx test/run.ts test/unit/config.test.ts ...
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import postgres from "postgres";
import { type EmbeddedPostgres, startEmbeddedPostgres } from "../src/db/embedded.ts";
import { runMigrations } from "../src/db/migrate.ts";

/** Longest a single test may take (the slowest, a browser or many-hosts test, takes well under a minute). */
const TEST_TIMEOUT_MS = 180_000;
/** Longest the whole run may take: `make test` takes about 10 minutes on 2 cores. */
const SUITE_DEADLINE_MS = 30 * 60_000;

/**
 * The slowest files (about 20 s or more each on 2 cores, slowest first; see the summary at the end of a
 * run), started before the others. node:test starts files in the order given, and a slow file started
 * late runs on alone at the end while the other slots stand idle: test/unit/zip.test.ts, last in
 * sorted order, held the run's last half minute. Kept by hand: only the files given run, and a given
 * file not named here keeps its place among the others.
 */
const SLOW_FILES = [
  "test/e2e/programs-locale.test.ts",
  "test/e2e/programs.test.ts",
  "test/e2e/embedded.test.ts",
  "test/e2e/bench-smoke.test.ts",
  "test/e2e/memory.test.ts",
  "test/e2e/client-retry.test.ts",
  "test/e2e/many-hosts.test.ts",
  "test/e2e/runner-processes.test.ts",
  "test/e2e/client-resume.test.ts",
  "test/e2e/db-connect-faults.test.ts",
  "test/e2e/downloads.test.ts",
  "test/integration/downloads-token-cutoff.test.ts",
  "test/e2e/dashboard-results-refresh.test.ts",
  "test/e2e/dashboard-fixes.test.ts",
  "test/e2e/outage.test.ts",
  "test/e2e/dashboard.test.ts",
  "test/integration/metrics-queue-read.test.ts",
  "test/e2e/dashboard-navigation.test.ts",
  "test/e2e/programs-hostile.test.ts",
  "test/e2e/queue-processes.test.ts",
  "test/unit/zip.test.ts",
  "test/integration/upload-faults.test.ts",
  "test/integration/worker-faults.test.ts",
];

const given = process.argv.slice(2);
if (given.length === 0) {
  console.error("test/run.ts: no test files given");
  process.exit(2);
}
const slowRank = (file: string) => {
  const i = SLOW_FILES.indexOf(path.relative(path.resolve(import.meta.dirname, ".."), path.resolve(file)));
  return i === -1 ? SLOW_FILES.length : i;
};
/** The given files, the slow ones first; the others keep their order (a stable sort). */
const files = [...given].sort((a, b) => slowRank(a) - slowRank(b));

const withDatabase = (url: string, name: string) => {
  const u = new URL(url);
  u.pathname = `/${name}`;
  return u.toString();
};

// Interrupted (Ctrl-C, SIGTERM): the tests get the signal and the cleanup at the end runs. Before they
// start, the start-up goes on to its end first: ended by the signal there, this process left the
// embedded PostgreSQL running (it runs detached, out of the terminal's reach) on its cluster.
let interrupted: NodeJS.Signals | undefined;
let testRun: ChildProcess | undefined;
for (const signal of ["SIGINT", "SIGTERM"] as const)
  process.on(signal, () => {
    interrupted = signal;
    testRun?.kill(signal);
  });

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "assay-test-"));
let embedded: EmbeddedPostgres | undefined;
let s3: { endpoint: string; stop(): void } | undefined;
let admin: postgres.Sql | undefined;
const runId = randomBytes(4).toString("hex");
const template = `assay_tpl_${runId}`;

/**
 * Each table's ids start a few below a different power of ten, so that every test crosses a digit
 * boundary early (ids compared or sorted as text go wrong there) and an id of one kind is never a
 * valid id of another (a route that looks a run up by a task id fails instead of passing by luck).
 * A database numbered from 1 hid events sorted as text for months.
 */
const FIRST_IDS: Record<string, bigint> = {
  users: 97n,
  api_tokens: 9_995n,
  files: 999_997n,
  tasks: 99_999_995n,
  runs: 9_999_999_990n,
  task_events: 999_999_999_995n,
};

async function numberAcrossDigitBoundaries(url: string): Promise<void> {
  const db = postgres(url, { max: 1, onnotice: () => {} });
  try {
    for (const [table, first] of Object.entries(FIRST_IDS)) {
      await db`select setval(pg_get_serial_sequence(${table}, 'id'), ${(first - 1n).toString()})`;
    }
  } finally {
    await db.end({ timeout: 5 });
  }
}

/** The test S3 server in a process of its own (see test/fixtures/s3-server.mjs). */
async function startS3Server(directory: string): Promise<{ endpoint: string; stop(): void }> {
  const child = spawn(
    process.execPath,
    ["--openssl-legacy-provider", path.join(import.meta.dirname, "fixtures/s3-server.mjs"), directory],
    { stdio: ["pipe", "pipe", "inherit"] },
  );
  const port = await new Promise<string>((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      const m = /listening (\d+)/.exec(out);
      if (m?.[1]) resolve(m[1]);
    });
    child.once("exit", (code) => reject(new Error(`the S3 test server exited (${code})`)));
  });
  return { endpoint: `http://127.0.0.1:${port}`, stop: () => child.kill("SIGTERM") };
}

/** The ten slowest files of the run (wall time of each file's process), to show where the time goes. */
function printSlowestFiles(timesFile: string): void {
  if (!fs.existsSync(timesFile)) return;
  const times = fs
    .readFileSync(timesFile, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((line) => {
      const [ms, file] = line.split("\t");
      return { seconds: Number(ms) / 1000, file: path.relative(process.cwd(), file ?? "") };
    })
    .sort((a, b) => b.seconds - a.seconds);
  if (times.length === 0) return;
  console.log("\nSlowest test files (seconds, each file's process start to exit):");
  for (const { seconds, file } of times.slice(0, 10))
    console.log(`${seconds.toFixed(1).padStart(7)}  ${file}`);
}

let exitCode = 1;
try {
  embedded = process.env.DATABASE_URL
    ? undefined
    : await startEmbeddedPostgres({
        dataDir: path.join(scratch, "pg"),
        persistent: false,
        // Throwaway data: durability settings off to keep the suite fast.
        settings: { fsync: "off", synchronous_commit: "off", full_page_writes: "off", max_connections: 400 },
      });
  const adminUrl = process.env.DATABASE_URL ?? (embedded?.adminUrl as string);
  // Any S3-compatible server would do; s3rver checks signatures against its own fixed key pair.
  s3 = await startS3Server(path.join(scratch, "s3"));
  admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  await admin`create database ${admin(template)}`;
  await runMigrations(withDatabase(adminUrl, template));
  await numberAcrossDigitBoundaries(withDatabase(adminUrl, template));

  const tapFile = path.join(scratch, "results.tap");
  const timesFile = path.join(scratch, "file-times.tsv");
  // One file more than cores: most files spend much of their time waiting (on processes, timeouts, the
  // database), and with one per core two cores stood idle a third of the run (`vmstat`). On 2 cores,
  // 2 files at a time took 684–756 s, 3 took 609 s (2026-12-06). ASSAY_TEST_CONCURRENCY overrides it.
  const concurrency =
    Number(process.env.ASSAY_TEST_CONCURRENCY) || Math.max(2, os.availableParallelism() + 1);
  if (interrupted) throw new Error(`test/run.ts: ${interrupted} before the tests started`);
  const child = spawn(
    process.execPath,
    [
      "--import",
      "tsx",
      "--test",
      `--test-concurrency=${concurrency}`,
      // A test that hangs fails by name instead of holding CI until its deadline; a file whose tests
      // have all ended exits even when a failed test left a worker or a server running.
      `--test-timeout=${TEST_TIMEOUT_MS}`,
      "--test-force-exit",
      "--test-reporter=spec",
      "--test-reporter-destination=stdout",
      "--test-reporter=tap",
      `--test-reporter-destination=${tapFile}`,
      `--test-reporter=${path.join(import.meta.dirname, "helpers/file-times-reporter.mjs")}`,
      `--test-reporter-destination=${timesFile}`,
      ...files,
    ],
    {
      stdio: "inherit",
      env: {
        ...process.env,
        ASSAY_TEST_ADMIN_URL: adminUrl,
        ASSAY_TEST_TEMPLATE: template,
        ASSAY_TEST_RUN: runId,
        ASSAY_TEST_S3_ENDPOINT: s3.endpoint,
        AWS_ACCESS_KEY_ID: "S3RVER",
        AWS_SECRET_ACCESS_KEY: "S3RVER",
        AWS_REGION: "us-east-1",
        // The SDK warns on every start under Node 20; the tests know.
        AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: "true",
      },
    },
  );
  testRun = child;
  // The whole run has a deadline too: past it the runner is interrupted, which makes node:test list
  // the files still running, and the run fails.
  let overran = false;
  const watchdog = setTimeout(() => {
    overran = true;
    console.error(`test/run.ts: the suite ran past ${SUITE_DEADLINE_MS / 60_000} minutes; stopping it`);
    child.kill("SIGINT");
    setTimeout(() => child.kill("SIGKILL"), 30_000).unref();
  }, SUITE_DEADLINE_MS);
  const code = await new Promise<number>((resolve) => child.on("close", (c) => resolve(c ?? 1)));
  clearTimeout(watchdog);
  const tap = fs.existsSync(tapFile) ? fs.readFileSync(tapFile, "utf8") : "";
  const count = (name: string) => Number(new RegExp(`^# ${name} (\\d+)$`, "m").exec(tap)?.[1] ?? 0);
  const [tests, pass, fail, cancelled, skipped] = [
    count("tests"),
    count("pass"),
    count("fail"),
    count("cancelled"),
    count("skipped"),
  ];
  printSlowestFiles(timesFile);
  // Every file's time, for a closer look at where the run's time goes.
  if (process.env.ASSAY_TEST_TIMES_FILE && fs.existsSync(timesFile))
    fs.copyFileSync(timesFile, process.env.ASSAY_TEST_TIMES_FILE);
  console.log(`\n${pass} passed, ${fail} failed, ${cancelled} cancelled, ${skipped} skipped`);
  if (tests === 0) console.error("test/run.ts: zero tests ran — that is a failure, not a pass");
  exitCode = !overran && code === 0 && tests > 0 && fail === 0 && cancelled === 0 ? 0 : 1;
} finally {
  if (admin) {
    // Databases a crashed test file could not drop, then the template.
    const leftovers = await admin<{ datname: string }[]>`
      select datname from pg_database where datname like ${`assay_t_${runId}_%`} or datname = ${template}`;
    for (const { datname } of leftovers) {
      await admin`drop database if exists ${admin(datname)} with (force)`.catch(() => {});
    }
    await admin.end({ timeout: 5 });
  }
  s3?.stop();
  await embedded?.stop();
  fs.rmSync(scratch, { recursive: true, force: true });
}
process.exit(exitCode);
