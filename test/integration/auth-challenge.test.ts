// Every 401 of the API carries `WWW-Authenticate: Bearer realm="assay"` (RFC 9110 §11.6.1 requires a
// challenge with a 401; RFC 6750 §3), the same for every cause. Over a real socket: Node's own parser
// sees the headers, repeated and hostile ones included.
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { tokenCreate, tokenRevoke } from "../../src/auth/tokens.ts";
import { BEARER_CHALLENGE } from "../../src/http/auth.ts";
import { startTestApp, type TestApp } from "../helpers/app.ts";
import { waitFor } from "../helpers/queue.ts";

let t: TestApp;
let port: number;
before(async () => {
  t = await startTestApp();
  await t.app.listen({ host: "127.0.0.1", port: 0 });
  port = (t.app.server.address() as AddressInfo).port;
});
after(() => t.close());

interface Answer {
  status: number;
  challenge: string | undefined;
  body: string;
}

/** A request with these raw header lines (a name may repeat; Node adds no Host to raw lines). */
function request(path: string, headers: [string, string][], method = "GET"): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: "127.0.0.1", port, path, method, headers: [["host", `127.0.0.1:${port}`], ...headers].flat() },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => (body += c));
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 0, challenge: res.headers["www-authenticate"], body }),
        );
      },
    );
    req.on("error", reject);
    req.end();
  });
}

const UNAUTHORIZED = { code: "UNAUTHORIZED", message: "A valid bearer token is required." };

test("every 401, whatever its cause, carries the same Bearer challenge and envelope", async () => {
  const live = await tokenCreate(t.db.sql, "Zoë «admin»\u202e");
  const revoked = await tokenCreate(t.db.sql, "Zoë «admin»\u202e");
  assert.equal(await tokenRevoke(t.db.sql, revoked.tokenId), true);
  const cases: [string, [string, string][]][] = [
    ["missing", []],
    ["empty", [["authorization", ""]]],
    ["the scheme alone", [["authorization", "Bearer"]]],
    ["Basic", [["authorization", `Basic ${Buffer.from("alice:secret").toString("base64")}`]]],
    ["a tab for the space", [["authorization", `Bearer\t${live.token}`]]],
    ["two tokens", [["authorization", `Bearer ${live.token} ${live.token}`]]],
    ["non-ASCII", [["authorization", `Bearer assay_${"ü".repeat(43)}`]]],
    ["very long", [["authorization", `Bearer assay_${"A".repeat(12_000)}`]]],
    ["unknown", [["authorization", `Bearer assay_${"A".repeat(43)}`]]],
    ["revoked", [["authorization", `Bearer ${revoked.token}`]]],
    [
      "sent twice",
      [
        ["authorization", `Bearer ${live.token}`],
        ["authorization", `Bearer ${live.token}`],
      ],
    ],
  ];
  for (const [what, headers] of cases) {
    for (const method of ["GET", "POST"]) {
      const url = method === "GET" ? "/api/me" : "/api/analysis-tasks/100000007/cancel";
      const res = await request(url, headers, method);
      assert.equal(res.status, 401, `${what} (${method})`);
      assert.equal(res.challenge, BEARER_CHALLENGE, `${what} (${method})`);
      assert.deepEqual(JSON.parse(res.body), UNAUTHORIZED, `${what} (${method})`);
    }
  }
  // A token that authenticates gets no challenge, on a success or an error alike.
  for (const url of ["/api/me", "/api/analysis-tasks/100000007"]) {
    const res = await request(url, [["authorization", `bearer  ${live.token}`]]);
    assert.notEqual(res.status, 401, url);
    assert.equal(res.challenge, undefined, url);
  }
});

test("a token revoked while it is cached: its first 401 carries the challenge too", async () => {
  const created = await tokenCreate(t.db.sql, "リナ");
  const auth: [string, string][] = [["authorization", `Bearer ${created.token}`]];
  assert.equal((await request("/api/me", auth)).status, 200);
  assert.equal((await request("/api/me", auth)).status, 200, "from the cache");
  assert.equal(await tokenRevoke(t.db.sql, created.tokenId), true);
  const refused = await waitFor(
    async () => {
      const res = await request("/api/me", auth);
      return res.status === 401 ? res : undefined;
    },
    5_000,
    "the revoked token to be refused",
  );
  assert.equal(refused.challenge, BEARER_CHALLENGE);
});
