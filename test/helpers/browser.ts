// What the browser tests share: Debian's chromium driven by playwright-core (never a downloaded
// browser), skipped only outside CI when it is missing, and a page's problems collected for the test
// to assert none.
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import fs from "node:fs";
import { type Browser, chromium, type Page } from "playwright-core";
import { type CliResult, cleanEnv, collect, spawnCli, watch } from "./cli.ts";
import type { RunnerEnv } from "./runner.ts";

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
