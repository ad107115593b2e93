// The fan-in result of a task as one table: a CSV row per run, in run id order, with a column per
// metric key any run reported. Served as GET …/results.csv and at the root of the task's zip; both
// stream it from here, read a page of runs at a time and sent a few rows at a time (a row is as wide
// as the task's metric keys), so a task of any size is never held in memory.
import { Readable } from "node:stream";
import { isoTime, type Sql } from "../db/client.ts";
import { RESULTS_FILE } from "../files/folder-names.ts";

/** Runs read per query. */
const PAGE = 1000;

/**
 * Characters of rows sent as one piece. A row is as wide as every metric key of the task together: a
 * page of 1,000 rows joined into one string held 1,000 times that width at once (30 MB for 30,000
 * keys; past V8's longest string for wider tables), so rows are sent a few at a time instead.
 */
const PIECE_CHARS = 64 * 1024;

/** The table's name at the root of a zip (and of a CLI download: one name, files/folder-names.ts). */
export const RESULTS_FILE_NAME = RESULTS_FILE;

const FIXED_COLUMNS = [
  "run_id",
  "input_file",
  "status",
  "attempt",
  "error_code",
  "error_message",
  "started_at",
  "finished_at",
  "duration_ms",
] as const;

/**
 * A cell that a spreadsheet would take for a formula (`=`, `+`, `-`, `@`, and tab or carriage return,
 * which some programs skip before looking) gets a leading `'`, so opening the file runs nothing. For
 * text only: numbers are written as numbers (a negative one stays `-3`).
 */
export function guardFormula(text: string): string {
  return /^[=+\-@\t\r]/.test(text) ? `'${text}` : text;
}

/** RFC 4180: quoted when it holds a quote, comma or line break; quotes doubled. */
export function csvField(text: string): string {
  return /[",\r\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

/** A text cell: formula-guarded, then escaped. */
const textCell = (s: string | null) => (s === null ? "" : csvField(guardFormula(s)));

/** A metric's cell: numbers and booleans as they are, strings as text, objects and arrays as JSON. */
export function metricCell(value: unknown): string {
  if (value === undefined || value === null) return "";
  if (typeof value === "number" || typeof value === "boolean") return String(value);
  if (typeof value === "string") return textCell(value);
  return textCell(JSON.stringify(value));
}

const csvLine = (cells: string[]) => `${cells.join(",")}\r\n`;

/** Every metric key the task's runs reported, sorted (by code unit, the same on every machine). */
export async function resultMetricKeys(sql: Sql, taskId: string): Promise<string[]> {
  const rows = await sql<{ key: string }[]>`
    select distinct k.key from runs r, jsonb_object_keys(r.result -> 'metrics') as k(key)
    where r.task_id = ${taskId} and jsonb_typeof(r.result -> 'metrics') = 'object'`;
  return rows.map((r) => r.key).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

interface ResultRow {
  runId: string;
  inputName: string;
  status: string;
  attempt: number;
  errorCode: string | null;
  errorMessage: string | null;
  startedAt: Date | null;
  finishedAt: Date | null;
  metrics: Record<string, unknown> | null;
}

function rowLine(r: ResultRow, keys: readonly string[]): string {
  const metrics = r.metrics !== null && typeof r.metrics === "object" ? r.metrics : {};
  return csvLine([
    r.runId,
    textCell(r.inputName),
    textCell(r.status),
    String(r.attempt),
    textCell(r.errorCode),
    textCell(r.errorMessage),
    r.startedAt === null ? "" : isoTime(r.startedAt),
    r.finishedAt === null ? "" : isoTime(r.finishedAt),
    // From the two times as written (milliseconds), so the columns agree with each other.
    r.startedAt === null || r.finishedAt === null
      ? ""
      : String(r.finishedAt.getTime() - r.startedAt.getTime()),
    ...keys.map((k) => metricCell(Object.hasOwn(metrics, k) ? metrics[k] : null)),
  ]);
}

/**
 * The task was deleted (by retention) while its table was read: its later pages would come back empty
 * and the table would end short but well-formed, so the stream fails instead.
 */
export class ResultsTaskGoneError extends Error {
  constructor(taskId: string) {
    super(`task ${taskId} was deleted while its results were read`);
    this.name = "ResultsTaskGoneError";
  }
}

/**
 * The table's lines: the header, then one line per run in id order, read a page at a time (keyset by
 * run id, one short query per page: no cursor holds a connection while a slow client reads). The
 * metric columns are read first; a run finishing meanwhile with a new key does not add a column.
 *
 * Each page is read together with the task's row, in one statement: a task and its runs are deleted
 * in one statement too (the tasks_delete_children trigger), so a page without the task means it was
 * deleted, and a page with it holds every run that is left after `after`. Checked on every page, not
 * once: the runs that were read before are not deleted from the client's copy.
 */
export async function* resultLines(
  sql: Sql,
  taskId: string,
  keys: readonly string[],
): AsyncGenerator<string> {
  yield csvLine([...FIXED_COLUMNS, ...keys.map((k) => textCell(k))]);
  for (let after = "0"; ; ) {
    // The task's row, left-joined to the page: no row at all when the task is gone, one row of nulls
    // when it is there and no run is left.
    const found = await sql<(ResultRow | { runId: null })[]>`
      select r."runId", r."inputName", r.status, r.attempt, r."errorCode", r."errorMessage",
             r."startedAt", r."finishedAt", r.metrics
      from tasks t left join lateral (
        select r.id, r.id::text as "runId", r.input_name as "inputName", r.status, r.attempt,
               r.error_code as "errorCode", r.error_message as "errorMessage",
               r.started_at as "startedAt", r.finished_at as "finishedAt",
               r.result -> 'metrics' as metrics
        from runs r
        where r.task_id = t.id and r.id > ${after}
        order by r.id
        limit ${PAGE}
      ) r on true
      where t.id = ${taskId}
      order by r.id`;
    if (found.length === 0) throw new ResultsTaskGoneError(taskId);
    const rows = found.filter((r): r is ResultRow => r.runId !== null);
    let piece = "";
    for (const r of rows) {
      piece += rowLine(r, keys);
      if (piece.length >= PIECE_CHARS) {
        yield piece;
        piece = "";
      }
    }
    if (piece !== "") yield piece;
    const last = rows.at(-1);
    if (rows.length < PAGE || !last) return;
    after = last.runId;
  }
}

/** The CSV as a byte stream (UTF-8), with the metric columns read beforehand (resultMetricKeys). */
export function resultsCsv(sql: Sql, taskId: string, keys: readonly string[]): Readable {
  return Readable.from(resultLines(sql, taskId, keys), { objectMode: false });
}
