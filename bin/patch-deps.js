#!/usr/bin/env node
// Patches to installed dependencies, applied after every install (npm's `postinstall`; make reinstalls
// when this file changes). Each is an exact text replacement in a pinned version: a version or text
// that does not match fails the install loudly, so an upgrade is a decision, not a silent loss of a
// fix. Applying twice changes nothing. `src/db/client.ts` refuses to start on an unpatched postgres.js
// (an install with --ignore-scripts), and the bundle carries the patched code (the build runs after).
//
//   node bin/patch-deps.js          apply (what postinstall runs)
//   node bin/patch-deps.js --check  exit 1 unless every patch is applied
//
// postgres.js 3.4.9, a transaction whose connection closes under it (porsager/postgres#1208, #1186;
// the unmerged fixes #1209, #1215): a failover, `pg_terminate_backend`, a restart or a reset can close
// a pool connection while `sql.begin` runs, and then
//   - the transaction's own ROLLBACK (or any later statement of its scope) was written to the nulled
//     socket from a setImmediate: an uncaught TypeError ended the process;
//   - a write still pending at the close (its timer cleared, not forgotten) kept every later write of
//     that connection from being scheduled: each reconnect ended in CONNECT_TIMEOUT, for good;
//   - the query the close failed stayed the connection's current one, and the old backend's FATAL
//     stayed its pending error: the next connection's start-up answered a dead query, and the next
//     statement failed with the old backend's 57P01;
//   - statements of the dead transaction issued after the close ran on the pool's reconnected
//     connection, outside any transaction (committed on their own), and ones waiting in the
//     transaction's queue never settled.
// The patches: a close forgets its pending write, fails and forgets every query in flight whatever
// the close's cause, and clears the pending error; a write with no socket fails its queries instead
// of throwing; a transaction whose connection closed fails every statement it issues from then on
// (its ROLLBACK included) and the ones it had queued, without sending them.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

const CONNECTION = [
  {
    // A write with no socket (a statement sent on a connection that has closed) fails its queries.
    find: `  function nextWrite(fn) {
    const x = socket.write(chunk, fn)`,
    replace: `  function nextWrite(fn) {
    if (!socket) // assay patch: fail the queries, do not throw from a setImmediate
      return closedWrite(fn)
    const x = socket.write(chunk, fn)`,
  },
  {
    find: `  function connectTimedOut() {`,
    replace: `  // assay patch: a write after the close fails what was sent with it (true: "not full", so that a
  // pool does not move the closed connection out of its queue of closed ones for this)
  function closedWrite(fn) {
    nextWriteTimer !== null && clearImmediate(nextWriteTimer)
    chunk = nextWriteTimer = null
    const err = Errors.connection('CONNECTION_CLOSED', options)
    query && (queryError(query, err), query = null)
    while (sent.length)
      queryError(sent.shift(), err)
    fn && fn(err)
    return true
  }

  function connectTimedOut() {`,
  },
  {
    // A connection's error (a reset's 'error', a turn before its 'close') leaves no query current: one
    // left so kept sql.end() waiting for good for a connection that was going (porsager/postgres#1142).
    find: `    errored(err)
    while (sent.length)
      queryError(sent.shift(), err)
  }

  function errored(err) {`,
    replace: `    errored(err)
    query = null // assay patch
    while (sent.length)
      queryError(sent.shift(), err)
  }

  function errored(err) {`,
  },
  {
    // A close forgets the write it had pending (a cleared timer left non-null kept every later write
    // of this connection from being scheduled) and the error it was waiting to report.
    find: `    clearImmediate(nextWriteTimer)
    socket.removeListener('data', data)`,
    replace: `    clearImmediate(nextWriteTimer)
    chunk = nextWriteTimer = null // assay patch
    socket.removeListener('data', data)`,
  },
  {
    // Closed during the start-up: its own query (the array types' read) fails with the error the
    // backend sent, if any, and is forgotten — it stayed current, and the next start-up's
    // ReadyForQuery answered it (with the old backend's error, or with nothing) — while the start-up
    // is tried again.
    find: `    if (initial)
      return reconnect()
`,
    replace: `    rows = 0 // assay patch: a result cut short is not the next statement's
    result = new Result()
    results = null
    if (initial) { // assay patch
      const err = errorResponse || Errors.connection('CONNECTION_CLOSED', options)
      query && queryError(query, err)
      while (sent.length)
        queryError(sent.shift(), err)
      query = errorResponse = null
      return reconnect()
    }
`,
  },
  {
    // Every query in flight fails, whatever the close's cause (a reset's 'error' came earlier, and
    // statements issued in between were never answered), and none stays the connection's current one.
    // Not through error(): with a URL of several hosts it does nothing while the connection is still
    // in the pool's connecting queue (until its first statement's ReadyForQuery).
    find: `    !hadError && (query || sent.length) && error(Errors.connection('CONNECTION_CLOSED', options, socket))`,
    replace: `    if (query || sent.length) { // assay patch
      const err = Errors.connection('CONNECTION_CLOSED', options, socket)
      errored(err)
      while (sent.length)
        queryError(sent.shift(), err)
    }
    query = errorResponse = null
    ended && (ended(), ending = ended = null) // an end waiting for this connection's work is done`,
  },
];

const INDEX = (exportLine, mark) => [
  {
    find: `${exportLine}

function Postgres(a, b) {`,
    replace: `${exportLine}
Postgres.assayPatch = '${mark}'

function Postgres(a, b) {`,
  },
  {
    // The transaction learns that its connection closed.
    find: `        new Promise((_, reject) => connection.onclose = reject)`,
    replace: `        new Promise((_, reject) => connection.onclose = e => { // assay patch
          gone = e
          while (queries.length)
            queries.shift().reject(gone)
          reject(e)
        })`,
  },
  {
    find: `    let savepoints = 0
      , connection
      , prepare = null`,
    replace: `    let savepoints = 0
      , connection
      , prepare = null
      , gone = null // assay patch: the close that ended this transaction`,
  },
  {
    // A statement after the close fails at once: it must not run on the reconnected connection.
    find: `      function handler(q) {
        q.catch(e => uncaughtError || (uncaughtError = e))
        c.queue === full`,
    replace: `      function handler(q) {
        q.catch(e => uncaughtError || (uncaughtError = e))
        if (gone) // assay patch
          return q.reject(gone)
        c.queue === full`,
  },
];

/**
 * What postgres.js's default export carries once patched: a hash of the patches, so that a
 * node_modules (or a bundle) patched by another version of this file is told apart. Checked by
 * src/db/client.ts, which imports it from here.
 */
export const POSTGRES_PATCH = `assay-${crypto
  .createHash("sha256")
  .update(JSON.stringify([CONNECTION, INDEX("", "")]))
  .digest("hex")
  .slice(0, 16)}`;

export const PATCHES = [
  {
    name: "postgres",
    version: "3.4.9",
    files: {
      "src/connection.js": CONNECTION,
      "cjs/src/connection.js": CONNECTION,
      "src/index.js": INDEX("export default Postgres", POSTGRES_PATCH),
      "cjs/src/index.js": INDEX("module.exports = Postgres", POSTGRES_PATCH),
    },
  },
];

/** Every patched place says so (and an original that says it is not one). */
const MARK = "assay patch";

/** Writes `file` whole or not at all. */
function writeWhole(file, text) {
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, text);
  fs.renameSync(tmp, file);
}

/**
 * Applies (or with `check`, only checks) every patch under `root`'s node_modules. Returns what it did
 * per file; throws naming the package, file and text when a version or text does not match.
 * @param {{ root?: string, check?: boolean }} [options]
 * @returns {string[]}
 */
export function patchDeps({ root = ROOT, check = false } = {}) {
  const report = [];
  for (const patch of PATCHES) {
    const dir = path.join(root, "node_modules", patch.name);
    const { version } = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8"));
    if (version !== patch.version) {
      throw new Error(
        `${patch.name} ${version} is installed; bin/patch-deps.js patches ${patch.version}: ` +
          "check whether the new version still needs each patch, then update the file",
      );
    }
    for (const [file, edits] of Object.entries(patch.files)) {
      const full = path.join(dir, file);
      // Patched from the original, kept beside the file: a changed patch replaces the old one.
      const original = `${full}.orig`;
      const current = fs.readFileSync(full, "utf8");
      const kept = fs.existsSync(original);
      const source = kept ? fs.readFileSync(original, "utf8") : current;
      if (!kept && source.includes(MARK)) {
        throw new Error(`${patch.name}/${file} was patched and its original is gone: reinstall (npm ci)`);
      }
      let text = source;
      for (const { find, replace } of edits) {
        const at = text.indexOf(find);
        if (at < 0 || text.indexOf(find, at + 1) >= 0) {
          throw new Error(
            `${patch.name}/${file}: the text to patch is ${at < 0 ? "not there" : "there twice"}:\n${find}`,
          );
        }
        text = text.slice(0, at) + replace + text.slice(at + find.length);
      }
      if (text === current) {
        report.push(`${patch.name}/${file}: patched`);
        continue;
      }
      if (check) throw new Error(`${patch.name}/${file} is not patched: run \`node bin/patch-deps.js\``);
      if (!kept) writeWhole(original, source);
      writeWhole(full, text);
      report.push(`${patch.name}/${file}: patch applied`);
    }
  }
  return report;
}

/** Whether this file is the script node was started with (not imported: src/db/client.ts reads the mark). */
function runAsScript() {
  try {
    return (
      process.argv[1] !== undefined && fs.realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)
    );
  } catch {
    // argv[1] is no file (`node -e`, a script on standard input, a worker thread's eval): imported.
    return false;
  }
}

if (runAsScript()) {
  try {
    const report = patchDeps({ check: process.argv.includes("--check") });
    if (!process.argv.includes("--quiet")) for (const line of report) console.log(`patch-deps: ${line}`);
  } catch (e) {
    console.error(`patch-deps: ${e instanceof Error ? e.message : e}`);
    process.exit(1);
  }
}
