// `assay download` (the real client, a child process) against a server whose output body never ends:
// a broken proxy or server streaming past the size the API lists for the file. The client stops it at
// that size — not after filling the disk, not never — with exit 3, and leaves no file behind. The
// server is the test's own: the fault is what matters, and a real API does not make it.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { cleanEnv, collect, spawnCli } from "../helpers/cli.ts";
import { jsonLines, ofKind, within } from "../helpers/client.ts";

const work = fs.mkdtempSync(path.join(os.tmpdir(), "assay-client-endless-"));
after(() => fs.rmSync(work, { recursive: true, force: true }));

const TASK = "1000000000";
const RUN = "9999999999";
const OUTPUT = "données sans fin.csv";
const LISTED = 100_000;

test("an output body that runs past its listed size is stopped there: exit 3, no file, not tried again", async () => {
  const task = {
    taskId: TASK,
    status: "succeeded",
    analysisType: "summary",
    totalCount: 1,
    succeededCount: 1,
    failedCount: 0,
    timedOutCount: 0,
    cancelledCount: 0,
    createdAt: "2026-12-06T00:00:00.000Z",
    finishedAt: "2026-12-06T00:00:01.000Z",
  };
  const ok = (data: unknown) => JSON.stringify({ code: "OK", message: "OK", data });
  let sent = 0;
  let bodies = 0;
  let closed = false;
  const server = http.createServer((req, res) => {
    const url = req.url ?? "";
    res.setHeader("content-type", "application/json");
    if (url === `/api/analysis-tasks/${TASK}`) return res.end(ok(task));
    if (url.startsWith(`/api/analysis-tasks/${TASK}/runs?`))
      return res.end(
        ok({ items: [{ runId: RUN, fileName: "entrée ✓.csv", status: "succeeded" }], nextCursor: null }),
      );
    if (url === `/api/analysis-tasks/${TASK}/runs/${RUN}/outputs`)
      return res.end(ok({ items: [{ name: OUTPUT, sizeBytes: LISTED }] }));
    // The output: chunked, without end, for as long as the client reads.
    bodies++;
    res.writeHead(200, { "content-type": "text/csv" });
    const chunk = Buffer.alloc(64 * 1024, "x");
    const pump = () => {
      while (!closed && res.write(chunk)) sent += chunk.length;
      if (!closed) res.once("drain", pump);
    };
    res.on("close", () => {
      closed = true;
    });
    pump();
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const out = path.join(work, "sortie");
  const child = spawnCli(
    ["download", TASK, "--out", out],
    cleanEnv({ ASSAY_URL: url, ASSAY_TOKEN: "assay_test" }),
  );
  try {
    const r = await within(
      collect(child),
      30_000,
      "assay download of an endless body",
      () => `sent ${sent} bytes`,
    );
    assert.equal(r.code, 3, r.stderr);
    const [error] = ofKind(jsonLines(r.stdout), "error");
    assert.equal(error?.code, "CONNECTION_FAILED", r.stdout);
    assert.match(
      String(error?.message),
      new RegExp(`${OUTPUT} of run ${RUN}: received more than its ${LISTED} bytes`),
    );
    assert.equal(bodies, 1, "not tried again");
    const files = (fs.readdirSync(out, { recursive: true }) as string[]).filter((p) =>
      fs.statSync(path.join(out, p)).isFile(),
    );
    assert.deepEqual(files, [], "neither the output nor its temporary file");
  } finally {
    child.kill("SIGKILL");
    server.closeAllConnections();
    server.close();
  }
});
