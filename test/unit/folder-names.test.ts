// The rules that name a run's folder after its input file (src/files/folder-names.ts), shared by the
// task's zip and the CLI's downloads: one safe path segment on Linux, macOS and Windows alike, the
// key folders compare by (case and Unicode normalization folded), and when a folder gets ` (run <id>)`.
import assert from "node:assert/strict";
import fs from "node:fs";
import { test } from "node:test";
import { RESULTS_FILE as CLIENT_RESULTS_FILE, folderNames } from "../../src/client/download.ts";
import {
  distinctFileNames,
  folderKey,
  inputFolderKey,
  needsRunSuffix,
  RESULTS_FILE,
  RUN_SUFFIX,
  runFolder,
  safeSegment,
  withRunSuffix,
} from "../../src/files/folder-names.ts";
import { RESULTS_FILE_NAME } from "../../src/tasks/results.ts";

/**
 * Whether Windows can create `name` as a file or folder, written out here apart from the rules under
 * test: none of `<>:"|?*`, a separator or a control character; no trailing dot or space; not a device
 * name before the first dot (trailing spaces ignored); not empty, `.` or `..`.
 */
function windowsSafe(name: string): boolean {
  if (name === "" || name === "." || name === "..") return false;
  for (const ch of name) {
    const c = ch.codePointAt(0) as number;
    if (c < 0x20 || c === 0x7f || '<>:"|?*/\\'.includes(ch)) return false;
  }
  if (name.endsWith(".") || name.endsWith(" ")) return false;
  const stem = (name.split(".")[0] as string).replace(/ +$/, "").toUpperCase();
  const devices = ["CON", "PRN", "AUX", "NUL"];
  for (let d = 1; d <= 9; d++) devices.push(`COM${d}`, `LPT${d}`);
  return !devices.includes(stem);
}

test("the module imports nothing but Node's own: the CLI loads it, and must load nothing of the server", () => {
  const source = fs.readFileSync(new URL("../../src/files/folder-names.ts", import.meta.url), "utf8");
  const imports = source.match(/^\s*(import|export)\b[^;]*\bfrom\s*"[^"]*"/gm) ?? [];
  assert.deepEqual(
    imports.filter((i) => !/"node:[^"]*"$/.test(i)),
    [],
  );
  assert.doesNotMatch(source, /\bimport\s*\(/);
});

test("one name for the results table on both sides", () => {
  assert.equal(RESULTS_FILE, "results.csv");
  assert.equal(RESULTS_FILE, RESULTS_FILE_NAME, "the table the zip writes at its root");
  assert.equal(RESULTS_FILE, CLIENT_RESULTS_FILE, "the table the CLI writes at the top of a download");
});

test("safeSegment: separators, Windows' characters and control characters become _", () => {
  assert.equal(safeSegment("../../etc/passwd"), "__.._etc_passwd");
  assert.equal(safeSegment("a\\b.csv"), "a_b.csv");
  for (const ch of '<>:"|?*') assert.equal(safeSegment(`a${ch}b.csv`), "a_b.csv", JSON.stringify(ch));
  assert.equal(safeSegment('<img src=x onerror="alert(1)">.csv'), "_img src=x onerror=_alert(1)__.csv");
  for (let c = 0; c <= 0x1f; c++) {
    assert.equal(safeSegment(`a${String.fromCharCode(c)}b.csv`), "a_b.csv", `U+${c.toString(16)}`);
  }
  assert.equal(safeSegment("a\u007fb.csv"), "a_b.csv");
  assert.equal(safeSegment("a\u0000b\nc.csv"), "a_b_c.csv", "replaced, not dropped: ab.csv is another name");
  // Bidi embeddings, overrides and isolates: a folder must read as it is.
  for (const c of [0x202a, 0x202b, 0x202c, 0x202d, 0x202e, 0x2066, 0x2067, 0x2068, 0x2069]) {
    assert.equal(
      safeSegment(`invoice${String.fromCharCode(c)}fdp.exe`),
      "invoice_fdp.exe",
      `U+${c.toString(16)}`,
    );
  }
  // What Windows allows stays: other punctuation, non-ASCII letters, U+0080 and beyond.
  for (const name of ["a;b,c=d+e[f]g{h}%20'!@#$&().csv", "données β.csv", "日本語 🎉.csv", "a\u0085b.csv"]) {
    assert.equal(safeSegment(name), name);
  }
});

test("safeSegment: leading dots become one _, each trailing dot or space a _, nothing left is input", () => {
  assert.equal(safeSegment(".hidden.csv"), "_hidden.csv");
  assert.equal(safeSegment("..x"), "_x");
  assert.equal(safeSegment("."), "_");
  assert.equal(safeSegment(".."), "_");
  assert.equal(safeSegment("..."), "_");
  assert.equal(safeSegment("x."), "x_");
  assert.equal(safeSegment("x.."), "x__");
  assert.equal(safeSegment("x "), "x_");
  assert.equal(safeSegment("x. ."), "x___");
  assert.equal(safeSegment(".x."), "_x_");
  assert.equal(safeSegment("   "), "___");
  assert.equal(safeSegment("a b.c d"), "a b.c d", "dots and spaces inside stay");
  assert.equal(safeSegment(""), "input");
});

test("safeSegment: a Windows device name before the first dot gets a _ before it", () => {
  const devices = ["CON", "PRN", "AUX", "NUL"];
  for (let d = 1; d <= 9; d++) devices.push(`COM${d}`, `LPT${d}`);
  for (const device of devices) {
    for (const name of [
      device,
      device.toLowerCase(),
      `${device[0]}${device.slice(1).toLowerCase()}`,
      `${device}.csv`,
      `${device.toLowerCase()}.tar.gz`,
      `${device} .csv`,
      `${device}   .csv`,
    ]) {
      assert.equal(safeSegment(name), `_${name}`, name);
      assert.ok(windowsSafe(safeSegment(name)), name);
    }
  }
  // Superscript digits count as digits to Windows.
  assert.equal(safeSegment("COM\u00b9.csv"), "_COM\u00b9.csv");
  assert.equal(safeSegment("lpt\u00b3"), "_lpt\u00b3");
  // A device name with spaces after it and nothing else: the trailing spaces go, and with them the name.
  assert.equal(safeSegment("CON "), "CON_");
  // Not device names.
  for (const name of [
    "COM0.csv",
    "COM10.csv",
    "LPT.csv",
    "CONSOLE.csv",
    "xCON.csv",
    "CON_.csv",
    "_CON.csv",
  ]) {
    assert.equal(safeSegment(name), name);
  }
  assert.equal(safeSegment("a.CON"), "a.CON", "only the part before the first dot counts");
  // A leading dot is replaced first: ".CON" becomes "_CON", which is no device.
  assert.equal(safeSegment(".CON"), "_CON");
});

test("safeSegment: every result is one segment Windows can create, and a second pass changes nothing", () => {
  const names = [
    "",
    ".",
    "..",
    "a:b.csv",
    "x.",
    "x. ",
    " ",
    "CON",
    "nul.txt",
    "Com1 .csv",
    "a/b\\c",
    "\u0000",
    "\u007f.",
    "results.csv",
    "ünïcødé — 数据 (run).csv",
    "e\u0301te\u0301.csv",
    'quote " and ? star *.csv',
  ];
  for (const name of names) {
    const safe = safeSegment(name);
    assert.ok(windowsSafe(safe), `${JSON.stringify(name)} → ${JSON.stringify(safe)}`);
    assert.ok(!safe.startsWith("."), safe);
    assert.equal(safeSegment(safe), safe, JSON.stringify(name));
  }
});

test("folderKey folds case, non-ASCII letters included, and Unicode normalization", () => {
  assert.equal(folderKey("Report.CSV"), "report.csv");
  assert.equal(folderKey("Ä.csv"), folderKey("ä.csv"));
  assert.equal(folderKey("ÉTÉ.csv"), folderKey("été.csv"));
  assert.equal(folderKey("ΔΕΔΟΜΈΝΑ.csv"), folderKey("δεδομένα.csv"));
  // Composed é and e + combining acute (as macOS stores names): one key, and the composed form.
  assert.equal(folderKey("caf\u00e9.csv"), folderKey("cafe\u0301.csv"));
  assert.equal(folderKey("CAFE\u0301.csv"), "caf\u00e9.csv");
  assert.notEqual(folderKey("a.csv"), folderKey("b.csv"));
  assert.notEqual(folderKey("cafe.csv"), folderKey("caf\u00e9.csv"));
});

test("folderKey folds as macOS (Unicode case folding) and Windows (upper case) do, not as toLowerCase alone", () => {
  // Each pair is one name on macOS or Windows; toLowerCase() alone keeps every one of them apart.
  const pairs = [
    ["\u017f.csv", "s.csv"], // long s
    ["\u017f.csv", "S.csv"],
    ["\u03c2.csv", "\u03c3.csv"], // final and medial sigma
    ["\u03c2.csv", "\u03a3.csv"],
    ["\u03d0.csv", "\u03b2.csv"], // curled beta
    ["\u03d1.csv", "\u03b8.csv"], // theta symbol
    ["\u03f5.csv", "\u03b5.csv"], // lunate epsilon
    ["\u00b5.csv", "\u03bc.csv"], // micro sign and mu
    ["\u1fbe.csv", "\u03b9.csv"], // prosgegrammeni and iota
    ["\u0131.csv", "i.csv"], // dotless i, whose upper case is I
    ["\u1c80.csv", "\u0432.csv"], // rounded ve
    ["\u1e9e.csv", "ss.csv"], // capital sharp s: small sharp s to toLowerCase, ss to case folding
    ["\u00df.csv", "SS.csv"], // full case folding: ß is ss
    ["\u01f0.csv", "J\u030c.csv"], // ǰ, whose upper case is J + combining caron
  ];
  for (const [a, b] of pairs) {
    assert.notEqual(
      (a as string).toLowerCase(),
      (b as string).toLowerCase(),
      `${a} ${b}: a case lower() misses`,
    );
    assert.equal(folderKey(a as string), folderKey(b as string), `${a} ${b}`);
  }
  // The key is in NFC, and a second pass changes nothing.
  for (const name of ["\u01f0.csv", "\u0390.csv", "I\u0307.csv", "\u1e9e.csv", "CAFE\u0301.csv", "ΟΔΟΣ"]) {
    const key = folderKey(name);
    assert.equal(key, key.normalize("NFC"), name);
    assert.equal(folderKey(key), key, name);
  }
  assert.equal(folderKey("\u03a3\u039f\u03a6\u0399\u0391.csv"), "\u03c3\u03bf\u03c6\u03b9\u03b1.csv");
  // Still apart: different letters, and an accent.
  assert.notEqual(folderKey("s.csv"), folderKey("z.csv"));
  assert.notEqual(folderKey("\u03c3.csv"), folderKey("\u03c4.csv"));
  assert.notEqual(folderKey("i.csv"), folderKey("\u00ef.csv"));
  // The folders and the output files of a run follow it, in the zip and in a download alike.
  const runs = ["\u017f.csv", "s.csv", "\u03c2.csv", "\u03c3.csv", "\u00b5.csv"].map((fileName, i) => ({
    runId: String(50 + i),
    fileName,
  }));
  assert.deepEqual(zipFolders(runs), [
    "\u017f.csv (run 50)",
    "s.csv (run 51)",
    "\u03c2.csv (run 52)",
    "\u03c3.csv (run 53)",
    "\u00b5.csv",
  ]);
  assert.deepEqual([...folderNames(runs).values()], zipFolders(runs));
  assert.equal(
    runFolder("re\u017fults.csv", "9", false),
    "re\u017fults.csv (run 9)",
    "the results table on macOS",
  );
  assert.deepEqual(distinctFileNames(["\u03c3.json", "\u03c2.json", "\u017f.csv", "s.csv"]), [
    "\u03c3 (2).json",
    "\u03c2.json",
    "\u017f (2).csv",
    "s.csv",
  ]);
});

test("inputFolderKey compares the safe names: inputs that become one folder share a key", () => {
  const pairs = [
    ["a:b.csv", "a_b.csv"],
    ["a\\b.csv", "a_b.csv"],
    ["a\tb.csv", "A_B.csv"],
    ["x.", "x_"],
    ["x ", "X_"],
    [".d.csv", "_d.csv"],
    ["CON.csv", "_con.csv"],
    ["Ä.csv", "a\u0308.csv"],
  ];
  for (const [a, b] of pairs)
    assert.equal(inputFolderKey(a as string), inputFolderKey(b as string), `${a} ${b}`);
  assert.notEqual(inputFolderKey("a:b.csv"), inputFolderKey("ab.csv"));
  assert.notEqual(inputFolderKey("x."), inputFolderKey("x"));
});

test("when a folder gets ` (run <id>)`: shared, the results table's name, or already ending so", () => {
  assert.equal(withRunSuffix("a.csv", "12"), "a.csv (run 12)");
  assert.ok(RUN_SUFFIX.test("a.csv (run 12)"));
  for (const no of ["a.csv (run)", "a.csv (run 12) x", "a.csv (run x)", "a.csv(run 12)", "a.csv (RUN 12)"]) {
    assert.ok(!RUN_SUFFIX.test(no), no);
  }
  assert.equal(needsRunSuffix("a.csv", false), false);
  assert.equal(needsRunSuffix("a.csv", true), true);
  assert.equal(needsRunSuffix("results.csv", false), true);
  assert.equal(needsRunSuffix("a.csv (run 12)", false), true);
  assert.equal(runFolder("a.csv", "7", false), "a.csv");
  assert.equal(runFolder("a.csv", "7", true), "a.csv (run 7)");
  assert.equal(runFolder("Results.CSV", "7", false), "Results.CSV (run 7)");
  assert.equal(runFolder("results.csv.", "7", false), "results.csv_", "not the table once made safe");
  // The suffix is found in the key, so its case does not matter: "(RUN 12)" is "(run 12)" on Windows.
  assert.equal(runFolder("a.csv (RUN 12)", "13", false), "a.csv (RUN 12) (run 13)");
  assert.equal(runFolder("a:b.csv", "8", true), "a_b.csv (run 8)");
  assert.equal(runFolder("CON.csv", "9", false), "_CON.csv");
  assert.equal(runFolder("", "9", false), "input");
});

/** The zip's folders for runs, as zipPages decides them (shared: another run has the same key). */
function zipFolders(runs: { runId: string; fileName: string }[]): string[] {
  const keys = runs.map((r) => inputFolderKey(r.fileName));
  return runs.map((r, i) => runFolder(r.fileName, r.runId, keys.filter((k) => k === keys[i]).length > 1));
}

test("hostile names: the CLI's folders are the zip's, one per run on any file system, each Windows-safe", () => {
  const names = [
    "a:b.csv",
    "a_b.csv",
    "a|b.csv",
    "ab.csv",
    "x.",
    "x_",
    "y ",
    "CON.csv",
    "con.CSV",
    "_con.csv",
    "NUL",
    "aux.txt",
    "LPT1 .csv",
    ".d.csv",
    "_d.csv",
    "D.csv",
    "Ä.csv",
    "a\u0308.csv",
    "results.csv",
    "RESULTS.CSV.",
    "same.csv",
    "same.csv",
    "same.csv (run 1021)",
    "same.csv (RUN 1022)",
    "plain ✓.csv",
  ];
  const runs = names.map((fileName, i) => ({ runId: String(1000 + i), fileName }));
  const zip = zipFolders(runs);
  const cli = folderNames(runs);
  assert.deepEqual(
    [...cli.keys()],
    runs.map((r) => r.runId),
  );
  assert.deepEqual([...cli.values()], zip, "a run's folder in a download is its folder in the zip");
  assert.deepEqual(zip, [
    "a_b.csv (run 1000)",
    "a_b.csv (run 1001)",
    "a_b.csv (run 1002)",
    "ab.csv",
    "x_ (run 1004)",
    "x_ (run 1005)",
    "y_",
    "_CON.csv (run 1007)",
    "_con.CSV (run 1008)",
    "_con.csv (run 1009)",
    "_NUL",
    "_aux.txt",
    "_LPT1 .csv",
    "_d.csv (run 1013)",
    "_d.csv (run 1014)",
    "D.csv",
    "Ä.csv (run 1016)",
    "a\u0308.csv (run 1017)",
    "results.csv (run 1018)",
    "RESULTS.CSV_",
    "same.csv (run 1020)",
    "same.csv (run 1021)",
    "same.csv (run 1021) (run 1022)",
    "same.csv (RUN 1022) (run 1023)",
    "plain ✓.csv",
  ]);
  const keys = zip.map(folderKey);
  assert.equal(new Set([...keys, RESULTS_FILE]).size, zip.length + 1, "no two alike, none the table");
  for (const f of zip) assert.ok(windowsSafe(f), f);
});

test("names over 255 UTF-8 bytes are cut at a character, and a suffixed one keeps its whole suffix", (t) => {
  const bytes = (s: string) => Buffer.byteLength(s, "utf8");
  // 100 Chinese characters and an extension: 304 bytes, over what ext4 holds in one name.
  const long = `${"数据分析报告".repeat(17).slice(0, 100)}.csv`;
  assert.equal(bytes(long), 304);
  const safe = safeSegment(long);
  assert.ok(bytes(safe) <= 255, `${bytes(safe)} bytes`);
  assert.ok(long.startsWith(safe), "a start of the name, no character split");
  assert.equal(safeSegment(safe), safe, "a second pass changes nothing");
  // A device name's `_` counts towards the limit: `aux.ab` and 124 Chinese characters is 370 bytes.
  const device = safeSegment(`aux.ab${"数".repeat(124)}`);
  assert.ok(device.startsWith("_aux.ab"), device.slice(0, 10));
  assert.ok(bytes(device) <= 255, `${bytes(device)} bytes`);
  assert.equal(safeSegment(device), device, "a second pass changes nothing");
  // A cut that ends on a space or a dot is made Windows-safe like any other name.
  assert.ok(windowsSafe(safeSegment(`${"a".repeat(254)} b`)));
  // Two names alike in their first 255 bytes are one folder: both get their run's id, whole.
  const twins = [
    { runId: "99999", fileName: `${long.slice(0, 90)}甲.csv` },
    { runId: "100000", fileName: `${long.slice(0, 90)}乙.csv` },
  ];
  const cli = folderNames(twins);
  assert.deepEqual([...cli.values()], zipFolders(twins));
  assert.match(cli.get("99999") as string, / \(run 99999\)$/);
  assert.match(cli.get("100000") as string, / \(run 100000\)$/);
  // And the folders can be made where outputs land.
  const root = fs.mkdtempSync("/tmp/folder-names-");
  t.after(() => fs.rmSync(root, { recursive: true, force: true }));
  for (const folder of [safe, ...cli.values(), withRunSuffix(safe, "123456789012")]) {
    assert.ok(bytes(folder) <= 255, `${bytes(folder)} bytes`);
    fs.mkdirSync(`${root}/${folder}`);
  }
});
