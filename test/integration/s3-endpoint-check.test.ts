// The store's check (start-up and /readyz) must tell an S3 API from anything else at the endpoint: a
// MinIO console's port (9001 beside the API's 9000) or a proxy's default site answers every request
// with a 200 page. HeadBucket took that for a bucket: the service started, uploads were answered 201
// while their bytes went nowhere (a PutObject's 200 has no body to read), and every run read the page
// as its input.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, test } from "node:test";
import { S3Store } from "../../src/storage/s3.ts";
import { startTestApp } from "../helpers/app.ts";
import { createTestBucket, type TestBucket } from "../helpers/s3.ts";

const PAGE =
  '<!doctype html><html lang="en"><head><title>MinIO Console</title></head><body><div id="root"></div></body></html>';

let page: http.Server;
let pageUrl: string;
let bucket: TestBucket;
const opened: S3Store[] = [];

before(async () => {
  bucket = await createTestBucket();
  // Answers everything, as a single-page app's server does: 200 and its page, HEAD included.
  page = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(200, {
        "content-type": "text/html; charset=utf-8",
        "content-length": Buffer.byteLength(PAGE),
      });
      res.end(req.method === "HEAD" ? undefined : PAGE);
    });
  });
  await new Promise<void>((resolve) => page.listen(0, "127.0.0.1", resolve));
  pageUrl = `http://127.0.0.1:${(page.address() as { port: number }).port}`;
});
after(async () => {
  for (const s of opened) s.client.destroy();
  page.closeAllConnections();
  await new Promise((resolve) => page.close(resolve));
  await bucket.drop();
});

const store = (o: Partial<ConstructorParameters<typeof S3Store>[0]>) => {
  const s = new S3Store({ bucket: bucket.name, endpoint: bucket.endpoint, forcePathStyle: true, ...o });
  opened.push(s);
  return s;
};

test("an endpoint that answers every request with a web page is not taken for the bucket", async () => {
  for (const forcePathStyle of [true, false]) {
    await assert.rejects(store({ endpoint: pageUrl, forcePathStyle }).check(), (err: Error) => {
      assert.match(err.message, /did not answer as an S3 service/);
      assert.ok(err.message.includes(pageUrl), "it says where it looked");
      assert.match(err.message, /ASSAY_S3_ENDPOINT/);
      return true;
    });
  }
  // The real bucket passes, with and without a prefix, empty or not.
  await store({}).check();
  const prefixed = store({ prefix: "tenant-7/" });
  await prefixed.check();
  await prefixed.putFile("files/1000000", new URL(import.meta.url).pathname);
  await prefixed.check();
});

test("/readyz stays 503 while the endpoint is a web page, and the cause is logged", async () => {
  const t = await startTestApp({ ...bucket.env, ASSAY_S3_ENDPOINT: pageUrl });
  try {
    const res = await t.app.inject({ method: "GET", url: "/readyz" });
    assert.equal(res.statusCode, 503);
    assert.deepEqual(res.json(), { code: "NOT_READY", message: "The object store is unreachable." });
    const line = t.logs.find((l) => String(l.msg).includes("object store unreachable"));
    assert.match(JSON.stringify(line?.err), /did not answer as an S3 service/);
  } finally {
    (t.storage as S3Store).client.destroy();
    await t.close();
  }
});

test("no region anywhere is said in words that name the setting", async () => {
  const saved = { AWS_REGION: process.env.AWS_REGION, AWS_CONFIG_FILE: process.env.AWS_CONFIG_FILE };
  const savedImds = process.env.AWS_EC2_METADATA_DISABLED;
  delete process.env.AWS_REGION;
  process.env.AWS_CONFIG_FILE = "/nonexistent/assay-test-aws-config";
  process.env.AWS_EC2_METADATA_DISABLED = "true";
  try {
    await assert.rejects(store({}).check(), /set ASSAY_S3_REGION/);
  } finally {
    for (const [k, v] of Object.entries({ ...saved, AWS_EC2_METADATA_DISABLED: savedImds })) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
});
