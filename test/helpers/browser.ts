// What the browser tests share: Debian's chromium driven by playwright-core (never a downloaded
// browser), skipped only outside CI when it is missing, and a page's problems collected for the test
// to assert none.
import type { ChildProcess } from "node:child_process";
import fs from "node:fs";
import { type Browser, chromium, type Page } from "playwright-core";
import { type CliResult, collect, spawnCli, watch } from "./cli.ts";

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
