// `assay submit --out DIR` whose download fails or is interrupted after the task ran names what
// fetches the outputs again. Submit lays the runs' folders out by the inputs' labels (`sous
// dossier/mesure.csv/`), `assay download` by the input files' names (`mesure.csv/`): for inputs from
// a folder tree, `assay download <id> --out DIR` into the same DIR wrote a second, flattened tree
// beside the partial one. That command is named as fetching the outputs "again" only when the two
// layouts agree; else the message says what it does and to give it another DIR. And a clash that
// shows only once the outputs are there is exit 2 PATH_CONFLICT after the task ran, as --help says.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { after, before, test } from "node:test";
import { collect, spawnCli } from "../helpers/cli.ts";
import {
  type ClientServer,
  client,
  csv,
  jsonLines,
  type Line,
  ofKind,
  startClientServer,
  within,
} from "../helpers/client.ts";
import { idsCrossPowerOfTen, waitFor } from "../helpers/queue.ts";
import { scratchDir } from "../helpers/tmp.ts";

let server: ClientServer;
let token: string;
let work: string;

before(async () => {
  server = await startClientServer({ concurrency: 2 });
  token = await server.token("ingrid «arbre» ✓");
  work = scratchDir("assay-client-submit-refetch-");
  await idsCrossPowerOfTen(server.db.sql, "tasks", 0);
  await idsCrossPowerOfTen(server.db.sql, "runs", 1);
  await idsCrossPowerOfTen(server.db.sql, "files", 1);
});

after(async () => {
  await server?.close();
});

/**
 * The API behind a proxy whose answer to each output file's GET is `outputs`: a 500 (not asked again),
 * or none at all (held open). `outputAsked` counts those GETs.
 */
async function outputsProxy(outputs: "fail" | "hold") {
  const backend = new URL(server.url);
  let asked = 0;
  const proxy = http.createServer((req, res) => {
    if (req.method === "GET" && /\/outputs\/[^/?]+$/.test(req.url ?? "")) {
      asked++;
      if (outputs === "hold") return;
      res.writeHead(500, { "content-type": "application/json" });
      res.end('{"code":"INTERNAL","message":"Internal server error."}');
      return;
    }
    const up = http.request(
      { host: backend.hostname, port: backend.port, method: req.method, path: req.url, headers: req.headers },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`,
    outputAsked: () => asked,
    close: () => {
      proxy.closeAllConnections();
      proxy.close();
    },
  };
}

/** A folder of inputs: `nested` puts one inside a sub-folder (its run's folder is `sous dossier/…`). */
function inputs(name: string, nested: boolean): string {
  const dir = path.join(work, name);
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
  const out = path.join(work, "sortie d'arbre");
  try {
    const r = await client(
      ["submit", "--type", "summary", tree, "--out", out],
      server.env(token, { ASSAY_URL: proxy.url }),
    );
    assert.equal(r.code, 3, r.stderr);
    const taskId = taskIdOf(r.stdout);
    const err = ofKind(jsonLines(r.stdout), "error")[0] as
      | (Line & { code: string; message: string })
      | undefined;
    assert.equal(err?.code, "INTERNAL", r.stdout);
    assert.ok(err?.message.includes(`; ${otherLayout(taskId, out)}`), `the error says so: ${err?.message}`);
    assert.ok(r.stderr.includes(otherLayout(taskId, out)), r.stderr);
    assert.doesNotMatch(r.stderr, /fetches the outputs again/);
    // What it says the command does, it does: folders by file name, the sub-folder gone.
    const elsewhere = path.join(work, "ailleurs");
    const fetched = await client(["download", taskId, "--out", elsewhere], server.env(token));
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
    const out = path.join(work, nested ? "sortie interrompue" : "sortie à plat");
    try {
      const child = spawnCli(
        ["submit", "--type", "summary", tree, "--out", out],
        server.env(token, { ASSAY_URL: proxy.url }),
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
  const dir = path.join(work, "relevés tardifs");
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, "relevé «3».csv"), csv(20, 23));
  // A folder where the run's output file goes: the run's folder is fine, its output's name unknown
  // until the run has made it.
  const out = path.join(work, "sortie tardive");
  fs.mkdirSync(path.join(out, "relevé «3».csv", "summary.json"), { recursive: true });
  const r = await client(["submit", "--type", "summary", dir, "--out", out], server.env(token));
  assert.equal(r.code, 2, r.stderr);
  const err = ofKind(jsonLines(r.stdout), "error")[0] as (Line & { code: string }) | undefined;
  assert.equal(err?.code, "PATH_CONFLICT", r.stdout);
  assert.equal(ofKind(jsonLines(r.stdout), "file").length, 1, "the input was uploaded");
  assert.equal(ofKind(jsonLines(r.stdout), "task").length, 1, "the task was created and ran");
  const help = await client(["submit", "--help"], server.env(token));
  const exit2 = /; 2 (.*?); 3 /.exec(help.stdout.replace(/\s+/g, " "))?.[1];
  assert.equal(
    exit2,
    "bad arguments or parameters (nothing uploaded), or something in the way of --out's download " +
      "(nothing uploaded when the inputs' paths show it; else found as the outputs are downloaded, " +
      "after the task ran)",
  );
});
