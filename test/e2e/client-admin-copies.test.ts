// An admin's `assay submit` against a real server: the file lists show an admin everyone's files, and
// the client must only ever reuse a copy the caller owns — never another user's file that happens to
// have the same bytes and name — whether it finds copies in the short list of files or by asking
// for each hash (a long list), and still reuse the admin's own.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { client, clientSuite, csv, jsonLines, type Line, ofKind } from "../helpers/client.ts";
import { startTcpProxy } from "../helpers/tcp-proxy.ts";

let bob: string;
let ada: string;

const suite = clientSuite({
  user: "bob «le client»",
  scratch: "assay-client-admin-",
  concurrency: 1,
  ids: { files: 2 },
  setup: async () => {
    bob = suite.token;
    ada = (await tokenCreate(suite.server.db.sql, "ada", "admin")).token;
  },
});

type FileLine = Line & { fileId: string; owner: string; uploaded: boolean; name: string };

async function submit(token: string, file: string): Promise<FileLine> {
  const r = await client(["submit", "--type", "summary", file], suite.server.env(token));
  assert.equal(r.code, 0, r.stderr);
  const files = ofKind(jsonLines(r.stdout), "file") as FileLine[];
  assert.equal(files.length, 1, r.stdout);
  return files[0] as FileLine;
}

test("an admin's submit uploads its own copy rather than take another user's file of the same bytes and name", async () => {
  // The same bytes and name in two users' hands (their own folders).
  const name = "relevé 🧾 Q3.csv";
  const bytes = csv(40, 7);
  for (const who of ["bob", "ada"]) {
    fs.mkdirSync(path.join(suite.work, who));
    fs.writeFileSync(path.join(suite.work, who, name), bytes);
  }
  const bobs = await submit(bob, path.join(suite.work, "bob", name));
  assert.equal(bobs.uploaded, true);
  assert.equal(bobs.owner, "bob «le client»");

  // Few files on the server: the admin's client reads the list of files, which holds bob's.
  const first = await submit(ada, path.join(suite.work, "ada", name));
  assert.equal(first.owner, "ada", "the admin's run reads the admin's own file");
  assert.equal(first.uploaded, true);
  assert.notEqual(first.fileId, bobs.fileId);
  // Its own copy is reused next time.
  const again = await submit(ada, path.join(suite.work, "ada", name));
  assert.equal(again.uploaded, false);
  assert.equal(again.fileId, first.fileId);

  // Many files (more than the list the client reads for one input): it asks by hash, and that
  // answer too holds bob's copy of new bytes.
  const other = csv(41, 9);
  fs.writeFileSync(path.join(suite.work, "bob", "b.csv"), other);
  fs.writeFileSync(path.join(suite.work, "ada", "b.csv"), other);
  const bobsB = await submit(bob, path.join(suite.work, "bob", "b.csv"));
  await suite.server.db.sql`
    insert into files (owner_id, name, content_type, size_bytes, sha256, storage_key)
    select u.id, 'filler ' || g || '.csv', 'text/csv', 10, repeat('0', 64), 'filler/' || g
    from users u, generate_series(1, 250) g where u.name = 'bob «le client»'`;
  const second = await submit(ada, path.join(suite.work, "ada", "b.csv"));
  assert.equal(second.owner, "ada");
  assert.equal(second.uploaded, true);
  assert.notEqual(second.fileId, bobsB.fileId);
  const third = await submit(ada, path.join(suite.work, "ada", "b.csv"));
  assert.equal(third.uploaded, false);
  assert.equal(third.fileId, second.fileId);
});

test("an admin's upload whose connection broke takes no other user's file of its bytes and name before sending it again", async () => {
  const name = "données ✓ 2026.csv";
  const bytes = csv(45, 11);
  for (const who of ["bob", "ada"]) {
    fs.mkdirSync(path.join(suite.work, who), { recursive: true });
    fs.writeFileSync(path.join(suite.work, who, name), bytes);
  }
  const bobs = await submit(bob, path.join(suite.work, "bob", name));
  // The admin's first upload is cut as it starts (the server keeps nothing of it); before sending
  // it again the client asks by hash whether it arrived, and the answer holds bob's file.
  let cut = false;
  const proxy = await startTcpProxy(suite.server.url, {
    fromClient: (chunk) => {
      if (cut || !chunk.subarray(0, 20).toString("latin1").startsWith("POST /api/files ")) return "pass";
      cut = true;
      return "cut";
    },
  });
  try {
    const r = await client(
      ["submit", "--type", "summary", path.join(suite.work, "ada", name)],
      suite.server.env(ada, { ASSAY_URL: proxy.url }),
    );
    assert.equal(r.code, 0, r.stderr);
    assert.ok(cut, "the first upload was cut");
    const [file] = ofKind(jsonLines(r.stdout), "file") as FileLine[];
    assert.equal(file?.owner, "ada", r.stderr);
    assert.notEqual(file?.fileId, bobs.fileId);
    assert.doesNotMatch(r.stderr, /it had arrived whole/);
  } finally {
    await proxy.close();
  }
});
