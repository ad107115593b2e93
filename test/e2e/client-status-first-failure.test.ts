// `assay status` asks for the task and its runs side by side (the real client, a child process, against
// a real `assay all` behind a small proxy): when one of the two fails for good while the other waits
// out its retries (a gateway's 502 for it), the other is stopped and the command ends at once with the
// first failure — not ~15 s later, when the other's retries have run out.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { apiProxy, client, clientSuite, csv, jsonLines, type Line, ofKind } from "../helpers/client.ts";

let taskId: string;

const suite = clientSuite({
  user: "ingrid «état» ✓",
  scratch: "assay-client-status-",
  ids: { tasks: 0, runs: 1 },
  setup: async () => {
    const dir = suite.work;
    fs.writeFileSync(path.join(dir, "relevé \u202efdp.csv"), csv(20, 3));
    const r = await client(["submit", "--type", "summary", dir], suite.env());
    assert.equal(r.code, 0, r.stderr);
    taskId = String(ofKind(jsonLines(r.stdout), "task")[0]?.taskId);
  },
});

type Answer = [status: number, type: string, body: string];

const BAD_GATEWAY: Answer = [502, "text/html", "<html><body><h1>502 Bad Gateway</h1>nginx</body></html>"];

/** A proxy in front of the server answering the GETs `answer` picks itself; it counts every request. */
async function proxy(answer: (path: string) => Answer | undefined) {
  const asked: string[] = [];
  const p = await apiProxy(suite.server.url, (req, res) => {
    const route = (req.url ?? "/").split("?")[0] as string;
    asked.push(route);
    const own = req.method === "GET" ? answer(route) : undefined;
    if (!own) return false;
    res.writeHead(own[0], { "content-type": own[1] });
    res.end(own[2]);
    return true;
  });
  return { ...p, asked };
}

test("status ends at once with the first request that fails for good, stopping the other's retries", async () => {
  const task = `/api/analysis-tasks/${taskId}`;
  const runs = `${task}/runs`;
  const cases: { fails: string; retried: string; answer: Answer; code: number; error: string }[] = [
    {
      fails: task,
      retried: runs,
      answer: [500, "application/json", '{"code":"INTERNAL","message":"Internal server error."}'],
      code: 3,
      error: "INTERNAL",
    },
    {
      fails: runs,
      retried: task,
      answer: [
        404,
        "application/json",
        '{"code":"ANALYSIS_TASK_NOT_FOUND","message":"Analysis task not found: «état» ✓."}',
      ],
      code: 2,
      error: "ANALYSIS_TASK_NOT_FOUND",
    },
  ];
  for (const c of cases) {
    const p = await proxy((route) =>
      route === c.fails ? c.answer : route === c.retried ? BAD_GATEWAY : undefined,
    );
    try {
      const t0 = performance.now();
      const r = await client(["status", taskId], suite.env({ ASSAY_URL: p.url }));
      const ms = performance.now() - t0;
      assert.equal(r.code, c.code, r.stderr);
      const [error] = ofKind(jsonLines(r.stdout), "error") as (Line & { code: string })[];
      assert.equal(error?.code, c.error, r.stdout);
      // Its retries take 12.5 s of pauses; the first after 0.5 s.
      assert.ok(ms < 5_000, `${c.fails} failing: the command took ${Math.round(ms)} ms`);
      const retries = p.asked.filter((route) => route === c.retried).length;
      assert.ok(retries <= 2, `${c.retried} asked ${retries} times after the other failed`);
      assert.equal(p.asked.filter((route) => route === c.fails).length, 1);
    } finally {
      p.close();
    }
  }
});
