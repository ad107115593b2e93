import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { workerDelete, workerRegister } from "../../src/queue/sql.ts";
import { requestHash } from "../../src/tasks/create.ts";
import { bearer, startTestApp, type TestApp, uploadedFileId } from "../helpers/app.ts";

let t: TestApp;
let alice: string;
let bob: string;
let admin: string;
let aliceFiles: string[];
let bobFile: string;

before(async () => {
  t = await startTestApp({ ASSAY_MAX_TASK_RUNS: "5" });
  [alice, bob, admin] = await Promise.all([t.token("alice"), t.token("bob"), t.token("root", "admin")]);
  aliceFiles = [];
  for (let i = 0; i < 4; i++) aliceFiles.push(await upload(alice, `a,b\n${i},2\n`));
  bobFile = await upload(bob, "x\n1\n");
});
after(() => t.close());

const upload = (token: string, content: string) => uploadedFileId(t.app, token, content);

const create = (token: string, body: unknown, headers: Record<string, string> = {}) =>
  t.app.inject({
    method: "POST",
    url: "/api/analysis-tasks",
    payload: body as object,
    headers: { ...bearer(token), ...headers },
  });
const counts = async () => {
  const [row] = await t.db
    .sql`select (select count(*) from tasks)::int as tasks, (select count(*) from runs)::int as runs`;
  return row;
};

describe("POST /api/analysis-tasks", () => {
  test("one file (seed contract) → 201 queued; the run snapshots the file", async () => {
    const res = await create(alice, {
      analysisType: "python-stats",
      inputFileId: aliceFiles[0],
      parameters: { method: "mean" },
    });
    assert.equal(res.statusCode, 201);
    const body = res.json();
    assert.deepEqual(body, {
      code: "OK",
      message: "Task created",
      data: { taskId: body.data.taskId, status: "queued" },
    });
    const [run] = await t.db.sql`
      select r.input_file_id::text as file, r.input_name, r.input_storage_key, r.input_sha256 = f.sha256 as same_hash,
             r.max_attempts, r.status
      from runs r join files f on f.id = r.input_file_id where r.task_id = ${body.data.taskId}`;
    assert.deepEqual(
      { ...run },
      {
        file: aliceFiles[0],
        input_name: "data.csv",
        input_storage_key: `files/${aliceFiles[0]}`,
        same_hash: true,
        max_attempts: 3,
        status: "queued",
      },
    );
  });

  test("many files fan out into one run each; duplicates collapse", async () => {
    const ids = [aliceFiles[0], aliceFiles[1], aliceFiles[1], aliceFiles[2]];
    const res = await create(alice, { analysisType: "summary", inputFileIds: ids, parameters: {} });
    assert.equal(res.statusCode, 201);
    const task = await t.app.inject({
      url: `/api/analysis-tasks/${res.json().data.taskId}`,
      headers: bearer(alice),
    });
    assert.equal(task.json().data.totalCount, 3);
    assert.equal(task.json().data.status, "queued");
    assert.equal(task.json().data.progressPercent, 0);
  });

  test("runs are in ascending file id order (numeric, across a digit boundary), not the order given", async () => {
    // aliceFiles cross 999,999 → 1,000,000 (test/run.ts): as text, "1000000" would sort first.
    const [a, b, , d] = aliceFiles as [string, string, string, string];
    assert.ok(d.length > a.length, `${a}…${d} cross a digit boundary`);
    const res = await create(alice, { analysisType: "summary", inputFileIds: [d, b, d, a] });
    assert.equal(res.statusCode, 201);
    const runs = await t.app.inject({
      url: `/api/analysis-tasks/${res.json().data.taskId}/runs`,
      headers: bearer(alice),
    });
    const items: { runId: string; inputFileId: string }[] = runs.json().data.items;
    assert.deepEqual(
      items.map((r) => r.inputFileId),
      [a, b, d],
    );
    const runIds = items.map((r) => BigInt(r.runId));
    assert.deepEqual(
      runIds,
      [...runIds].sort((x, y) => (x < y ? -1 : 1)),
    );
  });

  test("parameters are validated per analysis type", async () => {
    const cases: [unknown, string][] = [
      [
        { analysisType: "python-stats", inputFileId: aliceFiles[0], parameters: { method: "mode" } },
        "method",
      ],
      [{ analysisType: "python-stats", inputFileId: aliceFiles[0], parameters: {} }, "method"],
      // Left out, they are still required where the type needs some.
      [{ analysisType: "python-stats", inputFileId: aliceFiles[0] }, "parameters"],
      [
        {
          analysisType: "python-stats",
          inputFileId: aliceFiles[0],
          parameters: { method: "mean", columns: [] },
        },
        "columns",
      ],
      [{ analysisType: "summary", inputFileId: aliceFiles[0], parameters: { method: "mean" } }, "parameters"],
      [
        { analysisType: "r-report", inputFileId: aliceFiles[0], parameters: { title: "x".repeat(201) } },
        "title",
      ],
      [{ analysisType: "summary", inputFileId: aliceFiles[0], extra: 1 }, "^body/extra is not a known field"],
      [
        {
          analysisType: "python-stats",
          inputFileId: aliceFiles[0],
          parameters: { method: "mean", colour: 1 },
        },
        "^body/parameters/colour is not a known field",
      ],
      // A JSON body carries its types: none is coerced (Ajv would make "a" into ["a"], 7 into "7").
      [
        {
          analysisType: "python-stats",
          inputFileId: aliceFiles[0],
          parameters: { method: "mean", columns: "a" },
        },
        "columns",
      ],
      [{ analysisType: "summary", inputFileId: Number(aliceFiles[0]) }, "inputFileId"],
      [{ analysisType: "summary", inputFileIds: aliceFiles[0] }, "inputFileIds"],
    ];
    const before = await counts();
    for (const [body, field] of cases) {
      const res = await create(alice, body);
      assert.equal(res.statusCode, 400, JSON.stringify(body));
      assert.equal(res.json().code, "VALIDATION_FAILED", JSON.stringify(body));
      assert.match(res.json().message, new RegExp(field), JSON.stringify(body));
    }
    assert.deepEqual(await counts(), before);
    const good = await create(alice, {
      analysisType: "r-report",
      inputFileId: aliceFiles[0],
      parameters: { title: "Q3 & <stuff>" },
    });
    assert.equal(good.statusCode, 201);
  });

  test("unknown analysis type → 400 ANALYSIS_TYPE_UNSUPPORTED", async () => {
    for (const analysisType of ["rm -rf", "SUMMARY", "", "bash"]) {
      const res = await create(alice, { analysisType, inputFileId: aliceFiles[0] });
      assert.equal(res.statusCode, 400);
      assert.deepEqual(res.json(), {
        code: "ANALYSIS_TYPE_UNSUPPORTED",
        message: "The analysis type is not supported.",
      });
    }
  });

  test("no files, both or neither id fields, too many files → 400 VALIDATION_FAILED; nothing written", async () => {
    const before = await counts();
    for (const body of [
      { analysisType: "summary", inputFileIds: [] },
      { analysisType: "summary" },
      { analysisType: "summary", inputFileId: aliceFiles[0], inputFileIds: [aliceFiles[1]] },
      { analysisType: "summary", inputFileIds: ["1", "2", "3", "4", "5", "6"] },
    ]) {
      const res = await create(alice, body);
      assert.equal(res.statusCode, 400, JSON.stringify(body));
      assert.equal(res.json().code, "VALIDATION_FAILED");
    }
    assert.deepEqual(await counts(), before);
  });

  test("a missing, malformed or foreign file → 404 FILE_NOT_FOUND with nothing written; an admin may use anyone's", async () => {
    const before = await counts();
    for (const ids of [
      ["999999999999999"],
      [aliceFiles[0], "999999999999999"],
      [aliceFiles[0], bobFile],
      ["abc"],
      ["-1"],
    ]) {
      const res = await create(alice, { analysisType: "summary", inputFileIds: ids });
      assert.equal(res.statusCode, 404, JSON.stringify(ids));
      assert.equal(res.json().code, "FILE_NOT_FOUND");
    }
    assert.deepEqual(await counts(), before);
    assert.equal(
      (await create(admin, { analysisType: "summary", inputFileIds: [aliceFiles[0], bobFile] })).statusCode,
      201,
    );
  });

  test("Idempotency-Key: a replay returns the same task (200); a different request under it → 409", async () => {
    const body = { analysisType: "summary", inputFileIds: [aliceFiles[3]] };
    const first = await create(alice, body, { "idempotency-key": "k-1" });
    assert.equal(first.statusCode, 201);
    const before = await counts();
    const replays = await Promise.all([1, 2, 3].map(() => create(alice, body, { "idempotency-key": "k-1" })));
    for (const r of replays) {
      assert.equal(r.statusCode, 200);
      assert.equal(r.json().data.taskId, first.json().data.taskId);
    }
    assert.deepEqual(await counts(), before);
    const other = await create(
      alice,
      { ...body, inputFileIds: [aliceFiles[2]] },
      { "idempotency-key": "k-1" },
    );
    assert.equal(other.statusCode, 409);
    assert.equal(other.json().code, "IDEMPOTENCY_KEY_REUSED");
    // Keys are per user.
    const bobs = await create(
      bob,
      { analysisType: "summary", inputFileId: bobFile },
      { "idempotency-key": "k-1" },
    );
    assert.equal(bobs.statusCode, 201);
  });

  test("Idempotency-Key: priority 5 given is the same request as none; another priority is not; a key stored with 5 given before 2026-12-07 still replays", async () => {
    const body = { analysisType: "summary", inputFileIds: [aliceFiles[1]] };
    const first = await create(admin, { ...body, priority: 5 }, { "idempotency-key": "k-prio" });
    assert.equal(first.statusCode, 201);
    const taskId = first.json().data.taskId;
    const bare = await create(admin, body, { "idempotency-key": "k-prio" });
    assert.deepEqual([bare.statusCode, bare.json().data?.taskId], [200, taskId]);
    const other = await create(admin, { ...body, priority: 4 }, { "idempotency-key": "k-prio" });
    assert.deepEqual([other.statusCode, other.json().code], [409, "IDEMPOTENCY_KEY_REUSED"]);
    // Stored as the digest was made before (a priority of 5 given counted): its replay still matches.
    const legacy = requestHash(
      {
        analysisType: "summary",
        fileIds: [aliceFiles[1] as string],
        parameters: {},
        priority: 5,
        maxAttempts: 3,
      },
      true,
    );
    await t.db.sql`update tasks set request_hash = ${legacy} where id = ${taskId}`;
    const replay = await create(admin, { ...body, priority: 5 }, { "idempotency-key": "k-prio" });
    assert.deepEqual([replay.statusCode, replay.json().data?.taskId], [200, taskId]);
    // And without a priority, the same request.
    const replayBare = await create(admin, body, { "idempotency-key": "k-prio" });
    assert.deepEqual([replayBare.statusCode, replayBare.json().data?.taskId], [200, taskId]);
  });

  test("header schemas over real HTTP: an Idempotency-Key named in any case is honoured", async () => {
    // Route schemas compile on first use (src/http/lazy-compilers.ts), and then Fastify passes
    // header schemas as written: their keys must stay lower case, as HTTP/1 delivers the names.
    const url = await t.app.listen({ host: "127.0.0.1", port: 0 });
    const post = (headers: Record<string, string>) =>
      fetch(`${url}/api/analysis-tasks`, {
        method: "POST",
        headers: { Authorization: `Bearer ${alice}`, "Content-Type": "application/json", ...headers },
        body: JSON.stringify({ analysisType: "summary", inputFileIds: [aliceFiles[3]] }),
      });
    const first = await post({ "Idempotency-Key": "Mixed-Case-1" });
    assert.equal(first.status, 201);
    const again = await post({ "IDEMPOTENCY-KEY": "Mixed-Case-1" });
    assert.equal(again.status, 200, "the same key, however its name is cased, replays");
    assert.equal(
      ((await again.json()) as { data: { taskId: string } }).data.taskId,
      ((await first.json()) as { data: { taskId: string } }).data.taskId,
    );
  });

  test("concurrent first requests with one Idempotency-Key create exactly one task", async () => {
    const body = { analysisType: "summary", inputFileIds: [aliceFiles[0], aliceFiles[1]] };
    const results = await Promise.all(
      [1, 2, 3, 4].map(() => create(alice, body, { "idempotency-key": "race-1" })),
    );
    const ids = new Set(results.map((r) => r.json().data.taskId));
    assert.equal(ids.size, 1);
    assert.deepEqual(results.map((r) => r.statusCode).sort(), [200, 200, 200, 201]);
  });
});

describe("reading tasks", () => {
  test("another user's task is 404 ANALYSIS_TASK_NOT_FOUND; an admin sees it; odd ids are 404", async () => {
    const taskId = (await create(alice, { analysisType: "summary", inputFileId: aliceFiles[0] })).json().data
      .taskId;
    assert.equal(
      (await t.app.inject({ url: `/api/analysis-tasks/${taskId}`, headers: bearer(alice) })).statusCode,
      200,
    );
    assert.equal(
      (await t.app.inject({ url: `/api/analysis-tasks/${taskId}`, headers: bearer(admin) })).statusCode,
      200,
    );
    for (const url of [`/api/analysis-tasks/${taskId}`, `/api/analysis-tasks/${taskId}/runs`]) {
      const res = await t.app.inject({ url, headers: bearer(bob) });
      assert.equal(res.statusCode, 404);
      assert.deepEqual(res.json(), {
        code: "ANALYSIS_TASK_NOT_FOUND",
        message: "The analysis task does not exist.",
      });
    }
    // Ids of other kinds (the test template numbers each table from its own range) are not task ids.
    const [run] = await t.db.sql`select id::text as id from runs where task_id = ${taskId}`;
    const [event] = await t.db.sql`select id::text as id from task_events where task_id = ${taskId} limit 1`;
    const otherKinds = [aliceFiles[0] as string, run?.id as string, event?.id as string];
    for (const id of ["abc", "0", "999999999999999", "9".repeat(30), ...otherKinds]) {
      for (const suffix of ["", "/runs", "/logs", "/download"]) {
        const res = await t.app.inject({ url: `/api/analysis-tasks/${id}${suffix}`, headers: bearer(alice) });
        assert.equal(res.statusCode, 404, `${id}${suffix}`);
        assert.equal(res.json().code, "ANALYSIS_TASK_NOT_FOUND", `${id}${suffix}`);
      }
    }
  });

  test("the task body has every field of the contract", async () => {
    const taskId = (
      await create(alice, {
        analysisType: "python-stats",
        inputFileId: aliceFiles[1],
        parameters: { method: "max" },
      })
    ).json().data.taskId;
    const data = (await t.app.inject({ url: `/api/analysis-tasks/${taskId}`, headers: bearer(alice) })).json()
      .data;
    assert.deepEqual(Object.keys(data).sort(), [
      "analysisType",
      "cancelledCount",
      "createdAt",
      "failedCount",
      "finishedAt",
      "owner",
      "parameters",
      "priority",
      "progressPercent",
      "queue",
      "startedAt",
      "status",
      "succeededCount",
      "taskId",
      "timedOutCount",
      "totalCount",
    ]);
    assert.deepEqual(data.parameters, { method: "max" });
    assert.equal(data.owner, "alice");
    const runs = (
      await t.app.inject({ url: `/api/analysis-tasks/${taskId}/runs`, headers: bearer(alice) })
    ).json().data;
    assert.equal(runs.items.length, 1);
    assert.deepEqual(Object.keys(runs.items[0]).sort(), [
      "attempt",
      "errorCode",
      "errorMessage",
      "fileName",
      "finishedAt",
      "inputFileId",
      "message",
      "metrics",
      "progressPercent",
      "runId",
      "startedAt",
      "status",
    ]);
    assert.equal(runs.items[0].fileName, "data.csv");
    assert.equal(runs.items[0].message, null);
    assert.equal(runs.nextCursor, null);
  });

  test("list: own tasks only, newest first, status filter, cursor pagination", async () => {
    const mine = await t.db
      .sql`select t.id::text from tasks t join users u on u.id = t.owner_id where u.name = 'alice' order by t.id desc`;
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const url: string = `/api/analysis-tasks?limit=2${cursor ? `&cursor=${cursor}` : ""}`;
      const res = await t.app.inject({ url, headers: bearer(alice) });
      assert.equal(res.statusCode, 200);
      const page: { items: { taskId: string }[]; nextCursor: string | null } = res.json().data;
      assert.ok(page.items.length <= 2);
      seen.push(...page.items.map((i) => i.taskId));
      cursor = page.nextCursor;
    } while (cursor);
    assert.deepEqual(
      seen,
      mine.map((r) => r.id),
    );
    const queued = (
      await t.app.inject({ url: "/api/analysis-tasks?status=queued&limit=100", headers: bearer(alice) })
    ).json().data;
    assert.equal(queued.items.length, mine.length);
    const none = (
      await t.app.inject({ url: "/api/analysis-tasks?status=succeeded", headers: bearer(alice) })
    ).json().data;
    assert.deepEqual(none, { items: [], nextCursor: null });
    for (const q of ["status=bogus", "limit=0", "limit=101", "cursor=abc", "colour=red"]) {
      const res = await t.app.inject({ url: `/api/analysis-tasks?${q}`, headers: bearer(alice) });
      assert.equal(res.statusCode, 400, q);
      assert.equal(res.json().code, "VALIDATION_FAILED");
    }
    const unknown = await t.app.inject({ url: "/api/analysis-tasks?colour=red", headers: bearer(alice) });
    assert.equal(unknown.json().message, "querystring/colour is not a known field.");
  });
});

describe("GET /api/analysis-tasks/:taskId/logs", () => {
  test("the task's events as pages; foreign task → 404; bad cursor → 400", async () => {
    const taskId = (
      await create(alice, { analysisType: "summary", inputFileIds: [aliceFiles[0], aliceFiles[1]] })
    ).json().data.taskId;
    await t.db.sql`insert into task_events (task_id, type, data)
                   select ${taskId}, 'run.progress', jsonb_build_object('percent', g) from generate_series(1, 4) g`;
    const seen: string[] = [];
    let after = "";
    for (;;) {
      const res = await t.app.inject({
        url: `/api/analysis-tasks/${taskId}/logs?limit=2${after}`,
        headers: bearer(alice),
      });
      assert.equal(res.statusCode, 200);
      const page: { items: { id: string; type: string; taskId: string }[]; nextCursor: string | null } =
        res.json().data;
      seen.push(...page.items.map((i) => i.type));
      assert.ok(page.items.every((i) => i.taskId === taskId));
      if (!page.nextCursor) break;
      after = `&after=${page.nextCursor}`;
    }
    assert.deepEqual(seen, ["task.queued", "run.progress", "run.progress", "run.progress", "run.progress"]);
    assert.equal(
      (await t.app.inject({ url: `/api/analysis-tasks/${taskId}/logs`, headers: bearer(bob) })).statusCode,
      404,
    );
    assert.equal(
      (await t.app.inject({ url: `/api/analysis-tasks/${taskId}/logs?after=x`, headers: bearer(alice) }))
        .statusCode,
      400,
    );
  });
});

describe("priority and where a queued task stands", () => {
  test("a user who sets priority gets 400 VALIDATION_FAILED naming it; nothing is created", async () => {
    const before = await counts();
    const res = await create(alice, { analysisType: "summary", inputFileId: aliceFiles[0], priority: 0 });
    assert.equal(res.statusCode, 400);
    assert.equal(res.json().code, "VALIDATION_FAILED");
    assert.match(res.json().message, /priority/);
    // Whatever else is wrong with the request (an id that cannot exist would be a 404).
    const withBadId = await create(alice, { analysisType: "summary", inputFileId: "abc", priority: 1 });
    assert.equal(withBadId.statusCode, 400);
    assert.equal(withBadId.json().message, "body/priority may only be set by an admin.");
    // And before the route's own checks (both id fields); an unknown type is the schema's (the
    // parameters' schema depends on it), told first.
    const both = await create(alice, {
      analysisType: "summary",
      inputFileId: aliceFiles[0],
      inputFileIds: [aliceFiles[0]],
      priority: 1,
    });
    assert.equal(both.statusCode, 400);
    assert.equal(both.json().message, "body/priority may only be set by an admin.");
    // A JSON null is a value of the wrong type, not "the default" (coerced, it was 0: the first priority).
    for (const priority of [-1, 10, 2.5, "high", null, "7", false, [3]]) {
      const bad = await create(admin, { analysisType: "summary", inputFileId: aliceFiles[0], priority });
      assert.equal(bad.statusCode, 400, String(priority));
      assert.match(bad.json().message, /priority/, String(priority));
    }
    assert.deepEqual(await counts(), before);
  });

  test("an admin's priority is the task's and its runs'; the default is 5", async () => {
    const urgent = await create(admin, {
      analysisType: "summary",
      inputFileIds: aliceFiles.slice(0, 2),
      priority: 0,
    });
    assert.equal(urgent.statusCode, 201);
    const normal = await create(alice, { analysisType: "summary", inputFileId: aliceFiles[2] });
    for (const [res, priority] of [
      [urgent, 0],
      [normal, 5],
    ] as const) {
      const id = res.json().data.taskId as string;
      const got = await t.app.inject({ url: `/api/analysis-tasks/${id}`, headers: bearer(admin) });
      assert.equal(got.json().data.priority, priority);
      const runs = await t.db.sql`select distinct priority from runs where task_id = ${id}`;
      assert.deepEqual(
        runs.map((r) => r.priority),
        [priority],
      );
    }
  });

  test("a queued task says about how many runs are ahead of it, labelled an estimate", async () => {
    // No worker runs here: everything created above waits. Bob's new task waits behind Alice's
    // (same priority, served in turn) and behind the admin's priority-0 runs.
    const res = await create(bob, { analysisType: "summary", inputFileId: bobFile });
    const id = res.json().data.taskId as string;
    const got = (await t.app.inject({ url: `/api/analysis-tasks/${id}`, headers: bearer(bob) })).json().data;
    assert.equal(got.status, "queued");
    // The estimate's definition, from the raw queue: Bob's own runs ahead of this task's first (m),
    // each other user at this priority in turn (up to m + 1 runs each), every higher-priority run.
    const queued = await t.db.sql<
      { id: string; task: string; owner: string; priority: number; turn: number }[]
    >`
      select r.id::text as id, r.task_id::text as task, r.owner_id::text as owner, r.priority, r.turn::float8 as turn
      from runs r where r.status = 'queued' and r.analysis_type = 'summary' order by r.turn, r.id`;
    const mine = queued.filter((r) => r.task === id)[0];
    assert.ok(mine);
    const before = (r: (typeof queued)[number]) =>
      r.turn < mine.turn || (r.turn === mine.turn && BigInt(r.id) < BigInt(mine.id));
    const m = queued.filter((r) => r.owner === mine.owner && r.priority === 5 && before(r)).length;
    const others = new Map<string, number>();
    for (const r of queued)
      if (r.owner !== mine.owner && r.priority === 5) others.set(r.owner, (others.get(r.owner) ?? 0) + 1);
    const higher = queued.filter((r) => r.priority < 5).length;
    const fromOthers = [...others.values()].reduce((n, q) => n + Math.min(q, m + 1), 0);
    assert.ok(higher > 0 && others.size > 0, "the test has runs of both kinds ahead");
    assert.deepEqual(got.queue, {
      runsAhead: m + fromOthers + higher,
      usersWaiting: others.size,
      higherPriority: higher,
      estimate: true,
      // No worker runs here: the task is not next, whatever the count (it said "≈ 0 runs ahead").
      noWorker: "no worker is running",
    });
    // In the list too; a task that is not queued has none.
    const list = (await t.app.inject({ url: "/api/analysis-tasks?limit=100", headers: bearer(bob) })).json()
      .data;
    assert.deepEqual(list.items.find((x: { taskId: string }) => x.taskId === id)?.queue, got.queue);
    // A live worker of another type only: its reason; one that runs summary: none.
    const read = async () =>
      (await t.app.inject({ url: `/api/analysis-tasks/${id}`, headers: bearer(bob) })).json().data.queue;
    const worker = { id: "w-estimate", host: "h", pid: 1, concurrency: 2 };
    await workerRegister(t.db.sql, {
      ...worker,
      analysisTypes: ["python-stats"],
      unavailable: [{ type: "summary", reason: "node not found" }],
    });
    assert.equal((await read()).noWorker, "node not found (1 worker)");
    await workerRegister(t.db.sql, { ...worker, analysisTypes: ["summary"] });
    assert.deepEqual(await read(), { ...got.queue, noWorker: null });
    await workerDelete(t.db.sql, worker.id);
    await t.db.sql`update tasks set status = 'cancelling' where id = ${id}`;
    const cancelling = (await t.app.inject({ url: `/api/analysis-tasks/${id}`, headers: bearer(bob) })).json()
      .data;
    assert.equal(cancelling.queue, null);
  });

  test("a queued task whose first run is claimed has no place in the queue (it said N runs ahead)", async () => {
    const second = await upload(bob, "x\n2\n");
    const res = await create(bob, { analysisType: "summary", inputFileIds: [bobFile, second] });
    assert.equal(res.statusCode, 201, res.body);
    const id = res.json().data.taskId as string;
    const read = async () =>
      (await t.app.inject({ url: `/api/analysis-tasks/${id}`, headers: bearer(bob) })).json().data;
    assert.ok((await read()).queue, "queued, with an estimate");
    // Its first run claimed: the task turns running only when a run reports running.
    await t.db.sql`
      update runs set status = 'starting', attempt = 1, lease_owner = 'w', lease_token = gen_random_uuid(),
                      lease_expires_at = now() + interval '1 minute', started_at = now()
      where id = (select min(id) from runs where task_id = ${id})`;
    const claimed = await read();
    assert.equal(claimed.status, "queued");
    assert.equal(claimed.queue, null);
  });
});
