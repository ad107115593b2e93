// What a client command draws on a terminal, with cli-progress: the upload's bars (bytes hashed,
// bytes sent) and a followed task (an overall bar with counts, one line per running run with its
// progress and latest message, errors printed above the bars as they happen). Loaded only when
// something draws.
import cliProgress from "cli-progress";
import { bytes, displayWidth, fit, fitName, pad, shown } from "./output.ts";
import { isLive, type RunState, type TaskTracker } from "./progress.ts";

const utf8 = /utf-?8/i.test(process.env.LC_ALL || process.env.LC_CTYPE || process.env.LANG || "");
const BAR_CHARS = utf8
  ? { barCompleteChar: "\u2588", barIncompleteChar: "\u2591" }
  : { barCompleteChar: "#", barIncompleteChar: "-" };

/** Draws what log() buffered (stop() alone would drop it), then stops; once. */
function finish(bars: cliProgress.MultiBar): void {
  if (!bars.isActive) return;
  bars.update();
  bars.stop();
}

/** Bars that may have hidden the cursor, with their terminal. */
const drawing = new Map<cliProgress.MultiBar, NodeJS.WriteStream>();

// cli-progress shows the cursor again only in stop(), which a second Ctrl-C (process.exit) never
// reaches: the shell would be left without a cursor. A terminal write is synchronous, so it can be
// done here, as the process exits.
process.on("exit", () => {
  for (const [bars, stream] of drawing) if (bars.isActive) stream.write("\x1b[?25h");
});

function multiBar(
  stream: NodeJS.WriteStream,
  format: string | cliProgress.GenericFormatter,
): cliProgress.MultiBar {
  const bars = new cliProgress.MultiBar({
    stream,
    format,
    hideCursor: true,
    clearOnComplete: false,
    barsize: 30,
    fps: 10,
    autopadding: true,
    ...BAR_CHARS,
  });
  drawing.set(bars, stream);
  return bars;
}

/**
 * A bar's line fitted to the terminal's width at each draw (cli-progress turns wrapping off while it
 * draws, so a longer line is cut at the edge, its counts with it): the bar as long as the words leave
 * room for (30 at most, 5 at least), then the line cut with an ellipsis if it still does not fit.
 * The bars are made with barsize 30, what cli-progress prepares the bar's characters for.
 */
function fitted(stream: NodeJS.WriteStream, format: string): cliProgress.GenericFormatter {
  return (options, params, payload) => {
    const width = stream.columns || 100;
    const words = displayWidth(
      cliProgress.Format.Formatter({ ...options, format, barsize: 0 }, params, payload),
    );
    const barsize = Math.max(5, Math.min(30, width - 1 - words));
    return fit(cliProgress.Format.Formatter({ ...options, format, barsize }, params, payload), width - 1);
  };
}

/** Hashing, then uploading: two bars counted in bytes, with file counts. */
export class UploadBars {
  readonly #bars: cliProgress.MultiBar;
  #hash: cliProgress.SingleBar | undefined;
  #send: cliProgress.SingleBar | undefined;
  #sent = 0;
  #sentFiles = 0;

  constructor(stream: NodeJS.WriteStream) {
    this.#bars = multiBar(stream, fitted(stream, "{label} [{bar}] {percentage}% | {done}/{size} | {files}"));
  }

  hashing(totalBytes: number, totalFiles: number): (bytesDone: number, filesDone: number) => void {
    this.#hash = this.#bars.create(Math.max(1, totalBytes), 0, {
      label: "Hashing  ",
      done: bytes(0),
      size: bytes(totalBytes),
      files: `0/${totalFiles} files`,
    });
    return (b, f) => this.#hash?.update(b, { done: bytes(b), files: `${f}/${totalFiles} files` });
  }

  uploading(totalBytes: number, totalFiles: number): void {
    this.#send = this.#bars.create(Math.max(1, totalBytes), 0, {
      label: "Uploading",
      done: bytes(0),
      size: bytes(totalBytes),
      files: `0/${totalFiles} files`,
    });
  }

  /** Bytes sent (negative: taken back after a failed attempt); `fileDone` when a file completed. */
  sent(n: number, fileDone: boolean, totalFiles: number): void {
    this.#sent += n;
    if (fileDone) this.#sentFiles++;
    this.#send?.update(this.#sent, {
      done: bytes(this.#sent),
      files: `${this.#sentFiles}/${totalFiles} files`,
    });
  }

  log(text: string): void {
    this.#bars.log(`${text}\n`);
  }

  stop(): void {
    finish(this.#bars);
  }
}

/** A download's runs done (and files, bytes), for `assay download` and `submit --out`. */
export class DownloadBars {
  readonly #bars: cliProgress.MultiBar;
  readonly #bar: cliProgress.SingleBar;
  #files = 0;
  #bytes = 0;

  constructor(stream: NodeJS.WriteStream, runs: number) {
    this.#bars = multiBar(stream, fitted(stream, "Downloading [{bar}] {value}/{total} runs | {files}"));
    this.#bar = this.#bars.create(Math.max(1, runs), 0, { files: "0 files" });
  }

  /** A run's outputs are all on disk. */
  run(files: number, bytes_: number): void {
    this.#files += files;
    this.#bytes += bytes_;
    this.#bar.increment(1, { files: `${this.#files} files, ${bytes(this.#bytes)}` });
  }

  log(text: string): void {
    this.#bars.log(`${text}\n`);
  }

  stop(): void {
    finish(this.#bars);
  }
}

/** The live view of a followed task. */
export class FollowBars {
  readonly #bars: cliProgress.MultiBar;
  readonly #tracker: TaskTracker;
  readonly #overall: cliProgress.SingleBar;
  readonly #lines = new Map<string, cliProgress.SingleBar>();
  #more: cliProgress.SingleBar | undefined;
  readonly #maxLines: number;
  readonly #width: () => number;
  #note = "";
  readonly #stream: NodeJS.WriteStream;
  readonly #onResize = () => {
    if (!this.#bars.isActive) return;
    for (const run of this.#tracker.running) this.#runLine(run);
    this.update();
  };

  /** The overall bar's length, set with each draw's words (#overallPayload); at most 30. */
  #overallBarSize = 30;

  constructor(stream: NodeJS.WriteStream, tracker: TaskTracker) {
    this.#tracker = tracker;
    this.#bars = multiBar(stream, "{text}");
    this.#width = () => stream.columns || 100;
    this.#stream = stream;
    // Redrawn at the new width at once, not at the next event (which may be many seconds away).
    stream.on("resize", this.#onResize);
    this.#maxLines = Math.max(1, Math.min(12, (stream.rows || 24) - 6));
    this.#overall = this.#bars.create(Math.max(1, tracker.total), 0, this.#overallPayload(), {
      format: "Task {taskId} {status} [{bar}] {value}/{total} runs | {counts} | {duration_formatted}{note}",
      // Drawn 30 long at most (what cli-progress prepares the bar's characters for), as long as
      // #overallBarSize says at each draw.
      barsize: 30,
      formatBar: (progress, options) =>
        cliProgress.Format.BarFormat(progress, { ...options, barsize: this.#overallBarSize }),
    });
  }

  /**
   * The overall line's words, within the terminal's width (the terminal cuts a longer line off at
   * its edge, counts, duration and "reconnecting…" with it): the counts of outcomes that happened
   * (succeeded always), cut with an ellipsis when there is still not room. A narrow terminal gets a
   * shorter bar (30 from 110 columns, 10 at 90 and below), shorter still (down to 5) to leave the
   * counts their room.
   *
   * The line needs its words (the duration counted at its longest, "23h59m"), a bar of 5 and "…" for
   * the counts, plus a spare column: with a 9-digit task id and 100,000 runs, 63 columns while
   * running, 79 with " | reconnecting…", 75 for a task that ended partially_succeeded. On a narrower
   * terminal the line is cut at the edge (the note, then the duration, go first).
   */
  #overallPayload() {
    const t = this.#tracker;
    const c = t.counts;
    const started = t.done > 0 || t.running.length > 0;
    const status = t.status === "queued" && started ? "running" : t.status;
    const counts = [
      `${c.succeeded} succeeded`,
      ...(c.failed > 0 ? [`${c.failed} failed`] : []),
      ...(c.timed_out > 0 ? [`${c.timed_out} timed out`] : []),
      ...(c.cancelled > 0 ? [`${c.cancelled} cancelled`] : []),
    ].join(", ");
    const note = this.#note;
    const total = String(Math.max(1, t.total));
    const width = this.#width();
    // Everything but the bar and the counts: "Task <id> <status> [] <done>/<total> runs | ", then
    // " | <duration>" (cli-progress's: "59s", "59m59s", "23h59m" at most) and the note.
    const words =
      `Task ${t.taskId} ${status} [] ${total}/${total} runs | `.length +
      " | 23h59m".length +
      displayWidth(note);
    const wanted = Math.max(10, Math.min(30, width - 80));
    this.#overallBarSize = Math.max(5, Math.min(wanted, width - 1 - words - displayWidth(counts)));
    const room = width - words - this.#overallBarSize - 1;
    return {
      taskId: t.taskId,
      status,
      counts: fit(counts, Math.max(1, room)),
      note,
    };
  }

  /**
   * Drops every run's line (the tracker was reset: the task's whole log follows, and a run that is
   * queued in it must not keep the line of a run that was running), then redraws.
   */
  reset(): void {
    for (const bar of this.#lines.values()) this.#bars.remove(bar);
    this.#lines.clear();
    this.update();
  }

  /** Redraws after the tracker changed (for `run`, its line). */
  update(run?: RunState): void {
    const t = this.#tracker;
    this.#overall.setTotal(Math.max(1, t.total));
    this.#overall.update(t.done, this.#overallPayload());
    if (run) this.#runLine(run);
    this.#moreLine();
  }

  #runLine(run: RunState): void {
    const live = isLive(run.status);
    const bar = this.#lines.get(run.runId);
    if (!live) {
      if (bar) {
        this.#bars.remove(bar);
        this.#lines.delete(run.runId);
      }
      return;
    }
    const payload = this.#runPayload(run);
    if (bar) bar.update(run.percent, payload);
    else if (this.#lines.size < this.#maxLines) {
      this.#lines.set(
        run.runId,
        this.#bars.create(100, run.percent, payload, {
          format: "  {name} [{bar}] {percentage}% {message}",
          barsize: 20,
        }),
      );
    }
  }

  #runPayload(run: RunState) {
    const nameWidth = Math.min(32, Math.max(12, Math.floor(this.#width() / 3)));
    // In terminal columns: a wide (CJK, emoji) name must not push its bar out of line.
    const name = pad(fitName(shown(run.name), nameWidth), nameWidth);
    const rest = this.#width() - nameWidth - 34;
    const status =
      run.status === "cancelling" ? "cancelling " : run.attempt > 1 ? `attempt ${run.attempt} ` : "";
    return { name, message: fit(status + shown(run.message), rest) };
  }

  /** "… and N more running" when not every running run has a line. */
  #moreLine(): void {
    const hidden = this.#tracker.running.filter((r) => !this.#lines.has(r.runId)).length;
    // Promote hidden runs into free lines first.
    if (hidden > 0 && this.#lines.size < this.#maxLines) {
      for (const r of this.#tracker.running) if (!this.#lines.has(r.runId)) this.#runLine(r);
    }
    const still = this.#tracker.running.filter((r) => !this.#lines.has(r.runId)).length;
    if (still > 0) {
      this.#more ??= this.#bars.create(1, 0, { text: "" });
      this.#more.update(0, { text: `  … and ${still} more running` });
    } else if (this.#more) {
      this.#bars.remove(this.#more);
      this.#more = undefined;
    }
  }

  /** A note in the overall line (reconnecting); empty to clear. */
  setNote(note: string): void {
    this.#note = note ? ` | ${note}` : "";
    this.update();
  }

  /** A line printed above the bars. */
  log(text: string): void {
    this.#bars.log(`${text}\n`);
  }

  /** Stops drawing: removes the run lines, leaves the overall line as it last was. */
  stop(): void {
    this.#stream.off("resize", this.#onResize);
    if (!this.#bars.isActive) return;
    for (const bar of this.#lines.values()) this.#bars.remove(bar);
    this.#lines.clear();
    if (this.#more) this.#bars.remove(this.#more);
    this.#more = undefined;
    this.#overall.update(this.#tracker.done, this.#overallPayload());
    finish(this.#bars);
  }
}
