// An upload whose `file` part has a file name holding a line break: busboy drops such a part as if
// it had not been sent, and the upload was refused as one without a `file` part. It is 400
// VALIDATION_FAILED saying what is wrong, and nothing is stored.
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";
import { bearer, startTestApp, type TestApp } from "../helpers/app.ts";

let t: TestApp;
let alice: string;

before(async () => {
  t = await startTestApp();
  alice = await t.token("alice");
});
after(() => t.close());

const BOUNDARY = "----assay-line-breaks";
const LINE_BREAKS = { code: "VALIDATION_FAILED", message: "The file name must not contain line breaks." };
const NO_FILE = { code: "VALIDATION_FAILED", message: "The request must carry a `file` part." };

/** A multipart body of these parts, each its header lines (written as given) and its content. */
function body(parts: { headers: string[]; content: string | Buffer }[]): Buffer {
  const chunks: Buffer[] = [];
  for (const p of parts) {
    chunks.push(Buffer.from(`--${BOUNDARY}\r\n${p.headers.join("\r\n")}\r\n\r\n`, "latin1"));
    chunks.push(Buffer.isBuffer(p.content) ? p.content : Buffer.from(p.content));
    chunks.push(Buffer.from("\r\n"));
  }
  chunks.push(Buffer.from(`--${BOUNDARY}--\r\n`));
  return Buffer.concat(chunks);
}

const upload = (payload: Buffer) =>
  t.app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { "content-type": `multipart/form-data; boundary=${BOUNDARY}`, ...bearer(alice) },
  });

const fileCount = async () => (await t.db.sql<{ n: number }[]>`select count(*)::int as n from files`)[0]?.n;

test("a file name with a line break → 400 saying so; nothing stored", async () => {
  const dispositions = [
    // RFC 5987's encoded name, decoded by busboy: LF, CR, CRLF.
    `Content-Disposition: form-data; name="file"; filename*=UTF-8''a%0Ab.csv`,
    `Content-Disposition: form-data; name="file"; filename*=utf-8''a%0Db.csv`,
    `Content-Disposition: form-data; name="file"; filename*=UTF-8''a%0D%0Ab.csv`,
    // A bare LF or CR sent as it is, in a quoted name or a token.
    `Content-Disposition: form-data; name="file"; filename="a\nb.csv"`,
    `Content-Disposition: form-data; name="file"; filename="a\rb.csv"`,
    `Content-Disposition: form-data; name="file"; filename=a\nb.csv`,
  ];
  for (const disposition of dispositions) {
    const res = await upload(
      body([{ headers: [disposition, "Content-Type: text/csv"], content: "a,b\n1,2\n" }]),
    );
    assert.equal(res.statusCode, 400, `${JSON.stringify(disposition)}: ${res.body}`);
    assert.deepEqual(res.json(), LINE_BREAKS, JSON.stringify(disposition));
  }
  // After form fields, and with the header's fields in another order and case.
  const late = await upload(
    body([
      { headers: [`Content-Disposition: form-data; name="note"`], content: "x".repeat(20_000) },
      {
        headers: [
          "content-type: text/csv",
          `content-disposition: FORM-DATA; filename*=UTF-8''%0A.csv; NAME=file`,
        ],
        content: "a,b\n",
      },
    ]),
  );
  assert.deepEqual(late.json(), LINE_BREAKS);
  assert.equal(await fileCount(), 0);
});

test("no file part, or another part's line break, is still 'must carry a file part'", async () => {
  for (const headers of [
    [`Content-Disposition: form-data; name="note"`],
    // Another field's file name with a line break: not the `file` part.
    [`Content-Disposition: form-data; name="other"; filename*=UTF-8''a%0Ab.csv`],
  ]) {
    const res = await upload(body([{ headers, content: "a\nb" }]));
    assert.equal(res.statusCode, 400, res.body);
    assert.deepEqual(res.json(), NO_FILE, JSON.stringify(headers));
  }
  assert.equal(await fileCount(), 0);
});

test("what busboy keeps is a file as before", async () => {
  const upload1 = async (headers: string[]) => {
    const res = await upload(body([{ headers, content: "a,b\n" }]));
    assert.equal(res.statusCode, 201, res.body);
    return res.json().data.name;
  };
  // Percent escapes in a plain filename are kept as sent (a browser's way to send a line break).
  assert.equal(
    await upload1([`Content-Disposition: form-data; name="file"; filename="a%0Ab.csv"`]),
    "a%0Ab.csv",
  );
  // But %22, a quote as browsers, curl and assay submit send it, is a quote (until 2026-12-07 the
  // name kept %22); a backslash is a name's, but in a Windows path (it was a separator everywhere).
  assert.equal(
    await upload1([`Content-Disposition: form-data; name="file"; filename="report %22final%22 v2.csv"`]),
    'report "final" v2.csv',
  );
  assert.equal(
    await upload1([`Content-Disposition: form-data; name="file"; filename="back\\slash.csv"`]),
    "back\\slash.csv",
  );
  assert.equal(
    await upload1([`Content-Disposition: form-data; name="file"; filename="C:\\Users\\Ann\\data.csv"`]),
    "data.csv",
  );
  // A UNC path, as an old browser sent it (the parser reads its leading \\ as one backslash).
  assert.equal(
    await upload1([`Content-Disposition: form-data; name="file"; filename="\\\\server\\share\\data.csv"`]),
    "data.csv",
  );
  // Escaped as assay submit sends them (quoted()): two backslashes and one, as they were.
  assert.equal(
    await upload1([`Content-Disposition: form-data; name="file"; filename="a\\\\\\\\b x\\\\.csv"`]),
    "a\\\\b x\\.csv",
  );
  // Beside a plain filename, filename* is not read.
  assert.equal(
    await upload1([
      `Content-Disposition: form-data; name="file"; filename="ab.csv"; filename*=UTF-8''a%0Ab.csv`,
    ]),
    "ab.csv",
  );
  // A line break in a later header of the part, not in its Content-Disposition.
  assert.equal(
    await upload1([`Content-Disposition: form-data; name="file"; filename="ab.csv"`, "X-Note: a\nb"]),
    "ab.csv",
  );
});

test("over a real connection, the answer comes and the connection carries the next request", async () => {
  await t.app.listen({ port: 0, host: "127.0.0.1" });
  const port = (t.app.server.address() as net.AddressInfo).port;
  const payload = body([
    {
      headers: [`Content-Disposition: form-data; name="file"; filename*=UTF-8''a%0Ab.csv`],
      content: Buffer.alloc(256 * 1024, "1,2\n"),
    },
  ]);
  const socket = net.connect(port, "127.0.0.1");
  let received = "";
  socket.setEncoding("latin1");
  socket.on("data", (d: string) => {
    received += d;
  });
  const head = (length: number) =>
    `POST /api/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${alice}\r\n` +
    `Content-Type: multipart/form-data; boundary=${BOUNDARY}\r\nContent-Length: ${length}\r\n\r\n`;
  socket.write(head(payload.length));
  socket.write(payload);
  socket.write(`GET /api/me HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${alice}\r\n\r\n`);
  await new Promise<void>((resolve, reject) => {
    const check = () => {
      if (/HTTP\/1\.1 200 [\s\S]*"name":"alice"/.test(received)) resolve();
    };
    socket.on("data", check);
    socket.on("error", reject);
    socket.on("close", () => reject(new Error(`closed: ${received}`)));
  });
  socket.destroy();
  assert.match(received, /^HTTP\/1\.1 400 /);
  assert.ok(received.includes(JSON.stringify(LINE_BREAKS)), received);
});
