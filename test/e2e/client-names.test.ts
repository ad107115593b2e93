// Hostile local file names against a real server: the name an upload is stored under is the one the
// client predicts (one rule, src/files/file-name.ts), so a re-submit reuses the copy of that name;
// and a name's escape sequences never reach a terminal through the client's messages.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { serverName } from "../../src/client/inputs.ts";
import { ASSAY_BIN, collect } from "../helpers/cli.ts";
import {
  type ClientServer,
  client,
  csv,
  jsonLines,
  ofKind,
  startClientServer,
  within,
} from "../helpers/client.ts";

/**
 * script(1) of util-linux, which runs a command on a pseudo-terminal. Without it (or with the BSD
 * script, which has no -c) the terminal test is skipped: spawning a missing command would end
 * this file with an unhandled 'error' event. In CI a missing script is a failure, not a skip.
 */
const haveScript = /util-linux/.test(spawnSync("script", ["--version"], { encoding: "utf8" }).stdout ?? "");
const noScript = haveScript || process.env.CI === "true" ? false : "no script(1) of util-linux on PATH";

/** `assay <args>` on a terminal: script(1) gives the command one, so it prints for people. */
async function onTerminal(args: string[]) {
  const command = [process.execPath, ASSAY_BIN, ...args]
    .map((a) => `'${a.replace(/'/g, `'\\''`)}'`)
    .join(" ");
  const child = spawn("script", ["-q", "-e", "-c", command, "/dev/null"], {
    env: server.env(token, { TERM: "xterm-256color", LANG: "C.UTF-8" }),
    stdio: ["ignore", "pipe", "pipe"],
  });
  return within(collect(child), 30_000, `assay ${args[0]} in a terminal`);
}

let server: ClientServer;
let token: string;
let work: string;

before(async () => {
  server = await startClientServer({ concurrency: 1, env: { ASSAY_MAX_UPLOAD_BYTES: "100000" } });
  token = await server.token("frank");
  work = fs.mkdtempSync(path.join(os.tmpdir(), "assay-client-names-"));
});

after(async () => {
  await server.close();
  fs.rmSync(work, { recursive: true, force: true });
});

// biome-ignore lint/suspicious/noControlCharactersInRegex: looking for control characters is the point
const RAW_CONTROL = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/;

/** A C1 control (U+009B, CSI) and U+0085 in a name, which the server drops. */
const C1_NAME = 'a\u009b2J\u0085 "quoted" 😀.csv';
/** Within 255 bytes on disk; past 255 characters once its quotes travel as %22, stored as quotes. */
const LONG_NAME = `${'"'.repeat(80)}${"x".repeat(14)}😀.csv`;
/** Backslashes, two together and one before a quote, in a name (Linux allows them). */
const BACKSLASH_NAME = 'back\\\\slash \\"q".csv';

test("uploads are stored under the names the client predicts, and a re-submit reuses the copy of its name", async () => {
  const dir = path.join(work, "hostile");
  fs.mkdirSync(dir);
  const bytes = csv(50, 3);
  fs.writeFileSync(path.join(dir, C1_NAME), bytes);
  fs.writeFileSync(path.join(dir, LONG_NAME), csv(50, 4));
  // Backslashes are a name's on Linux; the multipart header escapes them (until 2026-12-07 `a\\b`
  // arrived as `a\b`, and the name was cut at a backslash).
  fs.writeFileSync(path.join(dir, BACKSLASH_NAME), csv(50, 5));
  const first = await client(["submit", "--type", "summary", dir], server.env(token));
  assert.equal(first.code, 0, first.stderr);
  assert.ok(!RAW_CONTROL.test(first.stdout), "JSON lines carry no raw control character");
  const files = ofKind(jsonLines(first.stdout), "file") as unknown as {
    path: string;
    name: string;
    fileId: string;
  }[];
  assert.equal(files.length, 3);
  for (const f of files) assert.equal(f.name, serverName(f.path), `stored name of ${JSON.stringify(f.path)}`);
  const c1Copy = files.find((f) => f.path === C1_NAME)?.fileId;
  assert.equal(files.find((f) => f.path === LONG_NAME)?.name, LONG_NAME);
  assert.equal(files.find((f) => f.path === BACKSLASH_NAME)?.name, BACKSLASH_NAME);

  // The same bytes under other names: not the first copy (its runs would carry its name, and
  // results.csv label plain-a.csv's results with C1_NAME): each is uploaded under its own name...
  const other = path.join(work, "other");
  fs.mkdirSync(other);
  fs.writeFileSync(path.join(other, "plain-a.csv"), bytes);
  fs.writeFileSync(path.join(other, "plain-b.csv"), bytes);
  const second = await client(
    ["submit", "--type", "summary", other, "--out", path.join(work, "other-out")],
    server.env(token),
  );
  assert.equal(second.code, 0, second.stderr);
  const secondFiles = ofKind(jsonLines(second.stdout), "file") as unknown as {
    name: string;
    fileId: string;
    uploaded: boolean;
  }[];
  assert.deepEqual(
    secondFiles.map((f) => [f.name, f.uploaded]).sort(),
    [
      ["plain-a.csv", true],
      ["plain-b.csv", true],
    ],
    second.stdout,
  );
  assert.ok(secondFiles.every((f) => f.fileId !== c1Copy));
  const results = fs.readFileSync(path.join(work, "other-out", "results.csv"), "utf8");
  assert.match(results, /,plain-a\.csv,/);
  assert.match(results, /,plain-b\.csv,/);
  assert.doesNotMatch(results, /quoted/);
  // ...and reused under it the next time.
  const third = await client(["submit", "--type", "summary", other], server.env(token));
  assert.equal(third.code, 0, third.stderr);
  assert.deepEqual(
    (ofKind(jsonLines(third.stdout), "file") as unknown as { fileId: string; uploaded: boolean }[])
      .map((f) => [f.fileId, f.uploaded])
      .sort(),
    secondFiles.map((f) => [f.fileId, false]).sort(),
  );

  // The hostile file again: of the two copies with its bytes, the one stored under its name.
  const again = await client(["submit", "--type", "summary", path.join(dir, C1_NAME)], server.env(token));
  assert.equal(again.code, 0, again.stderr);
  const [reused] = ofKind(jsonLines(again.stdout), "file") as unknown as {
    uploaded: boolean;
    fileId: string;
  }[];
  assert.equal(reused?.uploaded, false);
  assert.equal(reused?.fileId, c1Copy, "the copy stored under the file's own name");
});

test("a file name's escape sequences never reach the terminal through an error message", async () => {
  const dir = path.join(work, "evil");
  fs.mkdirSync(dir);
  // Refused by the server (over ASSAY_MAX_UPLOAD_BYTES): the error names the local file.
  const name = "evil \u001b[2J\u001b]0;pwned\u0007 \u009b31m.csv";
  fs.writeFileSync(path.join(dir, name), csv(20_000, 5));
  // stdout is a pipe (JSON lines); stderr gets the message for people, where a terminal usually is.
  const r = await client(["submit", "--type", "summary", dir], server.env(token));
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /evil ⟨U\+001B⟩\[2J⟨U\+001B⟩\]0;pwned⟨U\+0007⟩ ⟨U\+009B⟩31m\.csv/);
  assert.ok(!RAW_CONTROL.test(r.stderr), `stderr: ${JSON.stringify(r.stderr)}`);
  assert.ok(!RAW_CONTROL.test(r.stdout.replace(/\n/g, "")), `stdout: ${JSON.stringify(r.stdout)}`);
  const [error] = ofKind(jsonLines(r.stdout), "error") as unknown as { message: string }[];
  assert.ok(error?.message.includes(name), "the JSON line keeps the name exactly, escaped");
});

test("assay status on a terminal shows a task's parameters without raw C1 controls", {
  skip: noScript,
}, async () => {
  assert.ok(haveScript, "script(1) of util-linux is needed on PATH");
  const dir = path.join(work, "params");
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, "p.csv"), csv(10, 2));
  // A list parameter with U+009B (CSI) in an item: JSON.stringify leaves C1 controls as they are.
  const submitted = await client(
    ["submit", "--type", "python-stats", "--param", "method=mean", "--param", "columns=a\u009b2Jb", dir],
    server.env(token),
  );
  assert.equal(submitted.code, 0, submitted.stderr);
  const taskId = (ofKind(jsonLines(submitted.stdout), "task")[0] as unknown as { taskId: string }).taskId;
  // On a terminal (script(1) gives the command one), status prints for people.
  const r = await onTerminal(["status", taskId]);
  assert.equal(r.code, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /parameters \{.*"columns":\["a\\u009b2Jb"\]/, r.stdout);
  assert.ok(!r.stdout.includes("\u009b"), "no raw CSI on the terminal");
});

test("on a terminal, names and a title with invisible or bidi characters show them as code points", {
  skip: noScript,
}, async () => {
  assert.ok(haveScript, "script(1) of util-linux is needed on PATH");
  const dir = path.join(work, "look-alike");
  fs.mkdirSync(dir);
  // "a\u200bb.csv" read "ab.csv", another file's name; the long name's end is what tells it apart.
  fs.writeFileSync(path.join(dir, "a\u200bb.csv"), csv(13, 2));
  fs.writeFileSync(path.join(dir, "ab.csv"), csv(14, 2));
  const long = `report-${"x".repeat(60)}.csv.exe`;
  fs.writeFileSync(path.join(dir, long), csv(15, 2));
  const title = "Q1 \u202efdp.exe\u200b";
  const submitted = await client(
    ["submit", "--type", "r-report", "--param", `title=${title}`, dir],
    server.env(token),
  );
  assert.equal(submitted.code, 0, submitted.stderr);
  const taskId = (ofKind(jsonLines(submitted.stdout), "task")[0] as unknown as { taskId: string }).taskId;

  const files = await onTerminal(["files", "--limit", "3"]);
  assert.equal(files.code, 0, files.stdout + files.stderr);
  const names = files.stdout.split(/\r?\n/).map((l) => l.split(/ {2,}/).at(-1));
  assert.ok(names.includes("a⟨U+200B⟩b.csv"), files.stdout);
  assert.ok(names.includes("ab.csv"), files.stdout);
  assert.ok(!/[\u200b\u202e]/.test(files.stdout), "no invisible or bidi character on the terminal");

  const status = await onTerminal(["status", taskId]);
  assert.equal(status.code, 0, status.stdout + status.stderr);
  assert.ok(status.stdout.includes('parameters {"title":"Q1 \\u202efdp.exe\\u200b"}'), status.stdout);
  assert.match(status.stdout, / a⟨U\+200B⟩b\.csv\s/);
  assert.match(status.stdout, / report-x+…x+\.csv\.exe\s/, "a long name's end stays in view");
  assert.ok(!/[\u200b\u202e]/.test(status.stdout), "no invisible or bidi character on the terminal");
});
