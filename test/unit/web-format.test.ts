// The dashboard's helpers that need no browser: web/format.js (sizes, durations) and the file name a
// download is saved under (web/api.js). They are plain ES modules, imported here as the browser does.
import assert from "node:assert/strict";
import path from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

const WEB = path.resolve(import.meta.dirname, "..", "..", "web");

// Imported by URL: the modules are JavaScript without declarations.
const format = (await import(pathToFileURL(path.join(WEB, "format.js")).href)) as {
  describeEvent(e: { type: string; runId?: string | null; data?: Record<string, unknown> }): string;
  bytes(n: number | null | undefined): string;
  duration(fromIso: string | null, toIso?: string | null): string;
};
const api = (await import(pathToFileURL(path.join(WEB, "api.js")).href)) as {
  fileNameOf(disposition: string | null): string | null;
};

const T0 = Date.parse("2026-01-01T00:00:00.000Z");
const after = (ms: number) => format.duration(new Date(T0).toISOString(), new Date(T0 + ms).toISOString());

test("duration rounds once, to the unit it shows: never '1 min 60 s' or '59 min 60 s'", () => {
  const cases: [number, string][] = [
    [0, "0 ms"],
    [999, "999 ms"],
    [1000, "1 s"],
    [1049, "1 s"],
    [1050, "1.1 s"],
    [59_949, "59.9 s"],
    [59_950, "1 min 0 s"],
    [60_000, "1 min 0 s"],
    [60_499, "1 min 0 s"],
    [60_500, "1 min 1 s"],
    [119_499, "1 min 59 s"],
    [119_500, "2 min 0 s"],
    [119_600, "2 min 0 s"],
    [3_599_499, "59 min 59 s"],
    [3_599_500, "1 h 0 min"],
    [3_599_600, "1 h 0 min"],
    [3_600_000, "1 h 0 min"],
    [3_629_999, "1 h 0 min"],
    [3_630_000, "1 h 1 min"],
    [7_199_999, "2 h 0 min"],
  ];
  for (const [ms, want] of cases) assert.equal(after(ms), want, `${ms} ms`);
  // Every second of the first two hours: the seconds and minutes shown stay below 60.
  for (let ms = 0; ms < 2 * 3_600_000; ms += 250) {
    const shown = after(ms);
    const m = /^(\d+) (?:min|h) (\d+) (?:s|min)$/.exec(shown);
    if (m) assert.ok(Number(m[2]) < 60, `${ms} ms shown as ${shown}`);
  }
  assert.equal(format.duration(null), "");
  assert.equal(after(-5), "");
});

test("bytes re-checks the unit after rounding: 1,048,575 bytes is 1.0 MiB, never 1024 KiB", () => {
  const cases: [number, string][] = [
    [0, "0 B"],
    [1023, "1023 B"],
    [1024, "1.0 KiB"],
    [1535, "1.5 KiB"],
    [10_188, "9.9 KiB"],
    [10_189, "10 KiB"],
    [1_048_063, "1023 KiB"],
    [1_048_064, "1.0 MiB"],
    [1_048_575, "1.0 MiB"],
    [1_048_576, "1.0 MiB"],
    [1_073_741_823, "1.0 GiB"],
    [1024 ** 4 - 1, "1.0 TiB"],
    [1024 ** 5, "1024 TiB"],
  ];
  for (const [n, want] of cases) assert.equal(format.bytes(n), want, `${n} bytes`);
  // Nothing below the top unit shows 1024 or more of it, nor "10.0".
  for (let n = 1000; n < 1024 ** 3 * 2; n = Math.ceil(n * 1.0007)) {
    const [value, unit] = format.bytes(n).split(" ");
    if (unit !== "TiB") assert.ok(Number(value) < 1024, `${n} bytes shown as ${format.bytes(n)}`);
    assert.notEqual(value, "10.0", `${n} bytes`);
  }
  assert.equal(format.bytes(null), "");
});

test("a download's name comes from Content-Disposition: filename* first, then filename", () => {
  const cases: [string | null, string | null][] = [
    [`attachment; filename="summary.json"; filename*=UTF-8''summary.json`, "summary.json"],
    [`attachment; filename="donn_es __.csv"; filename*=UTF-8''donn%C3%A9es%20%CE%B2.csv`, "données β.csv"],
    [`attachment; filename*=utf-8''task-7.zip; filename="other.zip"`, "task-7.zip"],
    [`attachment; filename="say \\"hi\\".txt"`, 'say "hi".txt'],
    ["attachment; filename=plain.csv", "plain.csv"],
    [`attachment; filename="fallback.csv"; filename*=UTF-8''%E0%A4%A`, "fallback.csv"],
    [`attachment; filename="../../etc/passwd"`, "passwd"],
    [`attachment; filename*=UTF-8''..%2F..%5Cx.json`, "x.json"],
    [`attachment; filename=".."`, null],
    ["attachment", null],
    [null, null],
  ];
  for (const [header, want] of cases) assert.equal(api.fileNameOf(header), want, String(header));
});

test("a running task's duration is counted on the server's clock, as its Date headers tell it, however far off the browser's is", async () => {
  const clock = (await import(pathToFileURL(path.join(WEB, "clock.js")).href)) as {
    noteServerDate(header: string | null): void;
  };
  const RealDate = Date;
  const server = RealDate.now();
  const startedAt = new RealDate(server - 5_000).toISOString();
  /** The browser's clock, `skewMs` off the server's: Date.now and `new Date()` alike. */
  const skewed = (skewMs: number) =>
    class extends RealDate {
      constructor(...args: unknown[]) {
        if (args.length === 0) super(RealDate.now() + skewMs);
        else super(...(args as [string]));
      }
      static override now() {
        return RealDate.now() + skewMs;
      }
    } as DateConstructor;
  try {
    for (const skewMs of [-10 * 60_000, 10 * 60_000]) {
      // The browser's clock is ten minutes behind, then ahead, of the server's.
      globalThis.Date = skewed(skewMs);
      clock.noteServerDate(new RealDate(RealDate.now()).toUTCString());
      const shown = format.duration(startedAt);
      assert.match(shown, /^[4-6](\.\d)? s$/, `${skewMs}: ${shown}`);
    }
    // Within the Date header's rounding the browser's own clock is kept.
    globalThis.Date = RealDate;
    clock.noteServerDate(new RealDate(RealDate.now() - 1_000).toUTCString());
    assert.match(format.duration(new RealDate(RealDate.now() - 300).toISOString()), /^3\d\d ms$/);
  } finally {
    globalThis.Date = RealDate;
    clock.noteServerDate(new RealDate().toUTCString());
  }
});

test("the event log: a run its worker gave back (no error code) did not fail; a retried failure names its code", () => {
  assert.equal(
    format.describeEvent({
      type: "run.retry",
      runId: "715",
      data: { status: "queued", attempt: 0, errorCode: null },
    }),
    "put back by its worker (attempt not counted)",
  );
  assert.equal(
    format.describeEvent({
      type: "run.retry",
      runId: "715",
      data: { status: "queued", attempt: 2, errorCode: "ANALYSIS_DEPENDENCY_FAILED" },
    }),
    "attempt 2 failed (ANALYSIS_DEPENDENCY_FAILED); retry",
  );
  // The store was away: the attempt is not counted ("attempt 0 failed" it read), with `refunded` or
  // in an event written before it.
  for (const refunded of [{ refunded: true }, {}])
    assert.equal(
      format.describeEvent({
        type: "run.retry",
        runId: "715",
        data: { status: "queued", attempt: 0, errorCode: "ANALYSIS_STORAGE_UNAVAILABLE", ...refunded },
      }),
      "ANALYSIS_STORAGE_UNAVAILABLE; back in the queue (attempt not counted)",
    );
});
