// Answers no `onResponse` hook sees are counted in assay_http_request_duration_seconds all the same,
// under the route label of any request no route matched (`unmatched`), never their path: a URL the
// router cannot decode (answered by the framework-errors handler) and Node's 417 for an unknown
// `Expect`. What Node's parser refuses before there is a request (not HTTP, a head too large) is not a
// request and is not counted. Over raw sockets: `inject` skips Node's parser and the server's events.
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import net from "node:net";
import { after, before, test } from "node:test";
import { startTestApp, type TestApp } from "../helpers/app.ts";
import { waitFor } from "../helpers/queue.ts";

let t: TestApp;
let port: number;

before(async () => {
  t = await startTestApp();
  await t.app.listen({ port: 0, host: "127.0.0.1" });
  port = (t.app.server.address() as AddressInfo).port;
});
after(() => t.close());

/** Sends `request` as it is on a connection of its own; resolves with what came back once it closed. */
function exchange(request: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    let out = "";
    const limit = setTimeout(() => reject(new Error(`still open after 10 s; received ${out}`)), 10_000);
    socket.on("data", (d: Buffer) => {
      out += d.toString("latin1");
    });
    socket.on("error", () => {});
    socket.on("close", () => {
      clearTimeout(limit);
      resolve(out);
    });
    socket.write(request);
  });
}

/** The request counts of the duration histogram, by `method route status`. */
async function counts(): Promise<Map<string, number>> {
  const res = await t.app.inject({ url: "/metrics" });
  assert.equal(res.statusCode, 200);
  const found = new Map<string, number>();
  for (const m of res.body.matchAll(
    /^assay_http_request_duration_seconds_count\{method="([^"]*)",route="([^"]*)",status_code="(\d+)"\} (\d+)$/gm,
  ))
    found.set(`${m[1]} ${m[2]} ${m[3]}`, Number(m[4]));
  return found;
}

const SECRET = "s3cr3t-path-part";

test("a URL the router cannot decode is counted as an unmatched request, its path nowhere in the labels", async () => {
  const before = await counts();
  const was = before.get("GET unmatched 400") ?? 0;
  for (const target of [`/%zz/${SECRET}`, `/view/%E0%A4%A/${SECRET}`]) {
    const answer = await exchange(`GET ${target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
    assert.match(answer, /^HTTP\/1\.1 400 /, answer);
    assert.match(answer, /"code":"BAD_REQUEST"/);
  }
  const after = await waitFor(
    async () => {
      const c = await counts();
      return (c.get("GET unmatched 400") ?? 0) === was + 2 ? c : undefined;
    },
    10_000,
    "both refusals counted",
  );
  for (const key of after.keys()) assert.ok(!key.includes(SECRET) && !key.includes("%"), key);
  // Its duration is observed too (the sum moved), in the same series.
  const res = await t.app.inject({ url: "/metrics" });
  assert.match(
    res.body,
    /^assay_http_request_duration_seconds_bucket\{le="\+Inf",method="GET",route="unmatched",status_code="400"\} \d+$/m,
  );
});

test("an unknown Expect (Node's 417, before Fastify) is counted; a request Node's parser refuses is not", async () => {
  const was = (await counts()).get("PUT unmatched 417") ?? 0;
  const answer = await exchange(
    "PUT /api/files HTTP/1.1\r\nHost: x\r\nExpect: fancy\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
  );
  assert.match(answer, /^HTTP\/1\.1 417 /, answer);
  await waitFor(
    async () => ((await counts()).get("PUT unmatched 417") ?? 0) === was + 1,
    10_000,
    "the 417 counted",
  );

  // Not HTTP at all: Node's parser answers 400 from the clientError handler; there was no request.
  const total = async () => [...(await counts()).values()].reduce((a, b) => a + b, 0);
  const beforeGarbage = await total();
  const garbage = await exchange("NOT HTTP\r\n\r\n");
  assert.match(garbage, /^HTTP\/1\.1 400 /, garbage);
  // A request counted after it: the counts are read once that one is in, so nothing is pending.
  await exchange("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  await waitFor(async () => (await total()) === beforeGarbage + 1, 10_000, "the /healthz counted");
});

test("a request refused by a hook before routing (no Host) is counted, as it always was", async () => {
  const was = (await counts()).get("GET /healthz 400") ?? 0;
  const answer = await exchange("GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n");
  assert.match(answer, /^HTTP\/1\.1 400 /, answer);
  await waitFor(
    async () => ((await counts()).get("GET /healthz 400") ?? 0) === was + 1,
    10_000,
    "the 400 counted",
  );
});
