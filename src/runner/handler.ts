// The queue handler that runs an analysis program for a claimed run: input path from the run's
// snapshot (under the storage root), a per-attempt output folder, the process, and the mapping of
// how it ended to an outcome (DESIGN §5). A successful attempt keeps its folder and names it in its
// outcome; whether it becomes the run's output is decided by the completion's lease fence.
import fs from "node:fs";
import fsp from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { Program } from "../analyses/programs.ts";
import type { ClaimedRun, Handler, HandlerOutcome } from "../queue/worker.ts";
import type { LocalStorage } from "../storage/local.ts";
import type { GroupRegistry } from "./group-guard.ts";
import { attemptOutput, checkOutputs, discardOutputs, removeOtherAttempts } from "./outputs.ts";
import { type ProcessResult, runProcess } from "./run-process.ts";

export interface ProcessHandlerDeps {
  storage: LocalStorage;
  /** `$ASSAY_DATA_DIR/outputs`. */
  outputsRoot: string;
  killGraceMs: number;
  /** Kills this worker's process groups if it dies (see group-guard.ts). */
  guard?: GroupRegistry;
  /** CPU priority of the analysis processes (ASSAY_CHILD_NICE). */
  nice?: number;
}

/** The child's whole environment: an allowlist, never the service's own (no DATABASE_URL, no tokens). */
export function childEnv(home: string): Record<string, string> {
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin",
    LANG: process.env.LANG ?? "C.UTF-8",
    TZ: process.env.TZ ?? "UTC",
    HOME: home,
  };
  return env;
}

const STDERR_STORED_CHARS = 2048;

/** How a finished process maps to an outcome, given the output check on success. */
export function outcomeOf(r: ProcessResult, outputCheck?: { ok: boolean; message?: string }): HandlerOutcome {
  const stderr = r.stderrTail.slice(-STDERR_STORED_CHARS);
  const fail = (errorCode: string, errorMessage: string, transient = false): HandlerOutcome => ({
    status: "failed",
    errorCode,
    errorMessage,
    transient,
    ...(stderr ? { result: { stderrTail: stderr } } : {}),
  });
  if (r.startError)
    return fail(
      "ANALYSIS_PROCESS_START_FAILED",
      `the program could not be started (${r.startError.code ?? "error"})`,
    );
  if (r.isCanceled) return r.abortReason === "timeout" ? { status: "timed_out" } : { status: "cancelled" };
  if (r.timedOut) return { status: "timed_out" };
  if (r.protocolError)
    return fail(
      "ANALYSIS_OUTPUT_INVALID",
      `the program broke the output protocol: ${r.protocolError.message}`,
    );
  if (r.signal) return fail("ANALYSIS_PROCESS_FAILED", `the program was killed by ${r.signal}`);
  switch (r.exitCode) {
    case 0:
      if (!r.result) return fail("ANALYSIS_OUTPUT_MISSING", "the program exited 0 without a result event");
      if (!outputCheck?.ok)
        return fail("ANALYSIS_OUTPUT_INVALID", outputCheck?.message ?? "the output is invalid");
      return {
        status: "succeeded",
        result: { outputFileName: r.result.outputFileName, metrics: r.result.metrics },
      };
    case 2:
      return fail("ANALYSIS_INPUT_INVALID", "the analysis rejected its parameters");
    case 3:
      return fail("ANALYSIS_DATA_INVALID", "the input data cannot be analysed");
    case 4:
      return fail("ANALYSIS_DEPENDENCY_FAILED", "an external dependency of the analysis failed", true);
    case 5:
      return fail("ANALYSIS_PROCESS_FAILED", "the analysis failed internally");
    default:
      return fail("ANALYSIS_PROCESS_FAILED", `the program exited with code ${r.exitCode}`);
  }
}

function inputReadable(file: string): boolean {
  try {
    const stat = fs.statSync(file);
    fs.accessSync(file, fs.constants.R_OK);
    // access() always succeeds for root: also require some read bit, as the owner meant it.
    return stat.isFile() && (stat.mode & 0o444) !== 0;
  } catch {
    return false;
  }
}

export function processHandler(program: Program, deps: ProcessHandlerDeps): Handler {
  // One private HOME per handler, made on first use: programs get a writable home, not ours.
  let home: Promise<string> | undefined;
  return async (run, { signal, reportProgress, releaseSlot, finishing }) => {
    const output = attemptOutput(deps.outputsRoot, run.taskId, run.id, run.attempt, run.leaseToken);
    let inputPath: string;
    try {
      inputPath = deps.storage.resolve(run.inputStorageKey);
    } catch {
      return {
        status: "failed",
        errorCode: "ANALYSIS_INPUT_INVALID",
        errorMessage: "the input file is outside storage",
      };
    }
    if (!fs.existsSync(program.script)) {
      return {
        status: "failed",
        errorCode: "ANALYSIS_PROCESS_START_FAILED",
        errorMessage: "the analysis script is missing",
      };
    }
    if (!inputReadable(inputPath)) {
      return {
        status: "failed",
        errorCode: "ANALYSIS_INPUT_INVALID",
        errorMessage: "the input file cannot be read",
      };
    }
    // Named by the lease token: no other attempt writes here. Synchronous, like the checks above:
    // a local metadata call is cheaper than a thread-pool round trip, and it sits on the path from
    // claim to spawn.
    fs.mkdirSync(output.dir, { recursive: true });
    home ??= fsp.mkdtemp(path.join(os.tmpdir(), "assay-home-"));
    let keep = false;
    try {
      const result = await runProcess(
        {
          executable: program.executable,
          args: [
            program.script,
            "--input",
            inputPath,
            "--output-dir",
            output.dir,
            "--params",
            JSON.stringify(run.parameters),
          ],
          cwd: program.cwd,
          env: childEnv(await home),
        },
        signal,
        {
          killGraceMs: deps.killGraceMs,
          ...(deps.guard ? { guard: deps.guard } : {}),
          ...(deps.nice === undefined ? {} : { nice: deps.nice }),
        },
        (p) => reportProgress(p.percent, p.message),
        finishing,
      );
      // The process (and its group) is gone: the next run may start while outputs are checked.
      releaseSlot();
      const check =
        result.exitCode === 0 &&
        result.result &&
        !result.protocolError &&
        !result.isCanceled &&
        !result.timedOut
          ? checkOutputs(output.dir, result.result.outputFileName)
          : undefined;
      const outcome = outcomeOf(result, check);
      if (outcome.status !== "succeeded") return outcome;
      // Kept as it is: the completion records this folder only if it wins the fence; if it loses,
      // the worker discards the folder (onDiscard).
      keep = true;
      return { ...outcome, outputKey: output.key };
    } finally {
      if (!keep) await discardOutputs(output);
    }
  };
}

/** For Worker.onDiscard: an attempt whose outcome was fenced off or abandoned leaves nothing behind. */
export function discardAttempt(outputsRoot: string) {
  return (run: ClaimedRun) =>
    discardOutputs(attemptOutput(outputsRoot, run.taskId, run.id, run.attempt, run.leaseToken));
}

/**
 * For Worker.onRecorded: once a run's outcome is recorded, no other attempt of it can win, so the
 * folders that earlier attempts left go. Only an attempt that lost its lease (a worker killed mid-run,
 * put back by the reaper) can have left one — every other ending removes its own — so only runs claimed
 * after such an attempt look (it reads the task's folder).
 */
export function removeLeftovers(outputsRoot: string) {
  return async (run: ClaimedRun, outputKey: string | null) => {
    if (run.afterLostLease) await removeOtherAttempts(outputsRoot, run.taskId, run.id, outputKey);
  };
}
