// `assay submit --out DIR` (the real client, a child process, against a real `assay all`): what its
// download will need of DIR is checked before anything is uploaded or a task created — a run's folder
// follows from its input's label, so an input file where that folder goes, a link to nothing, an
// --out that is a file or a folder named results.csv is exit 2 PATH_CONFLICT with nothing uploaded
// and no task; and a download that fails after the task ran names the `assay download` that fetches
// the outputs again.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { ASSAY_BIN, collect } from "../helpers/cli.ts";
import { apiAll, apiProxy, client, clientSuite, csv, errorOf, jsonLines, ofKind } from "../helpers/client.ts";

const suite = clientSuite({
  user: "søren «sortie» ✓",
  scratch: "assay-client-submit-out-",
  ids: { tasks: 0, runs: 1, files: 1 },
});

/** How many files and tasks the user has on the server. */
const holdings = async () => ({
  files: (await apiAll(suite.server, suite.token, "/api/files")).length,
  tasks: (await apiAll(suite.server, suite.token, "/api/analysis-tasks")).length,
});

test("submit --out refuses a download folder that clashes before uploading anything or creating a task", async () => {
  // The inputs' own folder as --out: the run of `relevé 1.csv` wants a folder where the input is.
  const here = path.join(suite.work, "données");
  fs.mkdirSync(here);
  const a = path.join(here, "relevé 1.csv");
  const b = path.join(here, "日本語 2.csv");
  fs.writeFileSync(a, csv(20, 3));
  fs.writeFileSync(b, csv(20, 5));
  // A tree: its runs' folders mirror it, `sub/` included.
  const tree = path.join(suite.work, "arbre");
  fs.mkdirSync(path.join(tree, "sous dossier"), { recursive: true });
  fs.writeFileSync(path.join(tree, "sous dossier", "mesure ✓.csv"), csv(20, 7));
  const held = await holdings();

  const refused = async (args: string[], message: RegExp) => {
    const r = await client(["submit", "--type", "summary", ...args], suite.env());
    assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
    const err = errorOf(r.stdout);
    assert.equal(err?.code, "PATH_CONFLICT", r.stdout);
    assert.equal(err?.exitCode, 2);
    assert.match(err?.message ?? "", message);
    assert.match(r.stderr, /; move it, or download into another --out DIR/);
    assert.deepEqual(ofKind(jsonLines(r.stdout), "file"), [], "nothing hashed into a file line");
    assert.deepEqual(ofKind(jsonLines(r.stdout), "task"), [], "no task");
    assert.deepEqual(await holdings(), held, "nothing uploaded, no task created");
  };

  const before = fs.readFileSync(a);
  await refused(
    [a, b, "--out", here],
    /^cannot make the folder for the outputs of relevé 1\.csv: .*données\/relevé 1\.csv is a file, not a folder/,
  );
  assert.deepEqual(fs.readFileSync(a), before, "the input is untouched");
  assert.deepEqual(fs.readdirSync(here).sort(), ["relevé 1.csv", "日本語 2.csv"], "nothing made");

  // A file where a folder of the input tree goes.
  const flat = path.join(suite.work, "à plat");
  fs.mkdirSync(flat);
  fs.writeFileSync(path.join(flat, "sous dossier"), "mine\n");
  await refused([tree, "--out", flat], /à plat\/sous dossier is a file, not a folder/);
  assert.equal(fs.readFileSync(path.join(flat, "sous dossier"), "utf8"), "mine\n");

  // A link to nothing where a run's folder goes: nothing made where it points.
  const linked = path.join(suite.work, "lien");
  fs.mkdirSync(linked);
  fs.symlinkSync(path.join(suite.work, "nulle part"), path.join(linked, "日本語 2.csv"));
  await refused([b, "--out", linked], /lien\/日本語 2\.csv is a link to nothing, not a folder/);
  assert.equal(fs.existsSync(path.join(suite.work, "nulle part")), false);

  // --out a file, or below one.
  const file = path.join(suite.work, "un fichier.txt");
  fs.writeFileSync(file, "mine\n");
  await refused([b, "--out", file], /^cannot make the folder for the download: .*un fichier\.txt is a file/);
  await refused([b, "--out", path.join(file, "dessous")], /un fichier\.txt is a file, not a folder/);
  assert.equal(fs.readFileSync(file, "utf8"), "mine\n");

  // A folder where results.csv goes.
  const table = path.join(suite.work, "tableau");
  fs.mkdirSync(path.join(table, "results.csv"), { recursive: true });
  await refused(
    [b, "--out", table],
    /cannot write results\.csv: .*tableau\/results\.csv is a folder, not a file/,
  );

  // Out of the way, the same submit downloads everything; once more into the same --out (folders
  // of its own there now, a results.csv file) is no clash either.
  const clean = path.join(suite.work, "propre");
  for (let i = 0; i < 2; i++) {
    const ok = await client(["submit", "--type", "summary", a, b, tree, "--out", clean], suite.env());
    assert.equal(ok.code, 0, ok.stderr);
    assert.ok(fs.statSync(path.join(clean, "relevé 1.csv", "summary.json")).isFile());
    assert.ok(
      fs.statSync(path.join(clean, "arbre", "sous dossier", "mesure ✓.csv", "summary.json")).isFile(),
    );
    assert.ok(fs.statSync(path.join(clean, "results.csv")).isFile());
  }
});

test("a download that fails for good after the task ran names the assay download that fetches the outputs again", async () => {
  const dir = path.join(suite.work, "relevés");
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, "relevé «1».csv"), csv(20, 11));
  fs.writeFileSync(path.join(dir, "relevé «2».csv"), csv(20, 13));
  // An output answered 500 by the API (not asked again): the download fails once the task has run.
  const proxy = await apiProxy(suite.server.url, (req, res) => {
    if (req.method !== "GET" || !/\/outputs\/[^/?]+$/.test(req.url ?? "")) return false;
    res.writeHead(500, { "content-type": "application/json" });
    res.end('{"code":"INTERNAL","message":"Internal server error."}');
    return true;
  });
  // A folder a shell would take apart: the command must be one that can be pasted.
  const out = path.join(suite.work, "sortie d'essai");
  try {
    const r = await client(
      ["submit", "--type", "summary", dir, "--out", out],
      suite.env({ ASSAY_URL: proxy.url }),
    );
    assert.equal(r.code, 3, r.stderr);
    const taskId = String(ofKind(jsonLines(r.stdout), "task")[0]?.taskId);
    const again = `assay download ${taskId} --out '${out.replace(/'/g, "'\\''")}'`;
    const err = errorOf(r.stdout);
    assert.equal(err?.code, "INTERNAL", r.stdout);
    assert.ok(
      err?.message.includes(`; ${again} fetches the outputs again`),
      `the error names the command: ${err?.message}`,
    );
    assert.ok(r.stderr.includes(again), r.stderr);

    // The command, as named, fetches them, run by a shell as a user pastes it.
    const shell = spawn(
      "sh",
      ["-c", `"$0" "$1" ${again.slice("assay ".length)}`, process.execPath, ASSAY_BIN],
      {
        env: suite.env(),
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    const ok = await collect(shell);
    assert.equal(ok.code, 0, ok.stderr);
    for (const n of [1, 2])
      assert.ok(fs.statSync(path.join(out, `relevé «${n}».csv`, "summary.json")).isFile());
  } finally {
    proxy.close();
  }
});

test("submit of a folder with --out inside it does not take the last submit's outputs for inputs", async () => {
  const data = path.join(suite.work, "mesures «été»");
  fs.mkdirSync(data);
  fs.writeFileSync(path.join(data, "relevé 1.csv"), csv(20, 17));
  fs.writeFileSync(path.join(data, "日本語 2.csv"), csv(20, 19));
  const out = path.join(data, "résultats");
  for (let i = 0; i < 2; i++) {
    const r = await client(["submit", "--type", "summary", data, "--out", out], suite.env());
    assert.equal(r.code, 0, r.stderr);
    const lines = jsonLines(r.stdout);
    assert.deepEqual(
      ofKind(lines, "file")
        .map((f) => String(f.path))
        .sort(),
      ["relevé 1.csv", "日本語 2.csv"],
      `submit ${i + 1}: the inputs, not what is in --out`,
    );
    assert.equal(ofKind(lines, "task")[0]?.runs, 2);
    assert.ok(fs.statSync(path.join(out, "日本語 2.csv", "summary.json")).isFile());
  }
  // Named by itself beside the folder it is in, a file inside --out is an input all the same (once).
  const named = path.join(out, "results.csv");
  const r = await client(["submit", "--type", "summary", data, named, "--out", out], suite.env());
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(
    ofKind(jsonLines(r.stdout), "file")
      .map((f) => String(f.path))
      .sort(),
    // Found twice (walked and named), it is one input, labelled as the walk found it.
    ["mesures «été»/relevé 1.csv", "mesures «été»/résultats/results.csv", "mesures «été»/日本語 2.csv"],
  );
  // --out the folder itself: its files are where their folders would go.
  const same = await client(["submit", "--type", "summary", data, "--out", data], suite.env());
  assert.equal(same.code, 2, same.stderr);
  assert.equal(errorOf(same.stdout)?.code, "PATH_CONFLICT");
});

test("an empty --out (a variable not set) is exit 2 USAGE for submit and download, not the current folder", async () => {
  const input = path.join(suite.work, "vide «1».csv");
  fs.writeFileSync(input, csv(5, 23));
  const held = await holdings();
  for (const args of [
    ["submit", "--type", "summary", input, "--out", ""],
    ["download", "100000000", "--out", ""],
    ["download", "100000000", "--out="],
  ]) {
    const r = await client(args, suite.env());
    assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
    assert.equal(errorOf(r.stdout)?.code, "USAGE", r.stdout);
    assert.match(r.stderr, /--out is empty/);
  }
  assert.deepEqual(await holdings(), held, "nothing uploaded, no task created");
});

test("an --out the system cannot look at (a loop of links) is exit 2 USAGE naming --out, before any upload", async () => {
  const input = path.join(suite.work, "boucle «2».csv");
  fs.writeFileSync(input, csv(5, 29));
  const loop = path.join(suite.work, "boucle");
  fs.symlinkSync(loop, loop);
  const held = await holdings();
  const r = await client(["submit", "--type", "summary", input, "--out", path.join(loop, "x")], suite.env());
  assert.equal(r.code, 2, r.stderr);
  assert.equal(errorOf(r.stdout)?.code, "USAGE", r.stdout);
  assert.match(errorOf(r.stdout)?.message ?? "", /cannot write to --out .*ELOOP/);
  assert.deepEqual(await holdings(), held, "nothing uploaded, no task created");
});

test("an --out where mkdir answers ENOENT under a folder that exists (procfs) is exit 2 USAGE naming --out, not a loop", async () => {
  const input = path.join(suite.work, "proc «3».csv");
  fs.writeFileSync(input, csv(5, 31));
  const held = await holdings();
  // Node's recursive mkdir tries such a folder again for ever, synchronously (Ctrl-C cannot stop it):
  // until 2026-12-07 this never ended.
  const r = await client(["submit", "--type", "summary", input, "--out", "/proc/assay-nope/x"], suite.env());
  assert.equal(r.code, 2, r.stderr);
  assert.equal(errorOf(r.stdout)?.code, "USAGE", r.stdout);
  assert.match(errorOf(r.stdout)?.message ?? "", /cannot write to --out \/proc\/assay-nope\/x: ENOENT/);
  assert.deepEqual(await holdings(), held, "nothing uploaded, no task created");
});
