// Every route of the OpenAPI document (/docs/json) against hostile variations of a valid request, as
// a user and as an admin: never a 500 or a hang, every refusal the `{code, message}` envelope with a
// code of docs/api.md's error table and a message that does not echo the input, and a refused request
// leaves nothing written (files, tasks, runs, events, stored objects). What `inject` cannot send (raw
// bytes in the request line and headers) goes over a real socket. Variations are sampled per route
// with a fixed seed, so a failure repeats.
import assert from "node:assert/strict";
import fs from "node:fs";
import type { AddressInfo } from "node:net";
import net from "node:net";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, describe, test } from "node:test";
import { outputObjectKey } from "../../src/storage/store.ts";
import { bearer, startTestApp, type TestApp, uploadedFileId } from "../helpers/app.ts";

let t: TestApp;
let port: number;
const tokens: Record<"user" | "admin", string> = { user: "", admin: "" };

/** Ids of real resources, per principal: path parameters of a valid request. */
interface Fixture {
  fileId: string;
  /** A terminal task with one succeeded run and its output `summary.json`. */
  taskId: string;
  runId: string;
  name: string;
  /** A queued task, for cancel (replaced once cancelled). */
  queuedTaskId: string;
  /** A file for DELETE (replaced once deleted). */
  spareFileId: string;
}
const fixtures: Partial<Record<"user" | "admin", Fixture>> = {};

/** A string that must never come back in an error message. */
const MARK = "Zq9xMARK";

// ---- error codes documented in docs/api.md ----------------------------------------------------------

const DOCUMENTED_CODES = (() => {
  const doc = fs.readFileSync(path.join(import.meta.dirname, "../../docs/api.md"), "utf8");
  const table = doc.slice(doc.indexOf("## Error codes"));
  return new Set([...table.matchAll(/^\| \d{3}|^\| 4xx/gm)].length > 0 ? codesIn(table) : []);
})();
function codesIn(table: string): string[] {
  return [...table.matchAll(/^\|\s*(?:\d{3}|4xx)\s*\|\s*`([A-Z_]+)`/gm)].map((m) => m[1] as string);
}

// ---- a deterministic generator --------------------------------------------------------------------

function rng(seed: number) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let x = s;
    x = Math.imul(x ^ (x >>> 15), x | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}
function sample<T>(items: T[], n: number, seed: number): T[] {
  if (items.length <= n) return items;
  const next = rng(seed);
  const copy = [...items];
  for (let i = copy.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [copy[i], copy[j]] = [copy[j] as T, copy[i] as T];
  }
  return copy.slice(0, n);
}
const hash = (s: string) => [...s].reduce((h, c) => (Math.imul(h, 31) + (c.codePointAt(0) ?? 0)) | 0, 7);

// ---- hostile values ---------------------------------------------------------------------------------

const MB = "x".repeat(1024 * 1024);

/** JSON fragments to put where a field's value goes (raw text: some are not what JSON.stringify makes). */
const JSON_VALUES: string[] = [
  `"${MARK}"`,
  `""`,
  `" "`,
  "0",
  "-0",
  "1",
  "-1",
  "1.5",
  "1e400",
  "-1e400",
  "9007199254740993",
  "123456789012345678901234567890",
  "true",
  "false",
  "null",
  "[]",
  `["${MARK}"]`,
  "[null]",
  "[1]",
  "{}",
  `{"<${MARK}>":1}`,
  `"NaN"`,
  `"Infinity"`,
  `"-0"`,
  `"1e3"`,
  `"0x10"`,
  `"007"`,
  `"+1"`,
  `" 1"`,
  `"١٢٣"`,
  `"${MARK}\\u0000"`,
  `"${MARK}\\ud800"`,
  `"\\udc00${MARK}"`,
  `"e\\u0301${MARK}"`,
  `"${MARK}${MB}"`,
  `"__proto__"`,
  `{"__proto__":{"x":1}}`,
];

/** Path parameter values, as they go in the URL (already escaped where they are escapes). */
const PATH_VALUES: string[] = [
  MARK,
  "0",
  "-1",
  "+1",
  "%2B1",
  "%201",
  "1%20",
  "007",
  "0x10",
  "1e3",
  "1.0",
  "%D9%A1%D9%A2%D9%A3", // ١٢٣
  "%EF%BC%91", // fullwidth 1
  "%00",
  `${MARK}%00`,
  "%2F",
  `${MARK}%2F..%2F..`,
  "..",
  "%2e%2e",
  ".",
  "%5C",
  "9007199254740993",
  "999999999999999999999",
  "9".repeat(16),
  `${MARK}${"a".repeat(20_000)}`,
  "e%CC%81", // e + combining acute (NFD)
  "%C3%A9", // é (NFC)
  "%ED%A0%80", // a lone surrogate, UTF-8 encoded (not valid UTF-8)
  "%C0%AF", // an overlong '/'
  "%F0%9F%98%80",
  "%25",
  "%zz",
  "%",
  "*",
  "%3F",
  "%23",
];

/** Query values for a known field, as they go in the query string. */
const QUERY_VALUES: string[] = [
  MARK,
  "",
  "%20",
  "0",
  "-1",
  "-0",
  "+1",
  "1e2",
  "0x10",
  "1.5",
  "NaN",
  "Infinity",
  "9007199254740993",
  "1".repeat(400),
  "%D9%A1%D9%A2%D9%A3",
  "%00",
  `${MARK}%00`,
  "%ED%A0%80",
  "%zz",
  "true",
  "null",
  "[]",
  "{}",
  `${MARK}${"q".repeat(100_000)}`,
];

// ---- requests and the checks of their answers -------------------------------------------------------

interface Req {
  method: string;
  url: string;
  headers?: Record<string, string>;
  payload?: string | Buffer;
  /** What the variation is, for the failure message. */
  what: string;
}

interface Answer {
  status: number;
  headers: Record<string, string | string[] | number | undefined>;
  body: string;
}

const REQUEST_BOUND_MS = 10_000;

function bounded<T>(p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`no answer within ${REQUEST_BOUND_MS} ms: ${what}`)),
        REQUEST_BOUND_MS,
      );
    }),
  ]);
}

async function send(req: Req): Promise<Answer> {
  const res = await bounded(
    t.app.inject({
      method: req.method as "GET",
      url: req.url,
      headers: req.headers ?? {},
      ...(req.payload === undefined ? {} : { payload: req.payload }),
    }),
    req.what,
  );
  return { status: res.statusCode, headers: res.headers, body: res.body };
}

/** What every answer must be: problems found, as text (empty: none). */
function problemsOf(req: Req, res: Answer, echo: string[]): string[] {
  const problems: string[] = [];
  const where = `${req.method} ${req.url.slice(0, 120)} [${req.what}] → ${res.status}`;
  if (res.status >= 500) problems.push(`${where}: a 5xx: ${res.body.slice(0, 200)}`);
  if (res.status < 400) return problems;
  // The documented answers that are not envelopes.
  if (res.status === 406 && req.url.includes("/events")) return problems;
  if (res.status === 405 && req.method === "HEAD") return problems;
  let body: unknown;
  try {
    body = JSON.parse(res.body);
  } catch {
    problems.push(`${where}: not JSON: ${res.body.slice(0, 200)}`);
    return problems;
  }
  const keys = body && typeof body === "object" ? Object.keys(body).sort() : [];
  if (keys.join() !== "code,message") problems.push(`${where}: not an envelope: ${res.body.slice(0, 200)}`);
  const { code, message } = body as { code?: unknown; message?: unknown };
  if (typeof code !== "string" || !DOCUMENTED_CODES.has(code))
    problems.push(`${where}: a code not in docs/api.md: ${String(code)}`);
  if (typeof message !== "string") problems.push(`${where}: no message`);
  else {
    for (const e of [MARK, ...echo])
      if (e.length >= 4 && message.includes(e))
        problems.push(`${where}: the message echoes the input: ${message.slice(0, 200)}`);
    if (message.length > 300) problems.push(`${where}: a message of ${message.length} characters`);
  }
  const type = String(res.headers["content-type"] ?? "");
  if (!type.startsWith("application/json")) problems.push(`${where}: content-type ${type}`);
  return problems;
}

/** Rows and stored objects a refused request must leave as they were. */
async function counts(withStore: boolean): Promise<string> {
  const [row] = await t.db.sql`
    select (select count(*) from files)::int as files, (select count(*) from tasks)::int as tasks,
           (select count(*) from runs)::int as runs, (select count(*) from task_events)::int as events`;
  const objects = withStore ? (await t.storage.list("files/", { limit: 100_000 })).length : undefined;
  return JSON.stringify({ ...row, objects });
}

const found: string[] = [];

/** Sends `req`, checks its answer, and for a mutation that was refused that nothing changed. */
async function probe(req: Req, o: { mutates?: boolean; echo?: string[] } = {}): Promise<Answer> {
  // The store is looked at where a request may write to it (an upload, a delete).
  const withStore = req.url.startsWith("/api/files");
  const before = o.mutates ? await counts(withStore) : "";
  let res: Answer;
  try {
    res = await send(req);
  } catch (err) {
    found.push(`${req.method} ${req.url.slice(0, 120)} [${req.what}]: ${(err as Error).message}`);
    return { status: 0, headers: {}, body: "" };
  }
  found.push(...problemsOf(req, res, o.echo ?? []));
  if (o.mutates && res.status >= 400) {
    const now = await counts(withStore);
    if (now !== before)
      found.push(
        `${req.method} ${req.url.slice(0, 120)} [${req.what}] → ${res.status} changed ${before} to ${now}`,
      );
  }
  return res;
}

// ---- fixtures ------------------------------------------------------------------------------------

const upload = (token: string, content?: string) => uploadedFileId(t.app, token, content);

async function queuedTask(token: string, fileId: string): Promise<string> {
  const res = await t.app.inject({
    method: "POST",
    url: "/api/analysis-tasks",
    payload: { analysisType: "summary", inputFileId: fileId },
    headers: bearer(token),
  });
  assert.equal(res.statusCode, 201, res.body);
  return res.json().data.taskId;
}

/** A task of one succeeded run with `summary.json`, as a worker leaves it. */
async function succeededTask(token: string, fileId: string): Promise<{ taskId: string; runId: string }> {
  const taskId = await queuedTask(token, fileId);
  const { sql } = t.db;
  await sql`update runs set status = 'starting' where task_id = ${taskId}`;
  const [run] = await sql<{ id: string; key: string }[]>`
    update runs set status = 'succeeded', output_key = task_id::text || '/' || id::text || '.1.ab',
      result = jsonb_build_object('outputFileName', 'summary.json',
                                  'files', jsonb_build_array(jsonb_build_object('name', 'summary.json', 'size', 2)))
    where task_id = ${taskId} returning id::text, output_key as key`;
  await sql`update tasks set status = 'succeeded', succeeded_count = total_count where id = ${taskId}`;
  await t.storage.put(
    outputObjectKey(run?.key as string, "summary.json"),
    Readable.from([Buffer.from("{}")]),
  );
  return { taskId, runId: run?.id as string };
}

async function makeFixture(who: "user" | "admin"): Promise<Fixture> {
  const token = tokens[who];
  const fileId = await upload(token);
  const { taskId, runId } = await succeededTask(token, fileId);
  return {
    fileId,
    taskId,
    runId,
    name: "summary.json",
    queuedTaskId: await queuedTask(token, fileId),
    spareFileId: await upload(token, `spare\n${who}\n`),
  };
}

/** Replaces what a request that succeeded used up (a deleted file, a cancelled task). */
async function replenish(who: "user" | "admin", route: string, method: string): Promise<void> {
  const f = fixtures[who] as Fixture;
  if (method === "DELETE" && route === "/api/files/{fileId}")
    f.spareFileId = await upload(tokens[who], `spare\n${Math.random()}\n`);
  if (route.endsWith("/cancel")) f.queuedTaskId = await queuedTask(tokens[who], f.fileId);
}

before(async () => {
  t = await startTestApp();
  tokens.user = await t.token("alice");
  tokens.admin = await t.token("root", "admin");
  fixtures.user = await makeFixture("user");
  fixtures.admin = await makeFixture("admin");
  await t.app.listen({ port: 0, host: "127.0.0.1" });
  port = (t.app.server.address() as AddressInfo).port;
});
after(() => t.close());

// ---- the routes, from the OpenAPI document ----------------------------------------------------------

interface Operation {
  path: string;
  method: string;
  params: string[];
  query: Record<string, { type?: string }>;
  body: boolean;
  multipart: boolean;
  mutates: boolean;
  auth: boolean;
}

async function operations(): Promise<Operation[]> {
  const res = await t.app.inject({ url: "/docs/json" });
  assert.equal(res.statusCode, 200);
  const doc = res.json() as {
    paths: Record<
      string,
      Record<
        string,
        {
          parameters?: { in: string; name: string; schema?: { type?: string } }[];
          requestBody?: { content: Record<string, unknown> };
          security?: unknown[];
        }
      >
    >;
  };
  const ops: Operation[] = [];
  for (const [p, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) {
      const parameters = op.parameters ?? [];
      const content = Object.keys(op.requestBody?.content ?? {});
      ops.push({
        path: p,
        method: method.toUpperCase(),
        params: parameters.filter((x) => x.in === "path").map((x) => x.name),
        query: Object.fromEntries(
          parameters.filter((x) => x.in === "query").map((x) => [x.name, x.schema ?? {}]),
        ),
        body: content.includes("application/json"),
        multipart: content.includes("multipart/form-data") || (method === "post" && p === "/api/files"),
        mutates: method !== "get",
        auth: op.security !== undefined,
      });
    }
  }
  return ops;
}

/** A valid value of each path parameter for `who`. */
function paramValues(op: Operation, who: "user" | "admin"): Record<string, string> {
  const f = fixtures[who] as Fixture;
  // Placeholders for what a request that succeeds uses up: filled in when it is sent (probe).
  const taskId = op.path.endsWith("/cancel") ? "{{queuedTaskId}}" : f.taskId;
  const fileId = op.method === "DELETE" ? "{{spareFileId}}" : f.fileId;
  return { taskId, runId: f.runId, fileId, name: f.name };
}

const urlOf = (op: Operation, values: Record<string, string>, query = "") =>
  op.path.replace(/\{(\w+)\}/g, (_, name: string) => values[name] ?? "") + (query ? `?${query}` : "");

/** A valid JSON body of the create route for `who`, as fields of raw JSON text. */
function createFields(who: "user" | "admin", kind: number): [string, string][] {
  const f = fixtures[who] as Fixture;
  const fields: [string, string][][] = [
    [
      ["analysisType", `"summary"`],
      ["inputFileId", `"${f.fileId}"`],
    ],
    [
      ["analysisType", `"python-stats"`],
      ["inputFileIds", `["${f.fileId}"]`],
      ["parameters", `{"method":"mean","columns":["a"]}`],
    ],
    [
      ["analysisType", `"r-report"`],
      ["inputFileId", `"${f.fileId}"`],
      ["parameters", `{"title":"t"}`],
      ...(who === "admin" ? ([["priority", "3"]] as [string, string][]) : []),
    ],
  ];
  return fields[kind % fields.length] as [string, string][];
}
const objectOf = (fields: [string, string][]) =>
  `{${fields.map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(",")}}`;

/** Hostile variations of a JSON body made of `fields` (the nested ones too, by their path). */
function bodyVariations(
  fields: [string, string][],
): { what: string; payload: string; contentType?: string }[] {
  const out: { what: string; payload: string; contentType?: string }[] = [];
  const valid = objectOf(fields);
  for (const [i, [k]] of fields.entries()) {
    for (const v of JSON_VALUES) {
      const copy = fields.map((f, j) => (j === i ? ([k, v] as [string, string]) : f));
      out.push({ what: `body.${k} = ${v.slice(0, 30)}`, payload: objectOf(copy) });
    }
    out.push({ what: `body.${k} missing`, payload: objectOf(fields.filter((_, j) => j !== i)) });
    out.push({ what: `body.${k} twice`, payload: objectOf([...fields, fields[i] as [string, string]]) });
  }
  // Nested: each parameter, and each file id in a list.
  for (const [k, v] of fields) {
    if (k === "parameters") {
      const inner = JSON.parse(v) as Record<string, unknown>;
      for (const name of [...Object.keys(inner), `<${MARK}>`]) {
        for (const hv of JSON_VALUES) {
          const p = `{${Object.entries(inner)
            .filter(([n]) => n !== name)
            .map(([n, x]) => `${JSON.stringify(n)}:${JSON.stringify(x)}`)
            .concat(`${JSON.stringify(name)}:${hv}`)
            .join(",")}}`;
          out.push({
            what: `body.parameters.${name} = ${hv.slice(0, 30)}`,
            payload: objectOf(fields.map((f) => (f[0] === k ? [k, p] : f))),
          });
        }
      }
    }
    if (k === "inputFileIds")
      for (const hv of JSON_VALUES)
        out.push({
          what: `body.inputFileIds[1] = ${hv.slice(0, 30)}`,
          payload: objectOf(
            fields.map((f) =>
              f[0] === k ? [k, `[${JSON.parse(v)[0] ? `"${JSON.parse(v)[0]}"` : ""},${hv}]`] : f,
            ),
          ),
        });
  }
  out.push({ what: "an extra field", payload: objectOf([...fields, [`<${MARK}>`, "1"]]) });
  out.push({
    what: "an extra field with a long name",
    payload: objectOf([...fields, [`${MARK}${"n".repeat(100)}`, "1"]]),
  });
  out.push({ what: "an extra __proto__", payload: objectOf([...fields, ["__proto__", `{"priority":0}`]]) });
  out.push({
    what: "a constructor.prototype",
    payload: objectOf([...fields, ["constructor", `{"prototype":{"x":1}}`]]),
  });
  out.push({ what: "a BOM", payload: `\ufeff${valid}` });
  out.push({ what: "an empty body", payload: "" });
  out.push({ what: "whitespace", payload: "   " });
  for (const v of ["null", "[]", "1", `"${MARK}"`, "true", "[{}]"])
    out.push({ what: `body = ${v}`, payload: v });
  out.push({ what: "a cut body", payload: valid.slice(0, -3) });
  out.push({ what: "trailing garbage", payload: `${valid}${MARK}` });
  out.push({ what: "two bodies", payload: `${valid}${valid}` });
  out.push({ what: "a lone surrogate in a key", payload: objectOf([...fields, [`\ud800${MARK}`, "1"]]) });
  out.push({ what: "a raw NUL", payload: valid.replace("{", `{\u0000`) });
  for (const ct of [
    "text/plain",
    "application/json; charset=latin1",
    "application/json; charset=utf-16",
    "application/json; charset=UTF-8",
    `application/json; charset=${MARK}`,
    "application/x-www-form-urlencoded",
    "application/json-patch+json",
    "application/problem+json",
    "application/xml",
    "multipart/form-data",
    "multipart/form-data; boundary=x",
    "",
    "*/*",
    `${MARK}/${MARK}`,
    "application/json, text/plain",
  ])
    out.push({ what: `content-type ${ct}`, payload: valid, contentType: ct });
  out.push({ what: "no content-type", payload: valid, contentType: "none" });
  return out;
}

/** A multipart body of `parts` (each its head lines and content) with `boundary`, closed or not. */
function form(parts: [string, string | Buffer][], boundary = "b0undary", close = true): Buffer {
  const chunks: Buffer[] = [];
  for (const [head, content] of parts) {
    chunks.push(Buffer.from(`--${boundary}\r\n${head}\r\n\r\n`), Buffer.from(content), Buffer.from("\r\n"));
  }
  if (close) chunks.push(Buffer.from(`--${boundary}--\r\n`));
  return Buffer.concat(chunks);
}
const fileHead = (name = "data.csv", type = "text/csv", field = "file") =>
  `Content-Disposition: form-data; name="${field}"; filename="${name}"\r\nContent-Type: ${type}`;

/** Hostile uploads: the form, its parts' names and types, the body's type. */
function uploadVariations(): { what: string; payload: Buffer | string; headers: Record<string, string> }[] {
  const mp = (boundary = "b0undary") => ({ "content-type": `multipart/form-data; boundary=${boundary}` });
  const out: { what: string; payload: Buffer | string; headers: Record<string, string> }[] = [];
  const valid = form([[fileHead(), "a,b\n1,2\n"]]);
  for (const name of [
    `../../${MARK}`,
    `${MARK}\u0000.csv`,
    `${MARK}\r\n.csv`,
    `${MARK}%00`,
    "",
    ".",
    "..",
    `${MARK}${"n".repeat(2000)}`,
    "e\u0301.csv",
    "\\server\\share",
  ])
    out.push({
      what: `filename ${name.slice(0, 20)}`,
      payload: form([[fileHead(name), "x\n"]]),
      headers: mp(),
    });
  for (const type of [MARK, "", `text/csv; charset=${MARK}`, `${MARK}/${MARK}\u0000`, "x".repeat(300)])
    out.push({
      what: `part type ${type.slice(0, 20)}`,
      payload: form([[fileHead("a.csv", type), "x\n"]]),
      headers: mp(),
    });
  for (const field of [MARK, "", "File", "file[]", `file\u0000`])
    out.push({
      what: `field ${field}`,
      payload: form([[fileHead("a.csv", "text/csv", field), "x\n"]]),
      headers: mp(),
    });
  out.push({
    what: "no file part",
    payload: form([[`Content-Disposition: form-data; name="x"`, MARK]]),
    headers: mp(),
  });
  out.push({
    what: "a field named file",
    payload: form([[`Content-Disposition: form-data; name="file"`, MARK]]),
    headers: mp(),
  });
  out.push({
    what: "11 fields first",
    payload: form([
      ...Array.from(
        { length: 11 },
        (_, i) => [`Content-Disposition: form-data; name="f${i}"`, "v"] as [string, string],
      ),
      [fileHead(), "x\n"],
    ]),
    headers: mp(),
  });
  out.push({ what: "not closed", payload: form([[fileHead(), "a,b\n"]], "b0undary", false), headers: mp() });
  out.push({ what: "cut in the part head", payload: valid.subarray(0, 30), headers: mp() });
  out.push({ what: "another boundary", payload: valid, headers: mp("other") });
  out.push({ what: "no boundary", payload: valid, headers: { "content-type": "multipart/form-data" } });
  out.push({
    what: "an empty boundary",
    payload: valid,
    headers: { "content-type": "multipart/form-data; boundary=" },
  });
  out.push({
    what: `a boundary of 200 characters`,
    payload: form([[fileHead(), "x"]], "b".repeat(200)),
    headers: mp("b".repeat(200)),
  });
  out.push({
    what: "a charset",
    payload: valid,
    headers: { "content-type": "multipart/form-data; boundary=b0undary; charset=latin1" },
  });
  out.push({
    what: "a malformed part head",
    payload: Buffer.from(`--b0undary\r\n${MARK}\r\n\r\nx\r\n--b0undary--\r\n`),
    headers: mp(),
  });
  out.push({ what: "an empty body", payload: "", headers: mp() });
  out.push({ what: "JSON", payload: `{"file":"${MARK}"}`, headers: { "content-type": "application/json" } });
  out.push({ what: "text", payload: MARK, headers: { "content-type": "text/plain" } });
  out.push({
    what: "a form",
    payload: `file=${MARK}`,
    headers: { "content-type": "application/x-www-form-urlencoded" },
  });
  out.push({ what: "no content-type", payload: valid, headers: {} });
  out.push({
    what: "a body with a BOM",
    payload: Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), valid]),
    headers: mp(),
  });
  return out;
}

/** Hostile headers every authenticated route gets. */
function headerVariations(): { what: string; headers: Record<string, string> }[] {
  return [
    { what: "a huge Idempotency-Key", headers: { "idempotency-key": MARK + "k".repeat(10_000) } },
    { what: "an Idempotency-Key of 201 characters", headers: { "idempotency-key": "k".repeat(201) } },
    { what: "an empty Idempotency-Key", headers: { "idempotency-key": "" } },
    { what: "an Idempotency-Key with a space", headers: { "idempotency-key": `${MARK} x` } },
    { what: "an Idempotency-Key with a tab", headers: { "idempotency-key": `${MARK}\tx` } },
    { what: "a Last-Event-ID", headers: { "last-event-id": MARK } },
    { what: "a Last-Event-ID past 2^63", headers: { "last-event-id": "9".repeat(18) } },
    { what: "a Range", headers: { range: `bytes=${MARK}` } },
    { what: "a Range past the end", headers: { range: "bytes=99999999999999999999-" } },
    { what: "an If-None-Match", headers: { "if-none-match": `"${MARK}"` } },
    { what: "an Accept of JSON", headers: { accept: "application/json" } },
    { what: "an Accept of nonsense", headers: { accept: MARK } },
    { what: "a Content-Encoding", headers: { "content-encoding": "gzip" } },
    { what: "a X-Request-Id", headers: { "x-request-id": `${MARK}\u00e9` } },
  ];
}

function queryVariations(op: Operation): string[] {
  const out: string[] = [];
  for (const name of Object.keys(op.query)) {
    for (const v of QUERY_VALUES) out.push(`${name}=${v}`);
    out.push(
      `${name}=1&${name}=2`,
      `${name}[]=x`,
      `${name}[]=1&${name}[]=2`,
      `${name}[0]=1`,
      `${name}`,
      `${name}=`,
    );
    out.push(`${name}.x=1`, `${encodeURIComponent(name).toUpperCase()}=1`);
  }
  out.push(
    `%3C${MARK}%3E=1`,
    `${MARK}%0A=1`,
    `${MARK}${"k".repeat(60)}=1`,
    `x=${MARK}`,
    `__proto__=1`,
    `constructor[prototype]=1`,
    "&&&",
    "=",
    "%00=1",
    `%ED%A0%80=${MARK}`,
    `${"k".repeat(100)}=1`,
  );
  return out;
}

/** Every variation of `op` for `who`: requests and whether each changes anything if accepted. */
function variations(op: Operation, who: "user" | "admin"): Req[] {
  const values = paramValues(op, who);
  const auth = op.auth ? bearer(tokens[who]) : {};
  const reqs: Req[] = [];
  for (const name of op.params)
    for (const v of PATH_VALUES)
      reqs.push({
        method: op.method,
        url: urlOf(op, { ...values, [name]: v }),
        headers: auth,
        what: `${name} = ${v.slice(0, 30)}`,
      });
  for (const q of queryVariations(op))
    reqs.push({ method: op.method, url: urlOf(op, values, q), headers: auth, what: `?${q.slice(0, 40)}` });
  // An upload's header variations carry a valid form, so that the header is what decides.
  const base = op.multipart
    ? {
        payload: form([[fileHead(), "h,i\n1,2\n"]]),
        type: { "content-type": "multipart/form-data; boundary=b0undary" },
      }
    : { type: {} };
  for (const h of headerVariations())
    reqs.push({
      method: op.method,
      url: urlOf(op, values),
      headers: { ...auth, ...base.type, ...h.headers },
      ...(base.payload === undefined ? {} : { payload: base.payload }),
      what: h.what,
    });
  if (op.body) {
    const kinds = op.path === "/api/analysis-tasks" ? 3 : 1;
    for (let kind = 0; kind < kinds; kind++)
      for (const b of bodyVariations(createFields(who, kind))) {
        const headers: Record<string, string> = { ...auth };
        if (b.contentType !== "none") headers["content-type"] = b.contentType ?? "application/json";
        reqs.push({ method: op.method, url: urlOf(op, values), headers, payload: b.payload, what: b.what });
      }
  } else if (op.multipart) {
    for (const u of uploadVariations())
      reqs.push({
        method: op.method,
        url: urlOf(op, values),
        headers: { ...auth, ...u.headers },
        payload: u.payload,
        what: u.what,
      });
  } else if (op.method !== "GET") {
    // A route without a body, sent one.
    for (const [ct, payload] of [
      ["application/json", ""],
      ["application/json", "{}"],
      ["application/json", `{"x":"${MARK}"}`],
      ["application/json", `{${MARK}`],
      ["text/plain", MARK],
      ["application/xml", `<${MARK}/>`],
    ] as const)
      reqs.push({
        method: op.method,
        url: urlOf(op, values),
        headers: { ...auth, "content-type": ct },
        payload,
        what: `a body ${ct} ${payload.slice(0, 20)}`,
      });
  }
  if (op.auth) {
    for (const a of [
      "",
      "Bearer",
      `Bearer ${MARK}`,
      `Basic ${MARK}`,
      `Bearer ${tokens[who]} x`,
      `Bearer ${tokens[who]}\u00e9`,
    ])
      reqs.push({
        method: op.method,
        url: urlOf(op, values),
        headers: { authorization: a },
        what: `authorization ${a.slice(0, 12)}`,
      });
  }
  return reqs;
}

/** How many variations of each route are sent per principal (sampled with a fixed seed). */
const PER_ROUTE = Number(process.env.ASSAY_HOSTILE_PER_ROUTE) || 1000;

describe("every route of the OpenAPI document, hostile variations", () => {
  test("no 5xx, no hang, an envelope with a documented code and no echo, nothing half-written", async () => {
    const ops = await operations();
    // The document lists the API's routes (a route left out would go untested).
    for (const p of [
      "/api/files",
      "/api/analysis-tasks",
      "/api/analysis-tasks/{taskId}/runs/{runId}/outputs/{name}",
    ])
      assert.ok(
        ops.some((o) => o.path === p),
        p,
      );
    assert.ok(DOCUMENTED_CODES.has("VALIDATION_FAILED") && DOCUMENTED_CODES.size > 15);
    let sent = 0;
    for (const op of ops) {
      for (const who of ["user", "admin"] as const) {
        const all = variations(op, who);
        const chosen = sample(all, PER_ROUTE, hash(`${op.method} ${op.path} ${who}`));
        for (const req of chosen) {
          const f = fixtures[who] as Fixture;
          const url = req.url
            .replace("{{queuedTaskId}}", f.queuedTaskId)
            .replace("{{spareFileId}}", f.spareFileId);
          const res = await probe({ ...req, url }, { mutates: op.mutates });
          sent++;
          if (res.status >= 200 && res.status < 300 && op.mutates) await replenish(who, op.path, op.method);
        }
      }
    }
    assert.ok(sent > 1000, `${sent} requests`);
    assert.deepEqual(found, [], `${found.length} problems:\n${found.slice(0, 60).join("\n")}`);
  });
});

// ---- the defects this test found, pinned -----------------------------------------------------------

describe("defects found", () => {
  test("an integer query value of over 308 digits is 400 naming the bound (Ajv made it Infinity: a 500)", async () => {
    for (const url of [
      "/api/files",
      "/api/analysis-tasks",
      `/api/analysis-tasks/${fixtures.user?.taskId}/logs`,
    ]) {
      for (const digits of ["1".repeat(400), `000${"9".repeat(16)}`, "9".repeat(309)]) {
        const res = await t.app.inject({ url: `${url}?limit=${digits}`, headers: bearer(tokens.user) });
        assert.equal(res.statusCode, 400, `${url} ${digits.length}: ${res.body}`);
        assert.match(res.json().message, /^querystring\/limit must be <= \d+$/);
      }
      // Leading zeros still count for nothing.
      const padded = await t.app.inject({
        url: `${url}?limit=${"0".repeat(40)}7`,
        headers: bearer(tokens.user),
      });
      assert.equal(padded.statusCode, 200, padded.body);
    }
  });

  test("an unknown field is named only when its name is plain; other names are not sent back", async () => {
    const create = (key: string) =>
      t.app.inject({
        method: "POST",
        url: "/api/analysis-tasks",
        payload: `{"analysisType":"summary","inputFileId":"${fixtures.user?.fileId}",${JSON.stringify(key)}:1}`,
        headers: { ...bearer(tokens.user), "content-type": "application/json" },
      });
    for (const key of [`<img src=x>${MARK}`, `${MARK}\n`, `\ud800${MARK}`, `${MARK}${"n".repeat(60)}`]) {
      const res = await create(key);
      assert.equal(res.statusCode, 400);
      assert.deepEqual(res.json(), {
        code: "VALIDATION_FAILED",
        message: "body has a field that is not known.",
      });
    }
    assert.equal((await create("colour")).json().message, "body/colour is not a known field.");
    const query = await t.app.inject({ url: `/api/files?%3Cb%3E${MARK}=1`, headers: bearer(tokens.user) });
    assert.deepEqual(query.json(), {
      code: "VALIDATION_FAILED",
      message: "querystring has a field that is not known.",
    });
    const bracket = await t.app.inject({ url: "/api/files?status[]=x", headers: bearer(tokens.user) });
    assert.equal(bracket.json().message, "querystring/status[] is not a known field.");
  });
});

// ---- over a real socket: what inject cannot send -------------------------------------------------

/** Sends `bytes` as they are on a fresh connection; resolves with the status and body (bounded). */
function raw(bytes: Buffer | string): Promise<{ status: number; body: string }> {
  return bounded(
    new Promise((resolve, reject) => {
      // Written, not ended: every request says `Connection: close`, and the server closes.
      const socket = net.connect(port, "127.0.0.1", () => socket.write(bytes));
      const chunks: Buffer[] = [];
      socket.on("data", (d: Buffer) => chunks.push(d));
      socket.on("error", reject);
      socket.on("close", () => {
        const out = Buffer.concat(chunks).toString("latin1");
        const at = out.indexOf("\r\n\r\n");
        let body = out.slice(at + 4);
        // A chunked answer: its one chunk.
        if (/transfer-encoding: chunked/i.test(out.slice(0, at))) body = body.split("\r\n")[1] ?? "";
        resolve({
          status: Number(/^HTTP\/1\.1 (\d{3})/.exec(out)?.[1] ?? 0),
          body: Buffer.from(body, "latin1").toString("utf8"),
        });
      });
    }),
    "a raw request",
  );
}

describe("raw bytes over a socket", () => {
  test("control characters, raw bytes and odd framing: answered in an envelope, never a 5xx, nothing written", async () => {
    const f = fixtures.user as Fixture;
    const auth = `Authorization: Bearer ${tokens.user}`;
    const create = JSON.stringify({ analysisType: "summary", inputFileId: f.fileId });
    const post = (headers: string, body: Buffer | string) =>
      Buffer.concat([
        Buffer.from(
          `POST /api/analysis-tasks HTTP/1.1\r\nHost: x\r\n${auth}\r\nConnection: close\r\n${headers}Content-Length: ${Buffer.byteLength(body)}\r\n\r\n`,
          "latin1",
        ),
        Buffer.isBuffer(body) ? body : Buffer.from(body),
      ]);
    const cases: [string, Buffer | string][] = [
      [
        "an Idempotency-Key with a control character",
        post(`Content-Type: application/json\r\nIdempotency-Key: ${MARK}\x01x\r\n`, create),
      ],
      [
        "an Idempotency-Key with DEL",
        post(`Content-Type: application/json\r\nIdempotency-Key: ${MARK}\x7fx\r\n`, create),
      ],
      [
        "an Idempotency-Key with Latin-1 bytes",
        post(`Content-Type: application/json\r\nIdempotency-Key: ${MARK}\xff\xe9\r\n`, create),
      ],
      [
        "an Idempotency-Key of 20 KB",
        post(`Content-Type: application/json\r\nIdempotency-Key: ${MARK}${"k".repeat(20_000)}\r\n`, create),
      ],
      [
        "a NUL in a header",
        post(`Content-Type: application/json\r\nIdempotency-Key: ${MARK}\x00\r\n`, create),
      ],
      [
        "a JSON body of invalid UTF-8",
        post(
          "Content-Type: application/json\r\n",
          Buffer.concat([
            Buffer.from(`{"analysisType":"r-report","inputFileId":"${f.fileId}","parameters":{"title":"`),
            Buffer.from([0xff, 0xfe, 0xed, 0xa0, 0x80]),
            Buffer.from(`"}}`),
          ]),
        ),
      ],
      [
        "a JSON body in UTF-16",
        post("Content-Type: application/json; charset=utf-16le\r\n", Buffer.from(create, "utf16le")),
      ],
      [
        "a JSON body in UTF-16 with its BOM",
        post(
          "Content-Type: application/json\r\n",
          Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(create, "utf16le")]),
        ),
      ],
      [
        "a JSON body with a BOM",
        post(
          "Content-Type: application/json\r\n",
          Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(create)]),
        ),
      ],
      ["two Content-Types", post("Content-Type: text/xml\r\nContent-Type: application/json\r\n", create)],
      ["a Content-Type with a NUL", post("Content-Type: application/json\x00\r\n", create)],
      ["gzip", post("Content-Type: application/json\r\nContent-Encoding: gzip\r\n", create)],
      [
        "a body shorter than its length",
        Buffer.from(
          `POST /api/analysis-tasks HTTP/1.1\r\nHost: x\r\n${auth}\r\nContent-Type: application/json\r\nContent-Length: 5\r\nConnection: close\r\n\r\n${create}`,
        ),
      ],
      [
        "Content-Length and chunked",
        Buffer.from(
          `POST /api/analysis-tasks HTTP/1.1\r\nHost: x\r\n${auth}\r\nContent-Type: application/json\r\nContent-Length: ${create.length}\r\nTransfer-Encoding: chunked\r\n\r\n${create.length.toString(16)}\r\n${create}\r\n0\r\n\r\n`,
        ),
      ],
      [
        "a bad chunk",
        Buffer.from(
          `POST /api/analysis-tasks HTTP/1.1\r\nHost: x\r\n${auth}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n${create}\r\n0\r\n\r\n`,
        ),
      ],
      [
        "a raw NUL in the path",
        `GET /api/analysis-tasks/${f.taskId}\x00${MARK} HTTP/1.1\r\nHost: x\r\n${auth}\r\nConnection: close\r\n\r\n`,
      ],
      [
        "raw UTF-8 in the path",
        Buffer.concat([
          Buffer.from("GET /api/analysis-tasks/"),
          Buffer.from("١٢٣"),
          Buffer.from(` HTTP/1.1\r\nHost: x\r\n${auth}\r\nConnection: close\r\n\r\n`),
        ]),
      ],
      [
        "a raw lone surrogate in the path",
        Buffer.concat([
          Buffer.from("GET /api/files/"),
          Buffer.from([0xed, 0xa0, 0x80]),
          Buffer.from(` HTTP/1.1\r\nHost: x\r\n${auth}\r\nConnection: close\r\n\r\n`),
        ]),
      ],
      [
        "raw Latin-1 in the query",
        Buffer.concat([
          Buffer.from("GET /api/files?cursor="),
          Buffer.from([0xe9, 0xff]),
          Buffer.from(` HTTP/1.1\r\nHost: x\r\n${auth}\r\nConnection: close\r\n\r\n`),
        ]),
      ],
      [
        "a tab in the path",
        `GET /api/files/1\t2 HTTP/1.1\r\nHost: x\r\n${auth}\r\nConnection: close\r\n\r\n`,
      ],
      [
        "an absolute URL",
        `GET http://${MARK}/api/files/${f.fileId} HTTP/1.1\r\nHost: x\r\n${auth}\r\nConnection: close\r\n\r\n`,
      ],
      [
        "a path of 15 KB",
        `GET /api/analysis-tasks/${MARK}${"9".repeat(15_000)} HTTP/1.1\r\nHost: x\r\n${auth}\r\nConnection: close\r\n\r\n`,
      ],
      [
        "a last-event-id with a control character",
        `GET /api/analysis-tasks/${f.taskId}/events HTTP/1.1\r\nHost: x\r\n${auth}\r\nLast-Event-ID: 1\x01${MARK}\r\nConnection: close\r\n\r\n`,
      ],
      [
        "a Last-Event-ID in Latin-1",
        `GET /api/analysis-tasks/${f.taskId}/events HTTP/1.1\r\nHost: x\r\n${auth}\r\nLast-Event-ID: ${MARK}\xe9\r\nConnection: close\r\n\r\n`,
      ],
      [
        "an upload cut off mid-part",
        Buffer.concat([
          Buffer.from(
            `POST /api/files HTTP/1.1\r\nHost: x\r\n${auth}\r\nContent-Type: multipart/form-data; boundary=b0undary\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n`,
          ),
          Buffer.from(
            `40\r\n${form([[fileHead(), "a".repeat(200)]])
              .subarray(0, 64)
              .toString("latin1")}\r\n0\r\n\r\n`,
            "latin1",
          ),
        ]),
      ],
      [
        "an upload whose part name has Latin-1 bytes",
        (() => {
          const body = Buffer.concat([
            Buffer.from(`--b0undary\r\nContent-Disposition: form-data; name="file"; filename="caf`),
            Buffer.from([0xe9, 0x00]),
            Buffer.from(`.csv"\r\nContent-Type: text/csv\r\n\r\nx\r\n--b0undary--\r\n`),
          ]);
          return Buffer.concat([
            Buffer.from(
              `POST /api/files HTTP/1.1\r\nHost: x\r\n${auth}\r\nContent-Type: multipart/form-data; boundary=b0undary\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`,
            ),
            body,
          ]);
        })(),
      ],
    ];
    const problems: string[] = [];
    for (const [what, bytes] of cases) {
      const before = await counts(true);
      const res = await raw(bytes).catch((err: Error) => ({ status: -1, body: err.message }));
      const req: Req = { method: "RAW", url: "", what };
      if (res.status <= 0) problems.push(`${what}: no answer (${res.body})`);
      else
        problems.push(
          ...problemsOf(
            req,
            { status: res.status, headers: { "content-type": "application/json" }, body: res.body },
            [],
          ),
        );
      if (res.status >= 400 && (await counts(true)) !== before)
        problems.push(`${what}: a refusal wrote something`);
    }
    assert.deepEqual(problems, []);
    // The process is still up and answering.
    const health = await fetch(`http://127.0.0.1:${port}/healthz`);
    assert.equal(health.status, 200);
  });
});
