// A task page whose event stream resumes after the database was restored from an older backup, in a
// real browser against a real `assay api` process reached through a TCP proxy the test cuts: the ids
// the page saw are handed out again, the server answers its Last-Event-ID with a `reset` frame and the
// whole log, and the page drops the log it showed and shows the restored one (without the reset it
// skipped every event until the ids passed the one it held). No worker: the test writes the events.
import assert from "node:assert/strict";
import { test } from "node:test";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { browserSkip, dashboardSuite, summaryTask, uploadFile, watchPage } from "../helpers/browser.ts";
import { tableEvents } from "../helpers/queue.ts";
import { startTcpProxy } from "../helpers/tcp-proxy.ts";

const skip = browserSkip;

const s = dashboardSuite({ ASSAY_SSE_HEARTBEAT_MS: "1000" });
const { problems } = s;

test("after a restore from an older backup, the task page shows the restored log, not the one it had", {
  skip,
}, async () => {
  const sql = s.env.db.sql;
  const fay = await tokenCreate(sql, "fay", "user");
  const { fileId } = await uploadFile(s.base, fay.token, "mesures-été.csv", "a,b\n1,2\n");
  const taskId = await summaryTask(s.base, fay.token, fileId);
  const [run] = await sql<{ id: string }[]>`select id::text from runs where task_id = ${taskId}`;
  await sql`update tasks set status = 'running', started_at = now() where id = ${taskId}`;
  /** Appends an event of the run and announces it, as the queue's statements do. */
  const emit = async (type: string, data: object) => {
    const [e] = await sql`
      insert into task_events (task_id, run_id, type, data)
      values (${taskId}, ${run?.id as string}, ${type}, ${sql.json(data as never)})
      returning id::text as id, task_id::text as "taskId", run_id::text as "runId", type, data,
                to_char(created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') as "createdAt"`;
    await sql`select pg_notify('assay_events', ${JSON.stringify({ taskId, events: [e] })})`;
  };

  let down = false;
  const proxy = await startTcpProxy(s.base, { fromClient: () => (down ? "cut" : "pass") });
  const ctx = await s.browser.newContext({ viewport: { width: 1280, height: 900 } });
  try {
    const page = await ctx.newPage();
    watchPage(page, problems);
    const origin = new URL(proxy.url).origin;
    await page.goto(`${origin}/#token=${encodeURIComponent(fay.token)}`);
    await page.getByRole("heading", { name: "Tasks" }).waitFor();
    await page.goto(`${origin}/#/tasks/${taskId}`);
    await page.locator(".task header .stream", { hasText: "live" }).waitFor();
    await page.getByRole("tab", { name: "Event log" }).click();
    const [backup] = await sql<{ last: string }[]>`select last_value::text as last from task_events_id_seq`;
    // After the backup: the page shows these, then the database is lost.
    for (let i = 1; i <= 5; i++) await emit("run.progress", { percent: i * 10, message: `lost step ${i}` });
    await page.locator(".log li", { hasText: "lost step 5" }).waitFor();

    down = true;
    proxy.dropAll();
    await page.locator(".task header .stream", { hasText: "reconnecting" }).waitFor({ timeout: 15_000 });
    // The restore: the later events gone, the id sequence back; the restored installation goes on.
    await sql`delete from task_events where id > ${backup?.last as string}`;
    await sql`select setval('task_events_id_seq', ${backup?.last as string})`;
    await emit("run.progress", { percent: 20, message: "restored step" });
    down = false;

    await page.locator(".log li", { hasText: "restored step" }).waitFor({ timeout: 30_000 });
    const shown = await page
      .locator(".log li")
      .evaluateAll((items) => items.map((li) => li.getAttribute("data-event")));
    assert.deepEqual(
      shown,
      (await tableEvents(sql, taskId)).map(([id]) => id),
      "the restored log, each event once, none of the lost ones",
    );
    assert.equal(await page.locator(".log li", { hasText: "lost step" }).count(), 0);
    assert.deepEqual(problems, []);
  } finally {
    await ctx.close();
    await proxy.close();
  }
});
