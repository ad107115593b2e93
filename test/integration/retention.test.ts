import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import type { Principal } from "../../src/auth/tokens.ts";
import { createLogger } from "../../src/log.ts";
import { Retention } from "../../src/queue/retention.ts";
import { runClaim, runComplete } from "../../src/queue/sql.ts";
import { createTestDatabase, type TestDatabase } from "../helpers/db.ts";
import { createTask, seedUser } from "../helpers/queue.ts";

let db: TestDatabase;
let owner: Principal;
const outputsRoot = fs.mkdtempSync(path.join(os.tmpdir(), "assay-retention-"));
before(async () => {
  db = await createTestDatabase();
  owner = await seedUser(db.sql, "retention");
});
after(async () => {
  await db.drop();
  fs.rmSync(outputsRoot, { recursive: true, force: true });
});

async function finished(type: string, daysAgo: number): Promise<string> {
  const taskId = await createTask(db.sql, owner, type, 2);
  const runs = await runClaim(db.sql, {
    workerId: "w",
    analysisType: type,
    limit: 2,
    globalLimit: 0,
    leaseTtlMs: 30_000,
  });
  await runComplete(
    db.sql,
    runs.map((r) => ({ id: r.id, token: r.leaseToken, status: "succeeded" as const })),
  );
  await db.sql`update tasks set finished_at = now() - ${daysAgo} * interval '1 day' where id = ${taskId}`;
  fs.mkdirSync(path.join(outputsRoot, taskId, String(runs[0]?.id)), { recursive: true });
  fs.writeFileSync(path.join(outputsRoot, taskId, String(runs[0]?.id), "out.json"), "{}");
  return taskId;
}

test("retention deletes only old finished tasks, with their runs, events and outputs", async () => {
  const old1 = await finished("ret-a", 40);
  const old2 = await finished("ret-b", 31);
  const recent = await finished("ret-c", 5);
  const unfinished = await createTask(db.sql, owner, "ret-d", 1);
  await db.sql`update tasks set created_at = now() - interval '90 days' where id = ${unfinished}`;

  const retention = new Retention({
    sql: db.sql,
    logger: createLogger({ level: "silent" }),
    outputsRoot,
    retentionDays: 30,
    intervalMs: 60_000,
    batchSize: 1,
  });
  assert.equal(await retention.runOnce(), 2);
  const left = (await db.sql`select t.id::text as id from tasks t order by t.id`).map((r) => r.id);
  assert.deepEqual(left, [recent, unfinished]);
  for (const gone of [old1, old2]) {
    assert.equal((await db.sql`select 1 from runs where task_id = ${gone}`).length, 0);
    assert.equal((await db.sql`select 1 from task_events where task_id = ${gone}`).length, 0);
    assert.equal(fs.existsSync(path.join(outputsRoot, gone)), false);
  }
  assert.ok(fs.existsSync(path.join(outputsRoot, recent)));
  assert.equal(await retention.runOnce(), 0);
});
