// The streaming zip writer (src/http/zip.ts): byte for byte what yazl writes for the same entries, and
// readable by unrelated tools (Python's zipfile, Info-ZIP's unzip), ZIP64 included.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { buffer } from "node:stream/consumers";
import { test } from "node:test";
import { ZipFile } from "yazl";
import { type ZipOptions, ZipWriter } from "../../src/http/zip.ts";
import { zipNames, zipRead } from "../helpers/zip.ts";

interface Entry {
  name: string;
  /** The content, sent in these chunks. */
  chunks: Buffer[];
}

const MTIME = new Date(2026, 4, 17, 13, 45, 31);

async function ours(entries: Iterable<Entry>, o: ZipOptions = {}): Promise<Buffer> {
  const zip = new ZipWriter({ mtime: MTIME, ...o });
  async function* all() {
    for (const e of entries) yield* zip.entry(e.name, Readable.from(e.chunks));
    yield* zip.end();
  }
  return buffer(Readable.from(all()));
}

async function yazl(entries: Iterable<Entry>, o: ZipOptions = {}): Promise<Buffer> {
  const zip = new ZipFile();
  const out = buffer(zip.outputStream as unknown as Readable);
  for (const e of entries) {
    zip.addReadStreamLazy(
      e.name,
      { mtime: MTIME, compress: o.compress ?? true, forceZip64Format: o.forceZip64 ?? false },
      (done) => done(null, Readable.from(e.chunks) as unknown as NodeJS.ReadableStream),
    );
  }
  zip.end({ forceZip64Format: o.forceZip64 ?? false, comment: "" });
  return out;
}

const text = randomBytes(40_000).toString("base64");
const SMALL: Entry[] = [
  { name: "results.csv", chunks: [Buffer.from("runId,status\n1,succeeded\n")] },
  { name: "a.csv/result.json", chunks: [Buffer.from('{"rows":1}\n')] },
  { name: "empty.csv/empty.txt", chunks: [] },
  { name: "données – 数据.csv/Report-2026.Final.html", chunks: [Buffer.from("<p>été</p>")] },
  {
    name: "big.csv (run 12)/out.txt",
    chunks: [Buffer.from(text.slice(0, 1000)), Buffer.from(text.slice(1000)), randomBytes(70_000)],
  },
];

test("the same bytes as yazl: deflated, stored, and with ZIP64 records forced", async () => {
  for (const o of [{}, { compress: false }, { forceZip64: true }, { compress: false, forceZip64: true }]) {
    const mine = await ours(SMALL, o);
    const theirs = await yazl(SMALL, o);
    assert.equal(mine.length, theirs.length, JSON.stringify(o));
    assert.ok(mine.equals(theirs), `identical bytes for ${JSON.stringify(o)}`);
    assert.deepEqual(
      zipNames(mine),
      SMALL.map((e) => e.name),
    );
    assert.equal(zipRead(mine, "empty.csv/empty.txt").length, 0);
    assert.equal(zipRead(mine, "données – 数据.csv/Report-2026.Final.html").toString(), "<p>été</p>");
    assert.ok(zipRead(mine, SMALL[4]?.name as string).equals(Buffer.concat(SMALL[4]?.chunks ?? [])));
  }
});

test("an empty zip is yazl's too", async () => {
  assert.ok((await ours([])).equals(await yazl([])));
});

test("more than 65,535 entries: ZIP64 end records that Python's zipfile and unzip -t read", {
  timeout: 120_000,
}, async () => {
  const N = 66_000;
  const many = function* (): Generator<Entry> {
    for (let i = 0; i < N; i++) {
      yield { name: `f-${i}.csv/result.json`, chunks: i % 7 === 0 ? [] : [Buffer.from(`{"run":"${i}"}\n`)] };
    }
  };
  const mine = await ours(many());
  // The ZIP64 end of central directory record is there; the classic one says "see ZIP64".
  assert.notEqual(mine.indexOf(Buffer.from([0x50, 0x4b, 0x06, 0x06])), -1);
  assert.equal(mine.readUInt16LE(mine.length - 22 + 10), 0xffff);
  // (yazl is not run on this many: it scans every entry for each one it writes, minutes here.)
  const file = path.join(os.tmpdir(), `assay-zip64-${randomBytes(4).toString("hex")}.zip`);
  fs.writeFileSync(file, mine);
  try {
    const checked = execFileSync("python3", [
      "-c",
      "import sys,zipfile; z=zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None; n=z.namelist(); print(len(n), n[-1], z.read(n[-1]).decode().strip())",
      file,
    ]).toString();
    assert.equal(checked.trim(), `${N} f-${N - 1}.csv/result.json {"run":"${N - 1}"}`);
    assert.match(execFileSync("unzip", ["-tq", file]).toString(), /No errors detected/);
  } finally {
    fs.rmSync(file, { force: true });
  }
});

test("a source that fails mid-entry fails the zip (no end records), and is released", async () => {
  const zip = new ZipWriter({ mtime: MTIME });
  let sent = 0;
  const failing = new Readable({
    read() {
      if (sent++ < 3) this.push(randomBytes(64 * 1024));
      else this.destroy(new Error("the disk went away"));
    },
  });
  const chunks: Buffer[] = [];
  await assert.rejects(async () => {
    for await (const c of zip.entry("a.csv/out.txt", failing)) chunks.push(c);
  }, /the disk went away/);
  assert.ok(failing.destroyed);
  assert.ok(chunks.length > 0, "the entry had begun");
  assert.equal(Buffer.concat(chunks).indexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06])), -1);
});

test("a reader that leaves mid-entry releases the source", async () => {
  const zip = new ZipWriter({ mtime: MTIME });
  const source = new Readable({
    read() {
      this.push(randomBytes(64 * 1024));
    },
  });
  const closed = new Promise((r) => source.once("close", r));
  let n = 0;
  for await (const _ of zip.entry("endless/out.txt", source)) if (++n === 5) break;
  await closed;
  assert.ok(source.destroyed);
});

test("names yazl refuses are refused, and their source released", async () => {
  for (const bad of ["", "/etc/passwd", "a/../../b", "C:/x", "dir/"]) {
    const source = Readable.from([Buffer.from("x")]);
    const zip = new ZipWriter();
    await assert.rejects(async () => {
      for await (const _ of zip.entry(bad, source));
    }, bad);
    assert.ok(source.destroyed, bad);
  }
});
