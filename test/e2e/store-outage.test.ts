// An object store that cannot be reached: `assay all` waits for it at start-up (retrying, saying so),
// `/readyz` answers 503 while it is away and 200 when it is back, the cause is logged — and no line
// the process writes carries the credentials. The bucket is reached through a TCP relay the test opens
// and closes, in front of the S3 test server.
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { freePort } from "../../src/db/embedded.ts";
import { cleanEnv, collect, spawnCli, watch } from "../helpers/cli.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { waitFor } from "../helpers/queue.ts";
import { createTestBucket, type TestBucket } from "../helpers/s3.ts";

/** A relay on `port` to the S3 test server, which can be opened and closed (dropping its connections). */
class Relay {
  private server: net.Server | undefined;
  private readonly sockets = new Set<net.Socket>();
  readonly port: number;
  private readonly target: URL;
  constructor(port: number, target: URL) {
    this.port = port;
    this.target = target;
  }
  async open(): Promise<void> {
    const server = net.createServer((client) => {
      const upstream = net.connect(Number(this.target.port), this.target.hostname);
      for (const s of [client, upstream]) {
        this.sockets.add(s);
        s.on("close", () => this.sockets.delete(s));
        s.on("error", () => {});
      }
      client.pipe(upstream).pipe(client);
    });
    await new Promise<void>((resolve) => server.listen(this.port, "127.0.0.1", resolve));
    this.server = server;
  }
  async close(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const s of this.sockets) s.destroy();
    if (server) await new Promise((resolve) => server.close(resolve));
  }
}

let db: TestDatabase;
let bucket: TestBucket;
let dataDir: string;
let relay: Relay;
let child: ChildProcess | undefined;
let done: Promise<{ stdout: string; stderr: string }> | undefined;

before(async () => {
  db = await createTestDatabase();
  bucket = await createTestBucket();
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-store-outage-"));
  relay = new Relay(await freePort(), new URL(bucket.endpoint));
});
after(async () => {
  child?.kill("SIGKILL");
  await done;
  await relay.close();
  await bucket.drop();
  await db.drop();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

test("start-up waits for the bucket; /readyz follows it away and back; credentials never logged", async () => {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  child = spawnCli(
    ["all", "--concurrency", "1"],
    cleanEnv({
      DATABASE_URL: db.url,
      ASSAY_DATA_DIR: dataDir,
      HOST: "127.0.0.1",
      PORT: String(port),
      LOG_LEVEL: "info",
      ...bucket.env,
      ASSAY_S3_ENDPOINT: `http://127.0.0.1:${relay.port}`,
    }),
  );
  const out = watch(child);
  done = collect(child);

  // Nothing listens on the relay's port yet: the process says it waits, and serves nothing.
  await out.waitFor(/object store unreachable; waiting/);
  await out.waitFor(/object store unreachable; waiting[\s\S]*object store unreachable; waiting/);
  await assert.rejects(fetch(`${base}/healthz`), "no HTTP before the store is reachable");
  assert.doesNotMatch(out.stdout(), /worker started/);

  await relay.open();
  await out.waitFor(/object store reachable/);
  await out.waitFor(/worker started/);
  await waitFor(
    async () => (await fetch(`${base}/readyz`).catch(() => undefined))?.status === 200,
    20_000,
    "ready",
  );

  await relay.close();
  const away = await fetch(`${base}/readyz`);
  assert.equal(away.status, 503);
  assert.deepEqual(await away.json(), { code: "NOT_READY", message: "The object store is unreachable." });
  await out.waitFor(/readiness: object store unreachable/);
  const line = out
    .stdout()
    .split("\n")
    .find((l) => l.includes("readiness: object store unreachable"));
  assert.match(line ?? "", /"err":\{/, "the cause is logged");

  await relay.open();
  await waitFor(async () => (await fetch(`${base}/readyz`)).status === 200, 20_000, "ready again");

  child.kill("SIGTERM");
  const { stdout, stderr } = await done;
  child = undefined;
  // The SDK's credentials come from the environment (test/run.ts sets them); no line carries the
  // secret, nor any signature made with it.
  const secret = process.env.AWS_SECRET_ACCESS_KEY as string;
  assert.ok(secret.length > 0);
  for (const text of [stdout, stderr]) {
    assert.ok(!text.includes(secret), "the secret key reached the output");
    assert.doesNotMatch(text, /Signature=|AWS4-HMAC-SHA256/);
  }
});
