// The task API under concurrent clients: one Idempotency-Key raced with different requests, and the
// task list paged while tasks are created and retention deletes others. Ids cross a digit boundary
// (test/run.ts starts each table's ids just below a power of ten).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { taskDeleteExpired } from "../../src/queue/sql/retention.ts";
import { bearer, multipart, startTestApp, type TestApp } from "../helpers/app.ts";

let t: TestApp;
let alice: string;
let files: string[];

before(async () => {
  t = await startTestApp();
  alice = await t.token("ålice ☃");
  files = [];
  for (let i = 0; i < 6; i++) {
    const { payload, headers } = multipart("file", `a,b\n${i},2\n`, `données ${i} ☃.csv`);
    const res = await t.app.inject({
      method: "POST",
      url: "/api/files",
      payload,
      headers: { ...headers, ...bearer(alice) },
    });
    files.push(res.json().data.fileId);
  }
});
after(() => t.close());

const create = (body: unknown, headers: Record<string, string> = {}) =>
  t.app.inject({
    method: "POST",
    url: "/api/analysis-tasks",
    payload: body as object,
    headers: { ...bearer(alice), ...headers },
  });

test("one Idempotency-Key raced with different requests: one task; the same request 200, another 409", async () => {
  for (let i = 0; i < 10; i++) {
    const key = `race-${i}`;
    const a = { analysisType: "summary", inputFileIds: [files[i % 6], files[(i + 1) % 6]] };
    const b = { analysisType: "summary", inputFileIds: [files[(i + 2) % 6]] };
    // A file that does not exist: either nothing is created (404) or the key is already taken (409).
    const missing = { analysisType: "summary", inputFileIds: ["999999999999999"] };
    const bodies = [a, b, a, missing, b, a, b, a];
    const answers = await Promise.all(bodies.map((body) => create(body, { "idempotency-key": key })));
    const created = answers.filter((r) => r.statusCode === 201);
    assert.equal(created.length, 1, JSON.stringify(answers.map((r) => r.statusCode)));
    const taskId = created[0]?.json().data.taskId;
    const winner = bodies[answers.indexOf(created[0] as (typeof answers)[number])];
    for (const [j, r] of answers.entries()) {
      if (r === created[0]) continue;
      const body = bodies[j];
      if (body === missing) {
        assert.ok([404, 409].includes(r.statusCode), r.body);
      } else if (body === winner) {
        assert.equal(r.statusCode, 200, r.body);
        assert.equal(r.json().data.taskId, taskId);
      } else {
        assert.equal(r.statusCode, 409, r.body);
        assert.equal(r.json().code, "IDEMPOTENCY_KEY_REUSED");
      }
    }
    const [row] = await t.db.sql<{ n: number }[]>`
      select count(*)::int as n from tasks where idempotency_key = ${key}`;
    assert.equal(row?.n, 1);
  }
});

test("task list pages while tasks are created and retention deletes others: none twice, none skipped", async () => {
  const ids: string[] = [];
  for (let i = 0; i < 40; i++) {
    ids.push((await create({ analysisType: "summary", inputFileId: files[i % 6] })).json().data.taskId);
  }
  // Every other task is cancelled (terminal) and finished long ago: retention's to delete.
  const old = ids.filter((_, i) => i % 2 === 0);
  for (const id of old) {
    const res = await t.app.inject({
      method: "POST",
      url: `/api/analysis-tasks/${id}/cancel`,
      headers: bearer(alice),
    });
    assert.equal(res.statusCode, 202);
  }
  await t.db.sql`
    update tasks set finished_at = now() - interval '40 days' where id::text in ${t.db.sql(old)}`;
  const seen: string[] = [];
  const deleted = new Set<string>();
  const added: string[] = [];
  let cursor: string | null = null;
  do {
    const url: string = `/api/analysis-tasks?limit=3${cursor ? `&cursor=${cursor}` : ""}`;
    const res = await t.app.inject({ url, headers: bearer(alice) });
    assert.equal(res.statusCode, 200);
    const page: { items: { taskId: string }[]; nextCursor: string | null } = res.json().data;
    seen.push(...page.items.map((x) => x.taskId));
    cursor = page.nextCursor;
    // Between pages: retention deletes a few (the cursor's own task among them, at times) and a
    // task is created.
    for (const id of await taskDeleteExpired(t.db.sql, 30, 2, 10_000)) deleted.add(id);
    added.push((await create({ analysisType: "summary", inputFileId: files[0] })).json().data.taskId);
  } while (cursor);
  assert.ok(deleted.size > 0, "retention deleted tasks while the list was paged");
  assert.equal(new Set(seen).size, seen.length, "no task twice");
  const numeric = seen.map(BigInt);
  assert.ok(
    numeric.every((id, i) => i === 0 || id < (numeric[i - 1] as bigint)),
    "newest first, numerically",
  );
  // Every task that existed from the first page to the last is on some page.
  assert.deepEqual(
    ids.filter((id) => !deleted.has(id) && !seen.includes(id)),
    [],
  );
  assert.ok(!seen.some((id) => added.includes(id)), "tasks created after the first page are newer");
});
