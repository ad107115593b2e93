import assert from "node:assert/strict";
import { execFileSync, fork, spawnSync } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { API_NODE_FLAGS, serverNodeFlags, WORKER_NODE_FLAGS } from "../../bin/node-flags.js";

const bin = path.resolve(import.meta.dirname, "../../bin/assay.js");
const flagsModule = path.resolve(import.meta.dirname, "../../bin/node-flags.js");
const hasExecve = typeof (process as { execve?: unknown }).execve === "function";

/**
 * Runs execWithServerFlags for `assay <command>` in a fresh Node (`nodeArgs`, `env`) and prints the
 * flags the process ends up with (a re-executed `-e` script runs again, with them).
 */
function tryReexec(env: NodeJS.ProcessEnv, nodeArgs: string[] = [], command = "api") {
  const script = `import { execWithServerFlags } from ${JSON.stringify(flagsModule)};
    execWithServerFlags([process.execPath, "no-such-script.js", ${JSON.stringify(command)}], process.env);
    console.log(process.execArgv.filter((f) => f.startsWith("--") && f !== "--input-type=module").join(" "));`;
  return spawnSync(process.execPath, [...nodeArgs, "--input-type=module", "-e", script], {
    env: { PATH: process.env.PATH, ...env },
    encoding: "utf8",
  });
}

test("ASSAY_NODE_FLAGS: unset → the defaults, 0 → none, else those flags; a word that is not a flag exits 2", () => {
  assert.deepEqual(serverNodeFlags({}, "worker"), WORKER_NODE_FLAGS);
  assert.deepEqual(serverNodeFlags({}, "api"), API_NODE_FLAGS);
  assert.deepEqual(serverNodeFlags({}, "all"), API_NODE_FLAGS);
  // The API's keep the young generation they set: --optimize-for-size holds it at ~1 MiB.
  assert.ok(!API_NODE_FLAGS.includes("--optimize-for-size"));
  assert.deepEqual(serverNodeFlags({ ASSAY_NODE_FLAGS: "0" }, "worker"), []);
  assert.deepEqual(serverNodeFlags({ ASSAY_NODE_FLAGS: "0" }, "api"), []);
  assert.throws(() => serverNodeFlags({}, "migrate" as "api"), /not a server command: migrate/);
  assert.deepEqual(
    serverNodeFlags({ ASSAY_NODE_FLAGS: " --max-semi-space-size=4  --stack-size=2000 " }, "all"),
    ["--max-semi-space-size=4", "--stack-size=2000"],
  );
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
  const given = tryReexec({}, ["--max_semi_space_size=4", "--no-optimize-for-size"], "worker");
  assert.equal(given.stdout.trim(), "--max_semi_space_size=4 --no-optimize-for-size", given.stderr);
  const inOptions = tryReexec({ NODE_OPTIONS: "--max-semi-space-size=4" }, ["--optimize-for-size"], "worker");
  assert.equal(inOptions.stdout.trim(), "--optimize-for-size", inOptions.stderr);
  // Only what is missing is added: the API's given semi-space stays, its heap growth is added.
  const api = tryReexec({}, ["--max-semi-space-size=4"]);
  assert.equal(api.stdout.trim(), "--heap-growing-percent=20 --max-semi-space-size=4", api.stderr);
  // Without them the process re-executes with the defaults: each command its own.
  const missing = tryReexec({});
  assert.equal(missing.stdout.trim(), API_NODE_FLAGS.join(" "), missing.stderr);
  const worker = tryReexec({}, [], "worker");
  assert.equal(worker.stdout.trim(), WORKER_NODE_FLAGS.join(" "), worker.stderr);
  const all = tryReexec({}, [], "all");
  assert.equal(all.stdout.trim(), API_NODE_FLAGS.join(" "), all.stderr);
  // ASSAY_NODE_FLAGS is every server command's.
  const chosen = tryReexec({ ASSAY_NODE_FLAGS: "--stack-size=2000" }, [], "worker");
  assert.equal(chosen.stdout.trim(), "--stack-size=2000", chosen.stderr);
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
