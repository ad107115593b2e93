// Retention benchmark (issue 6): claim and drain rate of 10,000 runs on an empty queue, then again with
// 1,000,000 finished runs already in the table (what retention keeps from growing without bound).
// Target: within 20% of the empty-table figure.
import { createDatabase } from "../src/db/client.ts";
import { benchDatabase, report } from "./lib/db.ts";
import { createNoopTask, drainTask, seedOwnerAndFiles } from "./lib/drain.ts";

const N = Number(process.env.BENCH_N ?? 10_000);
const HISTORY = Number(process.env.BENCH_HISTORY ?? 1_000_000);
const C = 10;

const bench = await benchDatabase();
const { sql, close } = createDatabase(bench.url);
try {
  const { owner, fileIds } = await seedOwnerAndFiles(sql, "retention-bench", N);
  await sql`vacuum analyze`;
  const empty = await drainTask(sql, await createNoopTask(sql, owner, fileIds), fileIds.length, C);
  const emptyLine = report("drain:empty-history", N, C, empty.seconds, empty.latencies, empty.ok);

  // A million finished runs in 1,000 finished tasks, inserted directly (finished rows need no queue).
  const perTask = 1000;
  for (let done = 0; done < HISTORY; done += perTask * 50) {
    await sql`
      with t as (
        insert into tasks (owner_id, analysis_type, status, total_count, succeeded_count, finished_at, started_at)
        select ${owner.userId}, 'noop', 'succeeded', ${perTask}, ${perTask}, now(), now() from generate_series(1, 50)
        returning id
      )
      insert into runs (task_id, analysis_type, owner_id, status, attempt, max_attempts, input_file_id,
                        input_storage_key, input_name, input_size_bytes, input_sha256, progress, started_at,
                        finished_at, result)
      select t.id, 'noop', ${owner.userId}, 'succeeded', 1, 3, g, 'files/x', 'f.csv', 1, 'x', 100, now(), now(),
             '{}'::jsonb
      from t, generate_series(1, ${perTask}) g`;
  }
  await sql`vacuum analyze`;
  const full = await drainTask(sql, await createNoopTask(sql, owner, fileIds), fileIds.length, C);
  const fullLine = report("drain:1M-history", N, C, full.seconds, full.latencies, full.ok, {
    history: HISTORY,
  });
  console.log(
    JSON.stringify({
      workload: "drain:history-ratio",
      ratio: Math.round((fullLine.rate / emptyLine.rate) * 100) / 100,
      target: 0.8,
    }),
  );
} finally {
  await close();
  await bench.stop();
}
