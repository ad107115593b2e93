// What the client prints for people and draws on a terminal: hostile text (escape sequences, C1
// controls) never reaches the terminal raw, widths are counted in terminal columns (wide characters,
// emoji never split), durations and sizes are rounded as shown, and the live view keeps up with a
// task of 100,000 runs.
import assert from "node:assert/strict";
import { PassThrough } from "node:stream";
import { test } from "node:test";
import { eventLine, problemLine } from "../../src/cli/client-follow.ts";
import { ClientUsageError } from "../../src/client/exit.ts";
import { ApiRequestError } from "../../src/client/http.ts";
import { bytes, displayWidth, fit, jsonLine, Output, pad, seconds, table } from "../../src/client/output.ts";
import { TaskTracker } from "../../src/client/progress.ts";
import { DownloadBars, FollowBars, UploadBars } from "../../src/client/tty.ts";
import type { TaskEvent } from "../../src/http/api-types.ts";
import { waitFor } from "../helpers/queue.ts";

/** A stream that keeps what is written to it, posing as a terminal of `columns` × `rows`. */
function terminal(columns = 100, rows = 40) {
  const stream = new PassThrough();
  let text = "";
  stream.on("data", (c: Buffer) => {
    text += c.toString();
  });
  Object.assign(stream, { isTTY: true, columns, rows });
  return { stream: stream as unknown as NodeJS.WriteStream, text: () => text };
}

// biome-ignore lint/suspicious/noControlCharactersInRegex: looking for control characters is the point
const RAW_CONTROL = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/;

test("notes and errors on stderr carry no escape sequence or C1 control from a name or a message", () => {
  const out = terminal();
  const err = terminal();
  const o = new Output({ json: false, stdout: out.stream, stderr: err.stream });
  // A local file's name in the client's own message, and the server's words in an API error.
  o.note("evil\u001b[2J\u001b[31m.csv changed while it was uploaded \u009b2J");
  const code = o.fail(new ApiRequestError(413, "PAYLOAD_TOO_LARGE", "x\u001b]0;pwned\u0007.csv: too large"));
  assert.equal(code, 2);
  assert.ok(!RAW_CONTROL.test(err.text()), JSON.stringify(err.text()));
  assert.match(
    err.text(),
    /^assay: evil⟨U\+001B⟩\[2J⟨U\+001B⟩\[31m\.csv changed while it was uploaded ⟨U\+009B⟩2J\n/,
  );
  assert.equal(err.text().split("\n").length, 3, "one line each");
});

test("JSON lines escape C1 controls, separators and bidi overrides, and still parse to the same value", () => {
  const value = { kind: "file", path: "a\u009b2J\u0085\u202eb\u2028c\u007f\u001b[2J😀.csv" };
  const line = jsonLine(value);
  assert.ok(!RAW_CONTROL.test(line) && !/[\u2028\u202e]/.test(line), line);
  assert.deepEqual(JSON.parse(line), value);
  const out = terminal();
  new Output({ json: true, stdout: out.stream, stderr: terminal().stream }).line("file", {
    path: value.path,
  });
  assert.ok(!RAW_CONTROL.test(out.text().slice(0, -1)), out.text());
  assert.deepEqual(JSON.parse(out.text()), value);
});

test("widths are terminal columns: wide characters count two, an emoji is never cut in half", () => {
  assert.equal(displayWidth("abc"), 3);
  assert.equal(displayWidth("漢字.csv"), 8);
  assert.equal(displayWidth("😀"), 2);
  assert.equal(displayWidth("e\u0301"), 1, "a combining accent takes no column");
  assert.equal(displayWidth("👩‍👩‍👧"), 2, "a joined emoji is one");
  // Cut in columns, whole characters only.
  assert.equal(fit("😀😀😀", 4), "😀…");
  assert.equal(fit("😀😀😀", 5), "😀😀…");
  assert.equal(fit("漢字漢字", 6), "漢字…");
  assert.equal(fit("re\u0301sume\u0301.csv", 4), "re\u0301s…");
  for (let w = 1; w <= 12; w++) {
    const cut = fit("a😀b漢字c👩‍👩‍👧", w);
    assert.ok(displayWidth(cut) <= w, `${w}: ${cut}`);
    assert.ok(!/[\ud800-\udbff](?![\udc00-\udfff])/.test(cut), `no half surrogate at ${w}`);
  }
  assert.equal(pad("漢字", 6), "漢字  ");
  // A table lines its columns up in columns, not in UTF-16 units.
  const lines = table(
    ["NAME", "SIZE"],
    [
      ["漢字.csv", "1 B"],
      ["ab.csv", "2 B"],
    ],
  ).split("\n");
  const secondColumn = ["SIZE", "1 B", "2 B"].map((cell, i) => {
    const line = lines[i] as string;
    return displayWidth(line.slice(0, line.indexOf(cell)));
  });
  assert.deepEqual(secondColumn, [10, 10, 10], lines.join("\n"));
});

test("durations and sizes are rounded before they are shown: never 60 s, never 1024 KiB", () => {
  assert.equal(seconds(59_949), "59.9 s");
  assert.equal(seconds(59_960), "1 min 0 s");
  assert.equal(seconds(119_600), "2 min 0 s");
  assert.equal(seconds(61_400), "1 min 1 s");
  assert.equal(bytes(1023), "1023 B");
  assert.equal(bytes(10_200), "10 KiB");
  assert.equal(bytes(1_048_000), "1023 KiB");
  assert.equal(bytes(1_048_575), "1.0 MiB");
  assert.equal(bytes(1024 ** 3 - 1), "1.0 GiB");
});

const event = (
  id: bigint,
  runId: string | null,
  type: string,
  data: Record<string, unknown> = {},
): TaskEvent => ({
  id: String(id),
  taskId: "100000042",
  runId,
  type,
  data,
  createdAt: "2026-12-01T00:00:00.000Z",
});

/**
 * The screen that what cli-progress wrote leaves, as lines: a model of the few sequences it uses
 * (cursor up, to a column, clear to the end of the line or the screen, line feed). It redraws only
 * the lines that changed, so the output read as plain lines is not the screen.
 */
function screen(text: string): string[] {
  const lines: string[] = [""];
  let row = 0;
  let col = 0;
  // biome-ignore lint/suspicious/noControlCharactersInRegex: parsing escape sequences is the point
  for (const [, csi, n, op, plain] of text.matchAll(/(\u001b\[(\??[0-9;]*)([A-Za-z]))|([^\u001b]+)/g)) {
    if (csi) {
      const k = Number(n?.replace("?", "") || "0");
      if (op === "A") row = Math.max(0, row - Math.max(1, k));
      else if (op === "G") col = Math.max(0, k - 1);
      else if (op === "K") lines[row] = [...(lines[row] ?? "")].slice(0, col).join("");
      else if (op === "J") lines.length = row + 1;
      continue;
    }
    for (const part of (plain as string).split(/(\n)/)) {
      if (part === "\n") {
        row++;
        col = 0;
        lines[row] ??= "";
      } else if (part !== "") {
        const before = [...(lines[row] ?? "")].slice(0, col).join("");
        lines[row] = before + part;
        col += [...part].length;
      }
    }
  }
  return lines;
}

for (const columns of [80, 100]) {
  test(`the live view draws within a ${columns}-column terminal: the reconnecting note in view, wide names in line`, async () => {
    const runs = [
      { runId: "9999999990", fileName: "漢字のファイル名がとても長いデータ.csv" },
      { runId: "9999999991", fileName: "plain.csv" },
      { runId: "9999999992", fileName: "evil\u001b[2J.csv" },
      { runId: "9999999993", fileName: "failing.csv" },
    ];
    const tracker = new TaskTracker("100000042", 4, runs);
    const tty = terminal(columns, 30);
    const bars = new FollowBars(tty.stream, tracker);
    let id = 999_999_999_998n;
    const apply = (e: TaskEvent) => {
      const change = tracker.apply(e);
      bars.update(change.kind === "run" ? change.run : undefined);
    };
    apply(event(id++, null, "task.queued", { totalCount: 4 }));
    for (const r of runs) apply(event(id++, r.runId, "run.running"));
    for (const r of runs)
      apply(event(id++, r.runId, "run.progress", { percent: 40, message: "étape 2 sur 5 — 進行中です" }));
    apply(event(id++, "9999999993", "run.failed", { errorCode: "ANALYSIS_PROCESS_FAILED" }));
    try {
      // With room, the counts say what happened.
      if (columns >= 100)
        await waitFor(
          async () =>
            screen(tty.text()).some((l) => /^Task 100000042 running .* 0 succeeded, 1 failed \| /.test(l)),
          10_000,
          "a frame with the counts",
        );
      bars.setNote("reconnecting…");
      await waitFor(
        async () => screen(tty.text()).some((l) => l.startsWith("Task ") && l.includes("reconnecting…")),
        10_000,
        "a frame with the note",
      );
      const drawn = screen(tty.text()).filter((l) => l.trim() !== "");
      const shownScreen = drawn.join("\n");
      for (const line of drawn)
        assert.ok(displayWidth(line) <= columns, `${displayWidth(line)} columns: ${line}`);
      assert.ok(!tty.text().includes("\u001b[2J"), "a name never drives the terminal");
      // The running runs' bars start in one column, the wide name's too.
      const barColumns = drawn
        .filter((l) => l.startsWith("  ") && l.includes("["))
        .map((l) => displayWidth(l.slice(0, l.search(/ \[[█░#-]+\]/))));
      assert.equal(barColumns.length, 3, shownScreen);
      assert.equal(new Set(barColumns).size, 1, shownScreen);
    } finally {
      bars.stop();
    }
  });
}

test("a failed or retried run's line above the bars fits an 80-column terminal, run id and error code in view", async () => {
  const columns = 80;
  const tail = "(run 9999999999): ANALYSIS_PROCESS_START_FAILED";
  const run = (name: string, status: string) => ({
    runId: "9999999999",
    name,
    status,
    attempt: 1,
    errorCode: "ANALYSIS_PROCESS_START_FAILED",
  });
  const lines = [
    problemLine(run("quarterly-measurements-2026.csv", "queued"), true, columns),
    problemLine(run("quarterly-measurements-2026.csv", "failed"), false, columns),
    problemLine(run("漢字のファイル名がとても長いデータ.csv", "timed_out"), false, columns),
  ];
  // Cut in the middle: the name's end, its extension, stays in view.
  assert.match(lines[0] as string, /^retrying \(attempt 2\) quart.*….*\.csv \(run 9999999999\)/);
  assert.match(lines[1] as string, /^failed {5}quarterly.*….*-2026\.csv \(run 9999999999\)/);
  // Drawn above the bars (cli-progress turns wrapping off: a longer line would lose its tail).
  const tty = terminal(columns, 30);
  const bars = new FollowBars(tty.stream, new TaskTracker("100000042", 3, []));
  try {
    for (const line of lines) bars.log(line);
    bars.update();
    await waitFor(
      async () => screen(tty.text()).filter((l) => l.endsWith(tail)).length === lines.length,
      10_000,
      "the three lines drawn",
    );
    for (const line of screen(tty.text()).filter((l) => l.endsWith(tail)))
      assert.ok(displayWidth(line) < columns, `${displayWidth(line)} columns: ${line}`);
  } finally {
    bars.stop();
  }
  // Narrower, a failed run's line still fits; a name with room is whole.
  const narrow = problemLine(run("quarterly-measurements-2026.csv", "failed"), false, 70);
  assert.ok(displayWidth(narrow) < 70 && narrow.endsWith(tail), narrow);
  assert.equal(problemLine(run("q.csv", "failed"), false, columns), `failed     q.csv ${tail}`);
  // Where the rest alone does not fit, the name is an ellipsis (and the line is cut at the edge).
  assert.equal(problemLine(run("a-b.csv", "queued"), true, 40), `retrying (attempt 2) … ${tail}`);
});

for (const { columns, status, note } of [
  { columns: 63, status: "running", note: "" },
  { columns: 70, status: "running", note: "" },
  { columns: 79, status: "running", note: "reconnecting…" },
  { columns: 75, status: "partially_succeeded", note: "" },
  { columns: 80, status: "cancelling", note: "reconnecting…" },
  { columns: 120, status: "partially_succeeded", note: "reconnecting…" },
]) {
  test(`the overall line of a 9-digit task of 100,000 runs fits ${columns} columns (${status}${note ? `, ${note}` : ""})`, async () => {
    const tracker = new TaskTracker("123456789", 100_000, []);
    tracker.status = status;
    Object.assign(tracker.counts, { succeeded: 99_000, failed: 1_000 });
    const tty = terminal(columns, 30);
    const bars = new FollowBars(tty.stream, tracker);
    try {
      bars.setNote(note);
      // The whole line, to its end: the duration and the note.
      const whole = new RegExp(
        `^Task 123456789 ${status} \\[.+\\] 100000/100000 runs \\| .+ \\| [ \\dhms]+${note ? " \\| reconnecting…" : ""}$`,
      );
      await waitFor(
        async () => screen(tty.text()).some((l) => whole.test(l)),
        10_000,
        "a frame of the overall line",
      );
      const line = screen(tty.text()).find((l) => whole.test(l)) as string;
      assert.ok(displayWidth(line) < columns, `${displayWidth(line)} columns: ${line}`);
      // The bar gives way to the counts: at 120 columns they are whole.
      if (columns >= 120) assert.match(line, /99000 succeeded, 1000 failed \|/, line);
    } finally {
      bars.stop();
    }
  });
}

test("the live view keeps up with a task of 100,000 runs", async () => {
  const total = 100_000;
  const runs = Array.from({ length: total }, (_, i) => ({
    runId: String(9_999_999_990 + i),
    fileName: `f${i}.csv`,
  }));
  const tracker = new TaskTracker("100000042", total, runs);
  const tty = terminal(120, 40);
  const bars = new FollowBars(tty.stream, tracker);
  let id = 999_999_999_995n;
  const apply = (e: TaskEvent) => {
    const change = tracker.apply(e);
    bars.update(change.kind === "run" ? change.run : undefined);
  };
  // Ten thousand runs' events, eight at a time: 30,000 events. A scan of all 100,000 runs per event
  // took about 15 ms each (7.5 minutes); kept apart, the live runs cost microseconds.
  const started = performance.now();
  const deadline = started + 60_000;
  try {
    apply(event(id++, null, "task.queued", { totalCount: total }));
    for (let i = 0; i < 10_000; i += 8) {
      const batch = runs.slice(i, i + 8);
      for (const r of batch) apply(event(id++, r.runId, "run.running"));
      for (const r of batch) apply(event(id++, r.runId, "run.progress", { percent: 50 }));
      for (const r of batch) apply(event(id++, r.runId, "run.succeeded"));
      assert.ok(performance.now() < deadline, `fell behind: ${i} runs' events in 60 s`);
    }
    assert.equal(tracker.done, 10_000);
    assert.equal(tracker.running.length, 0);
  } finally {
    bars.stop();
  }
  assert.match(screen(tty.text()).join("\n"), /10000\/100000 runs \| 10000 succeeded/);
});

test("a run put back in the queue by its worker's shutdown (no error code) says so, in follow and in logs", () => {
  const requeued = { runId: "715", name: "mid1.csv", status: "queued", attempt: 0, errorCode: null };
  const line = problemLine(requeued, true, 100);
  assert.equal(line, "retrying (attempt 1) mid1.csv (run 715): put back by its worker (attempt not counted)");
  assert.ok(!line.endsWith(": "), line);
  const e: TaskEvent = {
    id: "9",
    taskId: "1",
    runId: "715",
    type: "run.retry",
    data: { status: "queued", attempt: 0, errorCode: null, runAfter: "2026-12-01T00:00:00.000Z" },
    createdAt: "2026-12-01T00:00:00.000Z",
  };
  assert.match(
    eventLine(e, new Map([["715", "mid1.csv"]])),
    /mid1\.csv \(run 715\) {2}put back by its worker \(attempt not counted\)/,
  );
  // The store was away: its code, and that the attempt is not counted.
  const storage = { ...e, data: { ...e.data, errorCode: "ANALYSIS_STORAGE_UNAVAILABLE", refunded: true } };
  assert.match(
    eventLine(storage, new Map([["715", "mid1.csv"]])),
    /mid1\.csv \(run 715\) {2}ANALYSIS_STORAGE_UNAVAILABLE \(attempt not counted\)$/,
  );
});

test("the client's own message of several lines prints as lines; the server's words stay on one", () => {
  const err = terminal();
  const o = new Output({ json: false, stdout: terminal().stream, stderr: err.stream });
  // What parseArgs says of `--limit -5`, as the commands receive it.
  o.fail(
    new ClientUsageError(
      "Option '--limit' argument is ambiguous.\nDid you forget to specify the option argument for '--limit'?",
      { ownLines: true },
    ),
  );
  assert.equal(
    err.text(),
    "assay: Option '--limit' argument is ambiguous.\n  Did you forget to specify the option argument for '--limit'?\n",
  );
  assert.ok(!err.text().includes("U+000A"), err.text());
  // A name in a usage error, and the server's message, keep a line break escaped.
  const err2 = terminal();
  const o2 = new Output({ json: false, stdout: terminal().stream, stderr: err2.stream });
  o2.fail(new ClientUsageError("no such file or directory: a\nb.csv"));
  o2.fail(new ApiRequestError(400, "X", "two\nlines"));
  assert.equal(err2.text().split("\n").length, 3, err2.text());
  assert.match(err2.text(), /a⟨U\+000A⟩b\.csv/);
});

test("a note while bars are drawn on the same terminal goes above the bars, not under them", async () => {
  const tty = terminal(100, 30);
  const err = terminal(100, 30);
  const o = new Output({ json: false, stdout: tty.stream, stderr: err.stream });
  const bars = new FollowBars(tty.stream, new TaskTracker("100000042", 3, []));
  try {
    o.drawing((line) => bars.log(line));
    bars.update();
    o.note("reading /api/analysis-tasks/8: cannot reach x; trying again (attempt 2 of 6)");
    await waitFor(
      async () => screen(tty.text()).some((l) => l.startsWith("assay: reading /api/analysis-tasks/8")),
      10_000,
      "the note drawn above the bars",
    );
    assert.equal(err.text(), "", "nothing written under the bars");
    const lines = screen(tty.text()).filter(Boolean);
    assert.match(lines[0] ?? "", /^assay: reading/, lines.join("\n"));
    assert.match(lines[1] ?? "", /^Task 100000042 /, lines.join("\n"));
  } finally {
    o.drawing(undefined);
    bars.stop();
  }
  // Once the bars are gone, notes go to stderr again.
  o.note("after");
  assert.equal(err.text(), "assay: after\n");
});

test("a resized terminal gets the overall line at its new width at once; upload and download bars fit 60 columns", async () => {
  const tty = terminal(120, 30);
  const tracker = new TaskTracker("100000042", 100_000, []);
  const bars = new FollowBars(tty.stream, tracker);
  try {
    bars.update();
    await waitFor(
      async () => screen(tty.text()).some((l) => l.startsWith("Task 100000042")),
      10_000,
      "drawn",
    );
    // The terminal narrows; no event comes.
    Object.assign(tty.stream, { columns: 60 });
    tty.stream.emit("resize");
    await waitFor(
      async () => {
        const line = screen(tty.text()).find((l) => l.startsWith("Task 100000042")) ?? "";
        return displayWidth(line) < 60;
      },
      10_000,
      "the overall line redrawn within 60 columns",
    );
  } finally {
    bars.stop();
  }
  for (const make of [
    (s: NodeJS.WriteStream) => {
      const b = new UploadBars(s);
      b.hashing(123_456_789, 1000)(12_345_678, 100);
      b.uploading(123_456_789, 1000);
      b.sent(1_000_000, true, 1000);
      return b;
    },
    (s: NodeJS.WriteStream) => {
      const b = new DownloadBars(s, 233);
      b.run(4, 123_456);
      return b;
    },
  ]) {
    const narrow = terminal(60, 30);
    const b = make(narrow.stream);
    try {
      await waitFor(
        async () => screen(narrow.text()).some((l) => /^(Hashing|Uploading|Downloading)/.test(l)),
        10_000,
        "the bars drawn",
      );
    } finally {
      b.stop();
    }
    const lines = screen(narrow.text()).filter((l) => /^(Hashing|Uploading|Downloading)/.test(l));
    assert.ok(lines.length > 0);
    for (const line of lines) assert.ok(displayWidth(line) < 60, `${displayWidth(line)} columns: ${line}`);
  }
});
