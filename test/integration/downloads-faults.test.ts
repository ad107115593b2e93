// Downloads where a run's output files would overwrite each other once extracted or saved: names that
// differ only in case are one file on macOS and Windows, in the task's zip and in `assay download`.
import assert from "node:assert/strict";
import fs from "node:fs";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { runsOf } from "../../src/client/api.ts";
import { downloadOutputs, folderNames } from "../../src/client/download.ts";
import { ApiClient } from "../../src/client/http.ts";
import { bearer } from "../helpers/app.ts";
import { waitForTerminal } from "../helpers/queue.ts";
import { fixtureProgram, type RunnerEnv, runnerEnv } from "../helpers/runner.ts";
import { zipNames, zipRead } from "../helpers/zip.ts";

let env: RunnerEnv;
let app: FastifyInstance;
let token: string;
let scratch: string;

before(async () => {
  env = await runnerEnv();
  app = await env.app();
  token = (await tokenCreate(env.db.sql, "folder")).token;
  scratch = fs.mkdtempSync(path.join(os.tmpdir(), "assay-dl-faults-"));
});
after(async () => {
  fs.rmSync(scratch, { recursive: true, force: true });
  await env.close();
});

/** A name as macOS and Windows compare it when a zip is extracted or a file is saved. */
const onDisk = (name: string) => name.normalize("NFC").toLowerCase();

/** Every file under `dir`, as relative paths with `/`. */
function filesUnder(dir: string): string[] {
  return (fs.readdirSync(dir, { recursive: true }) as string[])
    .filter((p) => fs.statSync(path.join(dir, p)).isFile())
    .map((p) => p.split(path.sep).join("/"))
    .sort();
}

test("output files whose names differ only in case get one name each, the same in the zip and a download", {
  timeout: 60_000,
}, async () => {
  // A program could write `Report.json` and `report.json` (both valid output names) until the runner
  // refused them (runner/outputs.ts); on macOS and Windows they are one file, and whichever is
  // extracted or saved second replaces the first. Such a run's outputs are made here as one recorded
  // before the refusal: written under other names, then renamed in the store and in the run's result.
  const renamed: Record<string, string> = { "upper.json": "Report.json", "caps.json": "REPORT.json" };
  const specs = [
    {
      files: {
        "upper.json": '{"v":"upper"}',
        "report.json": '{"v":"lower"}',
        "caps.json": '{"v":"caps"}',
      },
      result: "report.json",
    },
    { files: { "out.json": "{}" }, result: "out.json" },
  ];
  const files: string[] = [];
  for (const s of specs) files.push(await env.file(JSON.stringify(s)));
  const taskId = await env.task("dl-case", files, { mode: "input" });
  const w = env.worker([fixtureProgram("dl-case")]);
  await w.start();
  await waitForTerminal(env.db.sql, taskId);
  await w.stop();
  await env.db
    .sql`update tasks set owner_id = (select id from users where name = 'folder') where id = ${taskId}`;
  const [task] = await env.db.sql<{ status: string }[]>`select status from tasks where id = ${taskId}`;
  assert.equal(task?.status, "succeeded");
  const [twins] = await env.db.sql<{ id: string; key: string; files: { name: string; size: number }[] }[]>`
    select id::text, output_key as key, result -> 'files' as files from runs
    where task_id = ${taskId} and result ->> 'outputFileName' = 'report.json'`;
  assert.ok(twins);
  for (const [from, to] of Object.entries(renamed))
    fs.renameSync(path.join(env.outputsRoot, twins.key, from), path.join(env.outputsRoot, twins.key, to));
  const recorded = twins.files.map((f) => ({ ...f, name: renamed[f.name] ?? f.name }));
  await env.db.sql`update runs set result = jsonb_set(result, '{files}', ${env.db.sql.json(recorded)})
    where id = ${twins.id}`;

  const res = await app.inject({ url: `/api/analysis-tasks/${taskId}/download`, headers: bearer(token) });
  assert.equal(res.statusCode, 200);
  const names = zipNames(res.rawPayload);
  assert.equal(new Set(names.map(onDisk)).size, names.length, `one file per name once extracted: ${names}`);
  // Every output is in the zip, under a name of its own.
  const contents = names.filter((n) => n.endsWith(".json")).map((n) => zipRead(res.rawPayload, n).toString());
  for (const v of ['{"v":"upper"}', '{"v":"lower"}', '{"v":"caps"}', "{}"])
    assert.ok(contents.includes(v), v);

  // `assay download`: the same paths on disk as in the zip, none written twice.
  await app.listen({ port: 0, host: "127.0.0.1" });
  const { port } = app.server.address() as AddressInfo;
  const c = new ApiClient(`http://127.0.0.1:${port}`, token);
  const signal = new AbortController().signal;
  const runs = await runsOf(c, taskId, "succeeded", signal);
  const folders = folderNames(runs);
  const out = path.join(scratch, "case");
  const got = await downloadOutputs(
    c,
    taskId,
    runs.map((run) => ({ run, folder: folders.get(run.runId) as string })),
    out,
    { concurrency: 2, signal },
  );
  const saved = got.runs.flatMap((r) => r.files.map((f) => `${r.folder}/${f}`));
  assert.equal(new Set(saved.map(onDisk)).size, saved.length, `one file per name once saved: ${saved}`);
  assert.deepEqual(filesUnder(out), [...names].sort(), "a download holds the zip's paths");
  for (const n of names) {
    if (n === "results.csv") continue;
    assert.deepEqual(fs.readFileSync(path.join(out, n)), zipRead(res.rawPayload, n), n);
  }
});
