// What a local store writes is not for other accounts on the host, and what the process's umask
// gives its user and group is kept: at umask 002 (an API and workers that are different users of one
// group) the folders the store makes are group-writable, and a set-group-ID folder keeps its bit.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { test } from "node:test";
import { LocalStore, publishFolder } from "../../src/storage/local.ts";
import { scratchDir } from "../helpers/tmp.ts";

const mode = (p: string) => (fs.statSync(p).mode & 0o7777).toString(8);

for (const [umask, folders, outputs] of [
  [0o022, "750", ["640", "2750"]],
  [0o002, "770", ["660", "2770"]],
] as const)
  test(`umask ${umask.toString(8).padStart(3, "0")}: the store's folders ${folders}, an output's file and folder ${outputs.join(" and ")}`, async () => {
    const before = process.umask(umask);
    try {
      const root = path.join(scratchDir("store-modes-"), "data");
      const store = new LocalStore(root);
      await store.check();
      await store.put("files/100000001", Readable.from([Buffer.from("a,b\n1,2\n")]));
      // An attempt's output folder as a program leaves it (0664 files under umask 002, 0644 under 022)
      // in a set-group-ID folder (a data directory with the bit set passes it on).
      const out = path.join(scratchDir("store-modes-out-"), "out");
      fs.mkdirSync(out);
      fs.chmodSync(out, 0o2777 & ~umask);
      fs.writeFileSync(path.join(out, "r.json"), "{}", { mode: 0o666 & ~umask });
      const target = store.localPath("outputs/100000002/100000003.1.t");
      await publishFolder(root, out, target, ["r.json"]);
      assert.deepEqual(
        [
          root,
          path.join(root, "files"),
          path.join(root, ".partial"),
          path.join(root, "outputs"),
          path.dirname(target),
        ].map(mode),
        [folders, folders, folders, folders, folders],
      );
      assert.equal(mode(store.localPath("files/100000001")), "640");
      assert.deepEqual([mode(path.join(target, "r.json")), mode(target)], outputs);
    } finally {
      process.umask(before);
    }
  });
