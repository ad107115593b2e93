// `assay submit --out DIR` whose download fails or is interrupted after the task ran names what
// fetches the outputs again. Submit lays the runs' folders out by the inputs' labels (`sous
// dossier/mesure.csv/`), `assay download` by the input files' names (`mesure.csv/`): for inputs from
// a folder tree, `assay download <id> --out DIR` into the same DIR wrote a second, flattened tree
// beside the partial one. That command is named as fetching the outputs "again" only when the two
// layouts agree; else the message says what it does and to give it another DIR. And a clash that
// shows only once the outputs are there is exit 2 PATH_CONFLICT after the task ran, as --help says.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { collect, spawnCli } from "../helpers/cli.ts";
import { apiProxy, client, clientSuite, csv, errorOf, jsonLines, ofKind, within } from "../helpers/client.ts";
import { waitFor } from "../helpers/queue.ts";

const suite = clientSuite({
  user: "ingrid «arbre» ✓",
  scratch: "assay-client-submit-refetch-",
  ids: { tasks: 0, runs: 1, files: 1 },
});

/**
 * The API behind a proxy whose answer to each output file's GET is `outputs`: a 500 (not asked again),
 * or none at all (held open). `outputAsked` counts those GETs.
 */
async function outputsProxy(outputs: "fail" | "hold") {
  let asked = 0;
  const proxy = await apiProxy(suite.server.url, (req, res) => {
    if (req.method !== "GET" || !/\/outputs\/[^/?]+$/.test(req.url ?? "")) return false;
    asked++;
    if (outputs === "hold") return true;
    res.writeHead(500, { "content-type": "application/json" });
    res.end('{"code":"INTERNAL","message":"Internal server error."}');
    return true;
  });
  return { ...proxy, outputAsked: () => asked };
}

/** A folder of inputs: `nested` puts one inside a sub-folder (its run's folder is `sous dossier/…`). */
function inputs(name: string, nested: boolean): string {
  const dir = path.join(suite.work, name);
  fs.mkdirSync(path.join(dir, "sous dossier"), { recursive: true });
  fs.writeFileSync(path.join(dir, "racine «1».csv"), csv(20, 17));
  fs.writeFileSync(path.join(dir, nested ? "sous dossier" : "", "mesure ✓.csv"), csv(20, 19));
  return dir;
}

const quoted = (p: string) => `'${p.replace(/'/g, "'\\''")}'`;
const taskIdOf = (stdout: string) => String(ofKind(jsonLines(stdout), "task")[0]?.taskId);
/** What is said of `assay download` when it lays the outputs out other than submit. */
const otherLayout = (taskId: string, out: string) =>
  `assay download ${taskId} --out DIR fetches the outputs laid out by input file name, not by folder as in ${quoted(out)}: give it a DIR other than that`;

test("a failed download of a folder tree's outputs does not name assay download into the same --out as fetching them again", async () => {
  const tree = inputs("arbre d'entrées", true);
  const proxy = await outputsProxy("fail");
  const out = path.join(suite.work, "sortie d'arbre");
  try {
    const r = await client(
      ["submit", "--type", "summary", tree, "--out", out],
      suite.env({ ASSAY_URL: proxy.url }),
    );
    assert.equal(r.code, 3, r.stderr);
    const taskId = taskIdOf(r.stdout);
    const err = errorOf(r.stdout);
    assert.equal(err?.code, "INTERNAL", r.stdout);
    assert.ok(err?.message.includes(`; ${otherLayout(taskId, out)}`), `the error says so: ${err?.message}`);
    assert.ok(r.stderr.includes(otherLayout(taskId, out)), r.stderr);
    assert.doesNotMatch(r.stderr, /fetches the outputs again/);
    // What it says the command does, it does: folders by file name, the sub-folder gone.
    const elsewhere = path.join(suite.work, "ailleurs");
    const fetched = await client(["download", taskId, "--out", elsewhere], suite.env());
    assert.equal(fetched.code, 0, fetched.stderr);
    assert.ok(fs.statSync(path.join(elsewhere, "mesure ✓.csv", "summary.json")).isFile());
    assert.ok(!fs.existsSync(path.join(elsewhere, "sous dossier")));
  } finally {
    proxy.close();
  }
});

test("Ctrl-C while submit --out downloads: assay download into the same --out is named only when it lays the outputs out alike", async () => {
  for (const nested of [true, false]) {
    const tree = inputs(nested ? "arbre interrompu" : "à plat interrompu", nested);
    const proxy = await outputsProxy("hold");
    const out = path.join(suite.work, nested ? "sortie interrompue" : "sortie à plat");
    try {
      const child = spawnCli(
        ["submit", "--type", "summary", tree, "--out", out],
        suite.env({ ASSAY_URL: proxy.url }),
      );
      const done = collect(child);
      await waitFor(async () => proxy.outputAsked() > 0, 60_000, "the download of an output");
      child.kill("SIGINT");
      const r = await within(done, 10_000, "assay submit after Ctrl-C");
      assert.equal(r.code, 130, r.stderr);
      const taskId = taskIdOf(r.stdout);
      const said = ofKind(jsonLines(r.stdout), "interrupted")[0]?.message;
      const expected = nested
        ? `download interrupted; ${otherLayout(taskId, out)}`
        : `download interrupted; assay download ${taskId} --out ${quoted(out)} fetches it again`;
      assert.equal(said, expected, `nested: ${nested}`);
      assert.ok(r.stderr.includes(expected), r.stderr);
    } finally {
      proxy.close();
    }
  }
});

test("a clash that shows only as the outputs are downloaded is exit 2 PATH_CONFLICT after the task ran, as --help says", async () => {
  const dir = path.join(suite.work, "relevés tardifs");
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, "relevé «3».csv"), csv(20, 23));
  // A folder where the run's output file goes: the run's folder is fine, its output's name unknown
  // until the run has made it.
  const out = path.join(suite.work, "sortie tardive");
  fs.mkdirSync(path.join(out, "relevé «3».csv", "summary.json"), { recursive: true });
  const r = await client(["submit", "--type", "summary", dir, "--out", out], suite.env());
  assert.equal(r.code, 2, r.stderr);
  const err = errorOf(r.stdout);
  assert.equal(err?.code, "PATH_CONFLICT", r.stdout);
  assert.equal(ofKind(jsonLines(r.stdout), "file").length, 1, "the input was uploaded");
  assert.equal(ofKind(jsonLines(r.stdout), "task").length, 1, "the task was created and ran");
  const help = await client(["submit", "--help"], suite.env());
  const exit2 = /; 2 (.*?); 3 /.exec(help.stdout.replace(/\s+/g, " "))?.[1];
  assert.equal(
    exit2,
    "bad arguments or parameters (nothing uploaded), or something in the way of --out's download " +
      "(nothing uploaded when the inputs' paths show it; else found as the outputs are downloaded, " +
      "after the task ran)",
  );
});
