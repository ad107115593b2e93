// The logger's redaction (src/log.ts): secrets never reach a log line, wherever they sit in the object.
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { test } from "node:test";
import { createLogger, loggedUrl } from "../../src/log.ts";

function capture() {
  const lines: string[] = [];
  const destination = new Writable({
    write(chunk, _encoding, done) {
      lines.push(String(chunk));
      done();
    },
  });
  return { lines, destination };
}

test("an error from parsing DATABASE_URL is logged without the URL it carries (Node's err.input)", () => {
  const { lines, destination } = capture();
  const logger = createLogger({ level: "info", destination });
  // An unescaped `#` in the password: the URL parser fails, and its error holds the whole URL.
  let parseError: unknown;
  try {
    new URL("postgres://assay:S3cr#tPw@127.0.0.1:5432/assay");
  } catch (err) {
    parseError = err;
  }
  assert.equal(
    (parseError as { input?: string }).input?.includes("S3cr"),
    true,
    "the premise: it carries the URL",
  );
  logger.error({ err: parseError }, "start-up failed");
  logger.error({ err: new Error("could not connect", { cause: parseError }) }, "start-up failed");
  assert.equal(lines.length, 2);
  for (const line of lines) assert.ok(!line.includes("S3cr"), line);
  assert.match(lines[0] as string, /ERR_INVALID_URL/, "the error itself is still logged");
});

test("a view link's path is logged without its capability; other paths as they are", () => {
  for (const url of [
    "/view/1.2.3.4.sig/out.json",
    "/view/1.2.3.4.sig",
    "//view/1.2.3.4.sig/a/b/",
    "/VIEW/1.2.3.4.sig/x",
    "/view/1.2.3.4.sig/%zz?x=1",
    "/view/1.2.3.4.sig/a\nb",
    // Escaped as the router decodes it: these reach the view route too.
    "/%76iew/1.2.3.4.sig/x/",
    "/%56%49EW/1.2.3.4.sig/%zz",
    // Hidden from the router, no route (logged at info), the link as good as ever: a dot segment after
    // another, a parameter on one, escapes escaped again.
    "/a/../view/1.2.3.4.sig/x",
    "/api/../view/1.2.3.4.sig/x",
    "/.;x/view/1.2.3.4.sig",
    "/view%252F1.2.3.4.sig/x",
    "/%252e%252e/view/1.2.3.4.sig",
  ])
    assert.equal(loggedUrl(url), "/view/[redacted]", url);
  for (const url of ["/api/files", "/viewer/x", "/api/view/1", "/", "/api/files/../../x"])
    assert.equal(loggedUrl(url), url);
});

test("a query value whose name says it holds a secret is not logged; the others are", () => {
  for (const [url, logged] of [
    ["/api/files?access_token=assay_S3CRET", "/api/files?access_token=[redacted]"],
    ["/api/files?limit=5&token=assay_S3CRET&cursor=9", "/api/files?limit=5&token=[redacted]&cursor=9"],
    [
      "/api/x?API_KEY=k&X-Amz-Signature=abc#frag",
      "/api/x?API_KEY=[redacted]&X-Amz-Signature=[redacted]#frag",
    ],
    ["/api/x?password=&session_id=s", "/api/x?password=[redacted]&session_id=[redacted]"],
    ["/api/analysis-tasks?status=queued&limit=20", "/api/analysis-tasks?status=queued&limit=20"],
    ["/api/files?keyword", "/api/files?keyword"],
    // Names as the server decodes them; more spellings of a secret.
    ["/api/x?access_%74oken=abc&a=1", "/api/x?access_%74oken=[redacted]&a=1"],
    ["/api/x?sig=s&pwd=p&jwt=j&bad%zz=1", "/api/x?sig=[redacted]&pwd=[redacted]&jwt=[redacted]&bad%zz=1"],
  ] as const)
    assert.equal(loggedUrl(url), logged, url);
});

test("S3's echoed credentials are censored at any depth of a logged error, and the caller's error is left as it was", () => {
  const { lines, destination } = capture();
  const logger = createLogger({ level: "info", destination });
  const s3Error = () =>
    Object.assign(new Error("The request signature we calculated does not match"), {
      name: "SignatureDoesNotMatch",
      AWSAccessKeyId: "AKIAS3CRETKEYID00001",
      SignatureProvided: "S3CRET-signature",
      CanonicalRequest: "GET\n/b/k\n\nx-amz-security-token:S3CRET-session\n",
      "Token-0": "S3CRET-session-2",
      $metadata: { httpStatusCode: 403 },
    });
  const inner = s3Error();
  const holder = { attempt: 2, last: s3Error() };
  const errors = [
    new AggregateError([s3Error(), new Error("other")], "every part failed"),
    Object.assign(new Error("upload failed"), { failure: inner }),
    Object.assign(new Error("sweep failed"), { detail: holder }),
    Object.assign(new Error("batch failed"), { list: [{ nested: { deeper: s3Error() } }] }),
  ];
  for (const err of errors) logger.error({ err }, "store request failed");
  assert.equal(lines.length, errors.length);
  for (const line of lines) {
    assert.doesNotMatch(line, /S3CRET|AKIA/, line);
    assert.match(line, /\[redacted\]/, "the fields are there, censored");
  }
  assert.match(lines[0] as string, /SignatureDoesNotMatch/, "the inner error is still logged");
  assert.match(lines[1] as string, /"httpStatusCode":403/, "what is not a secret is kept");
  // Censored in copies: the objects the caller holds still have their fields.
  assert.equal(inner.AWSAccessKeyId, "AKIAS3CRETKEYID00001");
  assert.equal(holder.last.SignatureProvided, "S3CRET-signature");
});

test("a secret reached twice (a shared reference), deeper than the scrub looks, or in another case is never logged", () => {
  const { lines, destination } = capture();
  const logger = createLogger({ level: "info", destination });
  const creds = { user: "assay", password: "S3CRET-hunter2" };
  const details = { token: "S3CRET-token-1" };
  const shared = new Error("inner");
  Object.assign(shared, { details });
  let deep: Record<string, unknown> = { password: "S3CRET-deep" };
  for (let i = 0; i < 12; i++) deep = { next: deep };
  const cyclic: Record<string, unknown> = { Authorization: "Bearer S3CRET-auth" };
  cyclic.self = cyclic;
  const errors = [
    Object.assign(new Error("retry failed"), { options: creds, retry: { lastOptions: creds } }),
    new AggregateError([shared, shared], "both failed"),
    Object.assign(new Error("deep"), { chain: deep }),
    Object.assign(new Error("cased"), { request: cyclic, Password: "S3CRET-cased" }),
  ];
  for (const err of errors) logger.error({ err }, "failed");
  assert.equal(lines.length, errors.length);
  for (const line of lines) assert.doesNotMatch(line, /S3CRET/, line);
  assert.match(lines[2] as string, /\[truncated\]/);
  assert.equal(creds.password, "S3CRET-hunter2", "the caller's objects are left as they were");
});
