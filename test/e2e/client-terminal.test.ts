// The client in a real terminal: `assay submit --follow` inside tmux, the screen read with
// capture-pane while it runs. The bars must move (uploads, then runs done and per-run progress) and
// the session must end with the summary line.
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { ASSAY_BIN, cleanEnv, ROOT } from "../helpers/cli.ts";
import { type ClientServer, csv, startClientServer } from "../helpers/client.ts";
import { waitFor } from "../helpers/queue.ts";

const TMUX = process.env.ASSAY_TEST_TMUX ?? "/usr/bin/tmux";
const haveTmux = fs.existsSync(TMUX);
// In CI a missing tmux is a failure, not a skip (.ci/run installs it).
const skip = haveTmux || process.env.CI === "true" ? false : `no tmux at ${TMUX}`;
const SOCKET = `assay-test-${process.pid}`;

let server: ClientServer;
let work: string;

before(async () => {
  if (skip) return;
  // Uploads over 5 MB are refused: the hostile-name test's upload fails, naming its file.
  server = await startClientServer({
    concurrency: 2,
    env: { ASSAY_MAX_UPLOAD_BYTES: String(5 * 1024 * 1024) },
  });
  work = fs.mkdtempSync(path.join(os.tmpdir(), "assay-client-tty-"));
});

after(async () => {
  if (skip) return;
  spawnSync(TMUX, ["-L", SOCKET, "kill-server"]);
  await server.close();
  fs.rmSync(work, { recursive: true, force: true });
});

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/**
 * Runs `assay <args>` in a tmux session of `columns` × 40 (after `before`, a line printed on the
 * screen first) and reads the screen until the command has exited: every distinct frame, the last
 * one ending with "ASSAY-EXIT=<code>".
 */
async function inTmux(session: string, args: string[], env: NodeJS.ProcessEnv, columns = 130, before = "") {
  const command = [process.execPath, ASSAY_BIN, ...args].map(quote).join(" ");
  execFileSync(
    TMUX,
    [
      "-L",
      SOCKET,
      "-f",
      "/dev/null",
      "new-session",
      "-d",
      "-s",
      session,
      "-x",
      String(columns),
      "-y",
      "40",
      `${before ? `echo ${quote(before)}; ` : ""}${command}; echo ASSAY-EXIT=$?; sleep 600`,
    ],
    { env },
  );
  const frames: string[] = [];
  const capture = () =>
    execFileSync(TMUX, ["-L", SOCKET, "capture-pane", "-p", "-t", session], { env }).toString();
  await waitFor(
    async () => {
      const screen = capture();
      if (frames.at(-1) !== screen) frames.push(screen);
      await new Promise((r) => setTimeout(r, 50));
      return screen.includes("ASSAY-EXIT=");
    },
    120_000,
    `the client to finish in tmux session ${session}`,
  );
  return frames;
}

test("a terminal session shows the bars moving and ends with the summary line", { skip }, async () => {
  const token = await server.token("erin");
  const dir = path.join(work, "inputs");
  fs.mkdirSync(dir);
  for (let i = 0; i < 20; i++) fs.writeFileSync(path.join(dir, `série ${i}.csv`), csv(40_000, i + 2));
  const env = cleanEnv({
    ASSAY_URL: server.url,
    ASSAY_TOKEN: token,
    LANG: "C.UTF-8",
    TERM: "xterm-256color",
  });
  const frames = await inTmux(
    "client",
    ["submit", "--type", "python-stats", "--param", "method=median", dir, "--follow"],
    env,
  );
  const final = frames.at(-1) as string;
  assert.match(final, /ASSAY-EXIT=0/);
  const lines = final
    .split("\n")
    .map((l) => l.trimEnd())
    .filter(Boolean);
  const exitAt = lines.findIndex((l) => l.startsWith("ASSAY-EXIT="));
  assert.match(
    lines[exitAt - 1] ?? "",
    /^Task \d+ succeeded: 20 succeeded, 0 failed, 0 timed out, 0 cancelled of 20 runs in [\d.]+ s$/,
    final,
  );
  assert.match(final, /^Uploading \[█+\] 100% \| .* \| 20\/20 files$/m);

  // The overall bar moved through several counts below 20, and run lines showed their progress.
  const counts = new Set<number>();
  let runLines = 0;
  for (const frame of frames) {
    for (const m of frame.matchAll(
      /^Task \d+ (?:queued|running) \[[█░]+\] (\d+)\/20 runs \| \d+ succeeded/gm,
    )) {
      counts.add(Number(m[1]));
    }
    if (/^ {2}série \d+\.csv +\[[█░]+\] +\d+% /m.test(frame)) runLines++;
  }
  assert.ok([...counts].filter((n) => n < 20).length >= 2, `the overall bar moved: ${[...counts]}`);
  assert.ok(runLines >= 2, "frames show running runs with their progress");
  for (const frame of frames) assert.ok(!frame.includes(token), "the token is never on screen");
});

test("hostile names on a terminal: the screen is never cleared, and a failed run's line keeps its run and error in view", {
  skip,
}, async () => {
  const token = await server.token("gina");
  const env = cleanEnv({
    ASSAY_URL: server.url,
    ASSAY_TOKEN: token,
    LANG: "C.UTF-8",
    TERM: "xterm-256color",
  });

  // A local file whose name would clear the screen, refused by the server: the error names it.
  const evil = path.join(work, "evil");
  fs.mkdirSync(evil);
  fs.writeFileSync(path.join(evil, "evil \u001b[2J\u001b[H name.csv"), csv(300_000, 3));
  const refused = await inTmux("evil", ["submit", "--type", "summary", evil], env, 130, "MARKER-BEFORE");
  const last = refused.at(-1) as string;
  assert.match(last, /ASSAY-EXIT=2/);
  assert.match(last, /MARKER-BEFORE/, `the screen was cleared:\n${last}`);
  assert.match(last, /^assay: evil ⟨U\+001B⟩\[2J⟨U\+001B⟩\[H name\.csv: /m, last);

  // A run that fails with a long name: the line printed above the bars as it fails is cut to fit
  // (cli-progress turns line wrapping off while it draws, so the terminal would cut it at its edge,
  // run id and error code with it).
  const dir = path.join(work, "long");
  fs.mkdirSync(dir);
  const fixtures = path.join(ROOT, "test/fixtures/csv");
  const longName = `empty ${"very long name ".repeat(10)}end.csv`;
  fs.copyFileSync(path.join(fixtures, "empty.csv"), path.join(dir, longName));
  fs.copyFileSync(path.join(fixtures, "normal.csv"), path.join(dir, "漢字のデータ.csv"));
  const frames = await inTmux("long", ["submit", "--type", "summary", dir, "--follow"], env, 100);
  const final = frames.at(-1) as string;
  assert.match(final, /ASSAY-EXIT=1/);
  assert.match(
    final,
    /^failed {5}empty very long name .*….* end\.csv \(run \d+\): ANALYSIS_DATA_INVALID$/m,
    final,
  );
});

test("download on a terminal draws its runs done and names the runs that did not succeed, as follow does", {
  skip,
}, async () => {
  const token = await server.token("hana");
  const env = cleanEnv({
    ASSAY_URL: server.url,
    ASSAY_TOKEN: token,
    LANG: "C.UTF-8",
    TERM: "xterm-256color",
  });
  const dir = path.join(work, "partly");
  fs.mkdirSync(dir);
  const fixtures = path.join(ROOT, "test/fixtures/csv");
  fs.copyFileSync(path.join(fixtures, "empty.csv"), path.join(dir, "empty.csv"));
  fs.copyFileSync(path.join(fixtures, "normal.csv"), path.join(dir, "normal.csv"));
  const submitted = spawnSync(process.execPath, [ASSAY_BIN, "submit", "--type", "summary", dir, "--follow"], {
    env,
  });
  const taskId = /"kind":"task","taskId":"(\d+)"/.exec(submitted.stdout.toString())?.[1];
  assert.ok(taskId, submitted.stderr.toString());
  // The token as an argument: tmux's sessions take the environment of its server, the first test's.
  const frames = await inTmux(
    "download",
    ["download", taskId, "--out", path.join(work, "partly-out"), "--token", token],
    env,
    200,
  );
  const final = frames.at(-1) as string;
  assert.match(final, /ASSAY-EXIT=1/, final);
  assert.ok(
    frames.some((f) => /^Downloading \[[█░]+\] 1\/1 runs \| \d+ files, /m.test(f)),
    frames.join("\n----\n"),
  );
  assert.match(final, /^Downloaded \d+ files of 1 runs to .*; Task \d+ partially_succeeded/m, final);
  assert.match(final, /^ {2}failed {5}empty\.csv \(run \d+\): ANALYSIS_DATA_INVALID/m, final);
});
