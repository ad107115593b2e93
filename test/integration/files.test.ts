import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";

const LIMIT = 64 * 1024;
let t: TestApp;
let alice: string;
let bob: string;
let admin: string;

before(async () => {
  t = await startTestApp({ ASSAY_MAX_UPLOAD_BYTES: String(LIMIT) });
  [alice, bob, admin] = await Promise.all([t.token("alice"), t.token("bob"), t.token("root", "admin")]);
});
after(() => t.close());

async function upload(token: string, content: Buffer | string, filename = "data.csv") {
  const { payload, headers } = multipart("file", content, filename);
  return t.app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { ...headers, ...bearer(token) },
  });
}

const listing = (dir: string) =>
  fs.existsSync(path.join(t.config.dataDir, dir))
    ? fs.readdirSync(path.join(t.config.dataDir, dir)).sort()
    : [];
const filesOnDisk = () => listing("files");
const partials = () => listing(".partial");
const fileRows = async () => (await t.db.sql`select count(*)::int as n from files`)[0]?.n as number;

describe("POST /api/files", () => {
  test("stores the upload under its id with size and sha256, and GET returns the same metadata", async () => {
    const content = "a,b\n1,2\n3,4\n";
    const res = await upload(alice, content);
    assert.equal(res.statusCode, 201);
    const body = res.json();
    assert.equal(body.code, "OK");
    assert.match(body.data.fileId, /^[1-9][0-9]*$/);
    assert.equal(body.data.name, "data.csv");
    assert.equal(body.data.sizeBytes, Buffer.byteLength(content));
    assert.equal(body.data.sha256, createHash("sha256").update(content).digest("hex"));
    assert.ok(!Number.isNaN(Date.parse(body.data.createdAt)));
    const stored = fs.readFileSync(path.join(t.config.dataDir, "files", body.data.fileId), "utf8");
    assert.equal(stored, content);

    const got = await t.app.inject({ url: `/api/files/${body.data.fileId}`, headers: bearer(alice) });
    assert.equal(got.statusCode, 200);
    assert.deepEqual(got.json().data, body.data);
  });

  test("a path in the file name is metadata only: stored by id, returned as its base name", async () => {
    for (const [given, expected] of [
      ["../../etc/passwd", "passwd"],
      ["..\\..\\windows\\win.ini", "win.ini"],
      ["..", "upload"],
      ["evil\u0000name.csv", "evilname.csv"],
    ] as const) {
      const res = await upload(alice, "x,y\n1,2\n", given);
      assert.equal(res.statusCode, 201, given);
      const { fileId, name } = res.json().data;
      assert.equal(name, expected);
      assert.ok(fs.existsSync(path.join(t.config.dataDir, "files", fileId)));
    }
    assert.ok(!fs.existsSync(path.join(t.config.dataDir, "etc")));
    assert.ok(filesOnDisk().every((n) => /^[0-9]+$/.test(n)));
  });

  test("the part's declared type is kept when it is a media type; anything else is application/octet-stream", async () => {
    for (const [given, expected] of [
      ["text/csv", "text/csv"],
      ["Application/VND.MS-Excel; charset=utf-8", "application/vnd.ms-excel"],
      ["text/\u0000csv", "application/octet-stream"],
      ["text/\u001b[31mcsv", "application/octet-stream"],
      ["text/\u009bcsv", "application/octet-stream"],
      ["text/données", "application/octet-stream"],
      [`text/${"x".repeat(20_000)}`, "application/octet-stream"],
      ["csv", "application/octet-stream"],
    ] as const) {
      const { payload, headers } = multipart("file", "x,y\n1,2\n", "data.csv", given);
      const res = await t.app.inject({
        method: "POST",
        url: "/api/files",
        payload,
        headers: { ...headers, ...bearer(alice) },
      });
      assert.equal(res.statusCode, 201, `${JSON.stringify(given.slice(0, 40))}: ${res.body}`);
      const { fileId, contentType } = res.json().data;
      assert.equal(contentType, expected);
      const [row] = await t.db.sql`select content_type from files where id = ${fileId}`;
      assert.equal(row?.content_type, expected);
    }
  });

  test("over ASSAY_MAX_UPLOAD_BYTES → 413, nothing on disk or in the database", async () => {
    const before = { rows: await fileRows(), files: filesOnDisk() };
    const res = await upload(alice, Buffer.alloc(LIMIT + 1, 97));
    assert.equal(res.statusCode, 413);
    assert.deepEqual(res.json(), {
      code: "PAYLOAD_TOO_LARGE",
      message: "The upload exceeds this server's limit of 64 KiB per file.",
    });
    assert.equal(await fileRows(), before.rows);
    assert.deepEqual(filesOnDisk(), before.files);
    assert.deepEqual(partials(), []);
    // Exactly at the limit is fine.
    assert.equal((await upload(alice, Buffer.alloc(LIMIT, 97))).statusCode, 201);
  });

  test("a request without the `file` part → 400", async () => {
    const { payload, headers } = multipart("other", "a,b\n");
    const res = await t.app.inject({
      method: "POST",
      url: "/api/files",
      payload,
      headers: { ...headers, ...bearer(alice) },
    });
    assert.equal(res.statusCode, 400);
    assert.equal(res.json().code, "VALIDATION_FAILED");
  });

  test("form fields: up to 10 before the file are ignored, more → 413; parts after the file are ignored", async () => {
    const B = "assayFieldsBoundary";
    const part = (name: string, filename: string | null, content: string, type?: string) =>
      `--${B}\r\nContent-Disposition: form-data; name="${name}"${filename === null ? "" : `; filename="${filename}"`}\r\n${
        type ? `Content-Type: ${type}\r\n` : ""
      }\r\n${content}\r\n`;
    const fields = (n: number) => Array.from({ length: n }, (_, i) => part(`f${i}`, null, "v")).join("");
    const send = (body: string) =>
      t.app.inject({
        method: "POST",
        url: "/api/files",
        payload: `${body}--${B}--\r\n`,
        headers: { ...bearer(alice), "content-type": `multipart/form-data; boundary=${B}` },
      });
    const file = part("file", "f.csv", "a\n1\n", "text/csv");
    const before = await fileRows();
    assert.equal((await send(fields(10) + file)).statusCode, 201);
    for (const n of [11, 19]) {
      const res = await send(fields(n) + file);
      assert.equal(res.statusCode, 413, `${n} fields`);
      assert.equal(res.json().code, "BAD_REQUEST");
    }
    assert.equal((await send(file + fields(30))).statusCode, 201, "fields after the file");
    assert.equal((await send(file + part("x", "b.csv", "b", "text/csv"))).statusCode, 201, "a second file");
    // A part that declares no type is text/plain (RFC 7578's default).
    const untyped = await send(part("file", "n.csv", "a\n"));
    assert.equal(untyped.json().data.contentType, "text/plain");
    assert.equal(await fileRows(), before + 4);
  });

  test("a body that is not multipart → 400", async () => {
    const res = await t.app.inject({
      method: "POST",
      url: "/api/files",
      payload: { file: "x" },
      headers: bearer(alice),
    });
    assert.equal(res.statusCode, 400);
    assert.equal(res.json().code, "VALIDATION_FAILED");
  });

  test("malformed multipart → 400 INVALID_MULTIPART, logged at info, nothing stored", async () => {
    const rows = await fileRows();
    const files = filesOnDisk();
    const { payload } = multipart("file", "a,b\n1,2\n");
    const boundary = /^------assay[0-9a-f]+/.exec(payload.toString())?.[0]?.slice(2) as string;
    const bodies: [string, Record<string, string>, Buffer | string][] = [
      ["no boundary", { "content-type": "multipart/form-data" }, payload],
      [
        "no closing boundary",
        { "content-type": `multipart/form-data; boundary=${boundary}` },
        payload.subarray(0, payload.length - boundary.length - 8),
      ],
      [
        "a body that is not multipart at all",
        { "content-type": `multipart/form-data; boundary=${boundary}` },
        "hello",
      ],
    ];
    for (const [what, headers, body] of bodies) {
      const before = t.logs.length;
      const res = await t.app.inject({
        method: "POST",
        url: "/api/files",
        payload: body,
        headers: { ...bearer(alice), ...headers },
      });
      assert.equal(res.statusCode, 400, `${what}: ${res.body}`);
      assert.equal(res.json().code, "INVALID_MULTIPART", what);
      const lines = t.logs.slice(before);
      assert.ok(!lines.some((l) => (l.level as number) >= 50), `${what}: logged as an error`);
      assert.ok(
        lines.some((l) => l.code === "INVALID_MULTIPART" && l.level === 30),
        `${what}: logged at info`,
      );
    }
    assert.equal(await fileRows(), rows);
    assert.deepEqual(filesOnDisk(), files);
    assert.deepEqual(partials(), []);
  });

  test("without a token → 401 and nothing stored", async () => {
    const rows = await fileRows();
    const { payload, headers } = multipart("file", "a\n1\n");
    const res = await t.app.inject({ method: "POST", url: "/api/files", payload, headers });
    assert.equal(res.statusCode, 401);
    assert.equal(await fileRows(), rows);
  });
});

describe("GET /api/files/:fileId", () => {
  test("owner and admin see it; another user gets 404 FILE_NOT_FOUND", async () => {
    const fileId = (await upload(alice, "a\n1\n")).json().data.fileId;
    assert.equal(
      (await t.app.inject({ url: `/api/files/${fileId}`, headers: bearer(alice) })).statusCode,
      200,
    );
    const byAdmin = await t.app.inject({ url: `/api/files/${fileId}`, headers: bearer(admin) });
    assert.equal(byAdmin.statusCode, 200);
    // Whose it is, for an admin who sees everyone's (the dashboard's Owner column).
    assert.equal(byAdmin.json().data.owner, "alice");
    const listed = await t.app.inject({ url: "/api/files?limit=100", headers: bearer(admin) });
    assert.equal(
      listed.json().data.items.find((f: { fileId: string }) => f.fileId === fileId)?.owner,
      "alice",
    );
    const other = await t.app.inject({ url: `/api/files/${fileId}`, headers: bearer(bob) });
    assert.equal(other.statusCode, 404);
    assert.deepEqual(other.json(), { code: "FILE_NOT_FOUND", message: "The file does not exist." });
  });

  test("missing, non-numeric and absurd ids are 404, never 500", async () => {
    for (const id of [
      "999999999999999",
      "abc",
      "0",
      "-1",
      "1.5",
      "01",
      "9".repeat(40),
      "1%20OR%201=1",
      "%00",
    ]) {
      const res = await t.app.inject({ url: `/api/files/${id}`, headers: bearer(alice) });
      assert.equal(res.statusCode, 404, id);
      assert.equal(res.json().code, "FILE_NOT_FOUND", id);
    }
    // A dot-dot id resolves to another path altogether: still a plain 404.
    const dots = await t.app.inject({ url: "/api/files/%2e%2e", headers: bearer(alice) });
    assert.equal(dots.statusCode, 404);
  });
});

describe("GET /api/files", () => {
  test("own files newest first in pages; an admin sees all; sha256 finds copies; bad queries are 400", async () => {
    const mine: string[] = [];
    for (const c of ["p\n1\n", "q\n2\n", "r\n3\n", "p\n1\n"])
      mine.push((await upload(bob, c)).json().data.fileId);
    const theirs = (await upload(alice, "zzz\n9\n")).json().data.fileId;
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const res: Awaited<ReturnType<typeof t.app.inject>> = await t.app.inject({
        url: `/api/files?limit=3${cursor ? `&cursor=${cursor}` : ""}`,
        headers: bearer(bob),
      });
      assert.equal(res.statusCode, 200);
      const page = res.json().data as { items: { fileId: string }[]; nextCursor: string | null };
      seen.push(...page.items.map((f) => f.fileId));
      cursor = page.nextCursor;
    } while (cursor);
    assert.deepEqual(seen, [...mine].reverse(), "bob's files only, newest first, each once");
    const hash = createHash("sha256").update("p\n1\n").digest("hex");
    const copies = await t.app.inject({ url: `/api/files?sha256=${hash}`, headers: bearer(bob) });
    assert.deepEqual(
      copies.json().data.items.map((f: { fileId: string }) => f.fileId),
      [mine[3], mine[0]],
    );
    const all = await t.app.inject({ url: "/api/files?limit=100", headers: bearer(admin) });
    const ids = all.json().data.items.map((f: { fileId: string }) => f.fileId);
    assert.ok(ids.includes(theirs) && mine.every((id) => ids.includes(id)), "an admin sees everyone's");
    for (const q of ["sha256=xyz", "limit=0", "limit=101", "cursor=abc", "other=1"]) {
      const bad = await t.app.inject({ url: `/api/files?${q}`, headers: bearer(bob) });
      assert.equal(bad.statusCode, 400, q);
      assert.equal(bad.json().code, "VALIDATION_FAILED", q);
    }
    assert.equal((await t.app.inject({ url: "/api/files" })).statusCode, 401);
  });
});
