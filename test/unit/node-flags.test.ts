import assert from "node:assert/strict";
import { execFileSync, fork, spawnSync } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { SERVER_NODE_FLAGS, serverNodeFlags } from "../../bin/node-flags.js";

const bin = path.resolve(import.meta.dirname, "../../bin/assay.js");
const flagsModule = path.resolve(import.meta.dirname, "../../bin/node-flags.js");
const hasExecve = typeof (process as { execve?: unknown }).execve === "function";

/**
 * Runs execWithServerFlags for `assay api` in a fresh Node (`nodeArgs`, `env`) and prints the flags the
 * process ends up with (a re-executed `-e` script runs again, with them).
 */
function tryReexec(env: NodeJS.ProcessEnv, nodeArgs: string[] = []) {
  const script = `import { execWithServerFlags } from ${JSON.stringify(flagsModule)};
    execWithServerFlags([process.execPath, "no-such-script.js", "api"], process.env);
    console.log(process.execArgv.filter((f) => f.startsWith("--") && f !== "--input-type=module").join(" "));`;
  return spawnSync(process.execPath, [...nodeArgs, "--input-type=module", "-e", script], {
    env: { PATH: process.env.PATH, ...env },
    encoding: "utf8",
  });
}

test("ASSAY_NODE_FLAGS: unset → the defaults, 0 → none, else those flags; a word that is not a flag exits 2", () => {
  assert.deepEqual(serverNodeFlags({}), SERVER_NODE_FLAGS);
  assert.deepEqual(serverNodeFlags({ ASSAY_NODE_FLAGS: "0" }), []);
  assert.deepEqual(serverNodeFlags({ ASSAY_NODE_FLAGS: " --max-semi-space-size=4  --stack-size=2000 " }), [
    "--max-semi-space-size=4",
    "--stack-size=2000",
  ]);
  const bad = tryReexec({ ASSAY_NODE_FLAGS: "--stack-size 2000" });
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /ASSAY_NODE_FLAGS: "2000" is not a flag/);
  // `--` and `-` end Node's options: refused, never re-executed (with `--` that looped forever).
  for (const word of ["--", "-"]) {
    const ended = tryReexec({ ASSAY_NODE_FLAGS: `--stack-size=2000 ${word}` });
    assert.equal(ended.status, 2, word);
    assert.match(ended.stderr, /is not a flag/);
  }
});

test("a server command re-executes itself with the flags; a client command never does", {
  skip: !hasExecve && "this Node has no process.execve",
}, () => {
  // --version stands in for the flags: only a re-executed process prints Node's version.
  const env = { ...process.env, ASSAY_NODE_FLAGS: "--version" };
  const server = execFileSync(process.execPath, [bin, "api"], { env, encoding: "utf8" });
  assert.equal(server.trim(), process.version);
  const client = spawnSync(process.execPath, [bin, "--help"], { env, encoding: "utf8" });
  assert.notEqual(client.stdout.trim(), process.version);
  assert.match(client.stdout, /assay/i);
});

test("flags already given (any spelling, the --no- form, in NODE_OPTIONS) are not overridden", {
  skip: !hasExecve && "this Node has no process.execve",
}, () => {
  const given = tryReexec({}, ["--max_semi_space_size=4", "--no-optimize-for-size"]);
  assert.equal(given.stdout.trim(), "--max_semi_space_size=4 --no-optimize-for-size", given.stderr);
  const inOptions = tryReexec({ NODE_OPTIONS: "--max-semi-space-size=4" }, ["--optimize-for-size"]);
  assert.equal(inOptions.stdout.trim(), "--optimize-for-size", inOptions.stderr);
  // Without them the process re-executes with the defaults.
  const missing = tryReexec({});
  assert.equal(missing.stdout.trim(), SERVER_NODE_FLAGS.join(" "), missing.stderr);
});

test("a process with an IPC channel (a process manager's fork mode) is not re-executed", {
  skip: !hasExecve && "this Node has no process.execve",
  timeout: 30_000,
}, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-flags-"));
  const script = path.join(dir, "child.mjs");
  fs.writeFileSync(
    script,
    `import { execWithServerFlags } from ${JSON.stringify(flagsModule)};
     execWithServerFlags([process.execPath, "no-such-script.js", "api"], {});
     process.send("stayed", () => process.exit(0));`,
  );
  try {
    const child = fork(script, [], { env: { PATH: process.env.PATH } });
    const [message] = (await once(child, "message")) as [string];
    assert.equal(message, "stayed");
    await once(child, "exit");
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
