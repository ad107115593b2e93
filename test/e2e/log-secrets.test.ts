// What a real `assay api` writes when secrets come its way: a request Node's parser refuses (its raw
// bytes hold the Authorization header and the path), and S3 refusing the credentials (its error body
// echoes them) — no line carries the bearer token, a view link, an access key id, a signature or a
// session token. Everything the process prints is searched, with logged byte buffers decoded.
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import http from "node:http";
import type { AddressInfo } from "node:net";
import net from "node:net";
import { after, before, test } from "node:test";
import { freePort } from "../../src/db/embedded.ts";
import { cleanEnv, collect, runCli, spawnCli, watch } from "../helpers/cli.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { scratchDir } from "../helpers/tmp.ts";

let db: TestDatabase;
const running = new Set<ChildProcess>();
before(async () => {
  db = await createTestDatabase();
});
after(async () => {
  for (const child of running) child.kill("SIGKILL");
  await db.drop();
});

/** `assay api` on a port of its own, with a token made for a user with a hostile name. */
async function startApi(extra: Record<string, string>) {
  const port = await freePort();
  const env = cleanEnv({
    DATABASE_URL: db.url,
    ASSAY_DATA_DIR: scratchDir("assay-log-secrets-"),
    HOST: "127.0.0.1",
    PORT: String(port),
    ...extra,
  });
  const made = await runCli(["token", "create", "--user", "Zoë O'Brien‮ <b>"], env);
  assert.equal(made.code, 0, made.stderr);
  const token = made.stdout.trim().split("\n").at(-1) as string;
  assert.match(token, /^assay_/);
  const child = spawnCli(["api"], env);
  running.add(child);
  const out = watch(child);
  const done = collect(child);
  await out.waitFor(/Server listening/, 60_000);
  return {
    port,
    token,
    /** Stops the process; all it printed, byte buffers in log lines decoded to their text. */
    stop: async () => {
      child.kill("SIGTERM");
      const { code, stdout, stderr } = await done;
      running.delete(child);
      assert.equal(code, 0, stderr);
      return decodeBuffers(`${stdout}\n${stderr}`);
    },
  };
}

/** A Buffer serialised into JSON (`{"type":"Buffer","data":[71,69,…]}`) as the text it holds. */
function decodeBuffers(text: string): string {
  return text.replace(/\{"type":"Buffer","data":\[([\d,]*)\]\}/g, (_, bytes: string) =>
    Buffer.from(bytes ? bytes.split(",").map(Number) : []).toString("latin1"),
  );
}

/** Sends `request` as it is on a socket of its own; resolves with the answer once the server closes. */
function sendRaw(port: number, request: string): Promise<string> {
  return new Promise((resolve) => {
    let answer = "";
    const socket = net.connect(port, "127.0.0.1", () => socket.write(request));
    socket.on("data", (chunk: Buffer) => {
      answer += chunk.toString();
    });
    socket.on("error", () => {});
    socket.on("close", () => resolve(answer));
  });
}

test("a request Node's parser refuses is logged without its raw bytes: no bearer token or view link, even at trace", async () => {
  const api = await startApi({ LOG_LEVEL: "trace" });
  const link = "1000000.9999999.10000000.1796570000.S3CRET-link-mac";
  const auth = `Authorization: Bearer ${api.token}\r\n`;
  for (const [request, status] of [
    // A head over Node's limit (431), a chunk size that is not hex, a header name with a space (400).
    [`GET /api/files HTTP/1.1\r\nHost: x\r\n${auth}X-Pad: ${"a".repeat(20_000)}\r\n\r\n`, 431],
    [
      `POST /view/${link}/r%C3%A9sum%C3%A9.html HTTP/1.1\r\nHost: x\r\n${auth}Transfer-Encoding: chunked\r\n\r\nZZZ\r\n`,
      400,
    ],
    [`GET /api/files HTTP/1.1\r\nHost: x\r\n${auth}Bad Header: x\r\n\r\n`, 400],
  ] as const) {
    const answer = await sendRaw(api.port, request);
    assert.match(answer, new RegExp(`^HTTP/1.1 ${status} `), answer);
    assert.ok(answer.includes('"code":"BAD_REQUEST"'), answer);
  }
  const output = await api.stop();
  // The refusals are logged (at trace), with what Node said of them.
  for (const code of ["HPE_HEADER_OVERFLOW", "HPE_INVALID_CHUNK_SIZE", "HPE_INVALID_HEADER_TOKEN"])
    assert.ok(output.includes(code), `${code} is not logged`);
  assert.ok(!output.includes(api.token), "the bearer token reached the output");
  assert.ok(!output.includes("S3CRET-link-mac"), "the view link reached the output");
});

test("a view or download link in a path no route matches is logged as /view/[redacted], however the path hides it", async () => {
  const api = await startApi({ LOG_LEVEL: "info" });
  const link = "1000000.9999999.10000000.1796570000.S3CRET-link-mac";
  const paths = [
    `/./view/${link}/r%C3%A9sum%C3%A9.html`,
    `/view%2F${link}/report.html`,
    `/view;v=1/${link}/report.html`,
    `/view/download/${link}/%D0%BE%D1%82%D1%87%D1%91%D1%82.zip/`,
    `/%2E/%76iew/${link}/x.html`,
  ];
  for (const target of paths) {
    const answer = await sendRaw(
      api.port,
      `GET ${target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${api.token}\r\nConnection: close\r\n\r\n`,
    );
    assert.match(answer, /^HTTP\/1.1 404 /, `${target}: ${answer}`);
  }
  const output = await api.stop();
  const logged = output.split("\n").filter((l) => l.includes('"msg":"incoming request"'));
  assert.equal(logged.filter((l) => l.includes('"url":"/view/[redacted]"')).length, paths.length, output);
  assert.ok(!output.includes("S3CRET-link-mac"), "the link reached the output");
  assert.ok(!output.includes(api.token), "the bearer token reached the output");
});

/**
 * An S3 endpoint that lists the bucket (start-up's and /readyz's check pass) and refuses every other
 * request as AWS S3 refuses credentials, its error body echoing them — what a key deactivated or a
 * session token expired while the service runs gets. Records what each request carried.
 */
async function refusingS3(bucket: string) {
  const seen = { signatures: [] as string[] };
  const refusals = ["SignatureDoesNotMatch", "ExpiredToken", "InvalidAccessKeyId"];
  let n = 0;
  const server = http.createServer((req, res) => {
    req.resume();
    const url = new URL(req.url ?? "/", "http://s3");
    if (req.method === "GET" && url.searchParams.get("list-type") === "2") {
      res
        .writeHead(200, { "content-type": "application/xml" })
        .end(
          `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>${bucket}</Name><Prefix></Prefix><KeyCount>0</KeyCount><MaxKeys>1</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>`,
        );
      return;
    }
    const authorization = String(req.headers.authorization ?? "");
    const keyId = /Credential=([^/]+)\//.exec(authorization)?.[1] ?? "";
    const signature = /Signature=([0-9a-f]+)/.exec(authorization)?.[1] ?? "";
    const sessionToken = String(req.headers["x-amz-security-token"] ?? "");
    seen.signatures.push(signature);
    const code = refusals[n++ % refusals.length];
    const fields =
      code === "SignatureDoesNotMatch"
        ? `<Message>The request signature we calculated does not match the signature you provided. Check your key and signing method.</Message><AWSAccessKeyId>${keyId}</AWSAccessKeyId><StringToSign>AWS4-HMAC-SHA256\n20261206T000000Z\n20261206/us-east-1/s3/aws4_request\n0123</StringToSign><SignatureProvided>${signature}</SignatureProvided><StringToSignBytes>41 57 53</StringToSignBytes><CanonicalRequest>${req.method}\n${url.pathname}\n\nhost:${req.headers.host}\nx-amz-security-token:${sessionToken}\n\nhost;x-amz-security-token\nUNSIGNED-PAYLOAD</CanonicalRequest><CanonicalRequestBytes>50 55 54</CanonicalRequestBytes>`
        : code === "ExpiredToken"
          ? `<Message>The provided token has expired.</Message><Token-0>${sessionToken}</Token-0>`
          : `<Message>The AWS Access Key Id you provided does not exist in our records.</Message><AWSAccessKeyId>${keyId}</AWSAccessKeyId>`;
    res
      .writeHead(403, { "content-type": "application/xml" })
      .end(
        `<?xml version="1.0" encoding="UTF-8"?><Error><Code>${code}</Code>${fields}<RequestId>REQ1</RequestId><HostId>HOST1</HostId></Error>`,
      );
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    endpoint: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

test("S3 refusing the credentials is logged without the key id, signature, canonical request or session token it echoes", async () => {
  const bucket = "assay-refusing";
  const s3 = await refusingS3(bucket);
  const keyId = "AKIAS3CRETKEYID00001";
  const secret = "S3CRET-access-key-wJalrXUtnFEMI";
  const sessionToken = "S3CRET-session-FwoGZXIvYXdzEJr";
  try {
    const api = await startApi({
      LOG_LEVEL: "info",
      ASSAY_STORAGE: "s3",
      ASSAY_S3_BUCKET: bucket,
      ASSAY_S3_ENDPOINT: s3.endpoint,
      ASSAY_S3_FORCE_PATH_STYLE: "true",
      ASSAY_S3_REGION: "us-east-1",
      AWS_ACCESS_KEY_ID: keyId,
      AWS_SECRET_ACCESS_KEY: secret,
      AWS_SESSION_TOKEN: sessionToken,
    });
    // One upload for each refusal: each is the store's failure, a 500 with the envelope and nothing of it.
    for (let i = 0; i < 3; i++) {
      const form = new FormData();
      form.append("file", new Blob(["a,b\n1,2\n"]), `отчёт ${i} ‮gpj.csv`);
      const res = await fetch(`http://127.0.0.1:${api.port}/api/files`, {
        method: "POST",
        headers: { authorization: `Bearer ${api.token}` },
        body: form,
      });
      assert.equal(res.status, 500);
      assert.deepEqual(await res.json(), {
        code: "INTERNAL_ERROR",
        message: "An internal error occurred.",
      });
    }
    const output = await api.stop();
    assert.ok(s3.seen.signatures.length >= 3, "every upload reached the store");
    // The failures are logged, with S3's code.
    for (const code of ["SignatureDoesNotMatch", "ExpiredToken", "InvalidAccessKeyId"])
      assert.ok(output.includes(code), `${code} is not logged`);
    for (const [what, value] of [
      ["the access key id", keyId],
      ["the secret access key", secret],
      ["the session token", sessionToken],
      ["the bearer token", api.token],
      ...s3.seen.signatures.filter(Boolean).map((s) => ["a signature", s] as const),
    ])
      assert.ok(!output.includes(value), `${what} reached the output`);
  } finally {
    await s3.close();
  }
});
