// What the browser tests share: Debian's chromium driven by playwright-core (never a downloaded
// browser), skipped only outside CI when it is missing, and a page's problems collected for the test
// to assert none.
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import fs from "node:fs";
import { after, before, beforeEach } from "node:test";
import { type Browser, type BrowserContext, chromium, type Page } from "playwright-core";
import { freePort } from "../../src/db/embedded.ts";
import { type CliResult, cleanEnv, collect, spawnCli, watch } from "./cli.ts";
import { waitFor } from "./queue.ts";
import { type RunnerEnv, runnerEnv } from "./runner.ts";

export const CHROMIUM = process.env.ASSAY_TEST_CHROMIUM ?? "/usr/bin/chromium";
/** In CI a missing browser is a failure, not a skip (.ci/run installs it). */
export const browserSkip: false | string =
  fs.existsSync(CHROMIUM) || process.env.CI === "true" ? false : `no chromium at ${CHROMIUM}`;

export function launchBrowser(): Promise<Browser> {
  return chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
}

/**
 * Records into `problems` what no page may do: throw, be refused by its Content Security Policy, or
 * open a dialog (which is dismissed).
 */
export function watchPage(page: Page, problems: string[]): void {
  page.on("pageerror", (err) => problems.push(`page error: ${err.message}`));
  page.on("console", (m) => {
    if (m.type() === "error" && /Content Security Policy|Refused to/.test(m.text())) problems.push(m.text());
  });
  page.on("dialog", (d) => {
    problems.push(`dialog: ${d.message()}`);
    void d.dismiss();
  });
}

/**
 * An `assay api --dev-token` process: it prints a sign-in link whose `#token=` is an admin token.
 * Returns the process, its exit (collected) and the link.
 */
export async function startDevApi(
  env: NodeJS.ProcessEnv,
): Promise<{ child: ChildProcess; done: Promise<CliResult>; link: string }> {
  const child = spawnCli(["api", "--dev-token"], env);
  const out = watch(child);
  const done = collect(child);
  const [, link] = await out.waitFor(/(http:\/\/\S+\/#token=\S+)/);
  return { child, done, link: link as string };
}

/** The admin token of a startDevApi link. */
/**
 * Once the API at `base` refuses revoked `token`. Its token cache drops a token when the revoke's
 * notification arrives: a page's next request must come after that, or it is served and nothing on the
 * page asks again.
 */
export async function tokenRefused(base: string, token: string): Promise<void> {
  await waitFor(
    async () =>
      (await fetch(`${base}/api/me`, { headers: { authorization: `Bearer ${token}` } })).status === 401,
    30_000,
    "the API to refuse the revoked token",
  );
}

export const linkToken = (link: string) => decodeURIComponent(link.split("#token=")[1] as string);

/** The environment of a dashboard test's `assay` processes: `env`'s database and data, on `port`, and `extra`. */
export const dashboardEnv = (env: RunnerEnv, port: number, extra: Record<string, string> = {}) =>
  cleanEnv({
    DATABASE_URL: env.db.url,
    ASSAY_DATA_DIR: env.dataDir,
    HOST: "127.0.0.1",
    PORT: String(port),
    LOG_LEVEL: "warn",
    ...extra,
  });

/** Uploads `content` as a CSV named `name` to the API at `base` with `token`: the stored file's record. */
export async function uploadFile(
  base: string,
  token: string,
  name: string,
  content: string,
): Promise<{ fileId: string; name: string }> {
  const form = new FormData();
  form.append("file", new Blob([content], { type: "text/csv" }), name);
  const res = await fetch(`${base}/api/files`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}` },
    body: form,
  });
  assert.equal(res.status, 201);
  return ((await res.json()) as { data: { fileId: string; name: string } }).data;
}

/** A summary task over `fileId`, created through the API as `token`'s user; its id. */
export async function summaryTask(base: string, token: string, fileId: string): Promise<string> {
  const res = await fetch(`${base}/api/analysis-tasks`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ analysisType: "summary", inputFileIds: [fileId] }),
  });
  assert.equal(res.status, 201);
  return ((await res.json()) as { data: { taskId: string } }).data.taskId;
}

/** What dashboardSuite() gives a browser test file once its `before` has run. */
export interface DashboardSuite {
  env: RunnerEnv;
  /** The API's origin, `http://127.0.0.1:<port>`. */
  base: string;
  /** The sign-in link the API printed first. */
  link: string;
  /** The admin token of that link. */
  adminToken: string;
  browser: Browser;
  /** With `{ worker: true }`: an `assay worker --concurrency 2` of the API's environment (a test may pause it). */
  worker?: ChildProcess;
  /** What the pages did wrong (watchPage): cleared before each test. */
  problems: string[];
  /** A page of a new browser context at `hash`, watched. */
  open(hash?: string, ctx?: BrowserContext): Promise<Page>;
  /** Fills the sign-in form with `token` and submits it. */
  signIn(page: Page, token: string): Promise<void>;
  /** open() at a sign-in link of `token`: the page once it shows the task list. */
  signedIn(token: string, ctx?: BrowserContext): Promise<Page>;
  /** Stops the API process (SIGTERM) and waits for its exit. */
  stopApi(): Promise<void>;
  /** Starts the API process again on the same port (after stopApi). */
  startApi(): Promise<void>;
}

/**
 * The usual setup of a dashboard test file: a runner environment, an `assay api --dev-token` on a free
 * port (and `extra` in its environment), with `o.worker` an `assay worker` beside it, a browser;
 * registered as the file's before/after hooks. Its fields are there once `before` has run. A file's
 * own set-up goes in `o.setup`, run at the end of that `before`: node:test starts a file's top-level
 * `before` hooks without waiting for the ones registered earlier.
 */
export function dashboardSuite(
  extra: Record<string, string> = {},
  o: { worker?: boolean; setup?: () => Promise<void> } = {},
): DashboardSuite {
  const s = { problems: [] as string[] } as DashboardSuite;
  const contexts: BrowserContext[] = [];
  let serverEnv: NodeJS.ProcessEnv;
  let api: { child: ChildProcess; done: Promise<unknown> } | undefined;
  let workerDone: Promise<unknown> | undefined;
  s.startApi = async () => {
    const started = await startDevApi(serverEnv);
    api = { child: started.child, done: started.done };
    s.link ??= started.link;
  };
  s.stopApi = async () => {
    if (!api) return;
    api.child.kill("SIGTERM");
    await api.done;
    api = undefined;
  };
  before(async () => {
    if (browserSkip) return;
    s.env = await runnerEnv();
    const port = await freePort();
    s.base = `http://127.0.0.1:${port}`;
    serverEnv = dashboardEnv(s.env, port, extra);
    await s.startApi();
    s.adminToken = linkToken(s.link);
    if (o.worker) {
      // No claims ahead of free slots: a type's runs learned short on small files (an earlier test's)
      // made it claim a later task's long runs all at once, and the cancel test found none queued.
      s.worker = spawnCli(["worker", "--concurrency", "2"], {
        ...serverEnv,
        LOG_LEVEL: "info",
        ASSAY_PREFETCH_WINDOW_MS: "0",
      });
      workerDone = collect(s.worker);
      await watch(s.worker).waitFor(/worker started/);
    }
    s.browser = await launchBrowser();
    await o.setup?.();
  });
  beforeEach(() => {
    s.problems.length = 0;
  });
  after(async () => {
    if (browserSkip) return;
    for (const ctx of contexts) await ctx.close().catch(() => {});
    await s.browser?.close();
    // A test that failed while the worker was paused must not leave it deaf to SIGTERM.
    s.worker?.kill("SIGCONT");
    s.worker?.kill("SIGTERM");
    await s.stopApi();
    await workerDone;
    await s.env?.close();
  });
  s.open = async (hash = "#/", given?: BrowserContext) => {
    const ctx = given ?? (await s.browser.newContext({ viewport: { width: 1280, height: 900 } }));
    if (!given) contexts.push(ctx);
    const page = await ctx.newPage();
    watchPage(page, s.problems);
    await page.goto(`${s.base}/${hash}`);
    return page;
  };
  s.signIn = async (page, token) => {
    await page.getByLabel("API token").fill(token);
    await page.getByRole("button", { name: "Sign in" }).click();
  };
  s.signedIn = async (token, ctx) => {
    const page = await s.open(`#token=${encodeURIComponent(token)}`, ctx);
    await page.getByRole("heading", { name: "Tasks" }).waitFor();
    return page;
  };
  return s;
}
