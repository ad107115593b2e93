import { setTimeout as delay } from "node:timers/promises";
import { timerDelay } from "../timers.ts";
import { MAX_BACKOFF_MS } from "./sql.ts";

export const sleep = (ms: number) => delay(ms, undefined, { ref: false });

/** ±20% jitter, so a fleet of workers does not poll or reap in lockstep. */
export const jitter = (ms: number) => timerDelay(Math.round(ms * (0.8 + Math.random() * 0.4)));

/**
 * Delay before the next attempt after `attempt` failed transiently: exponential (base · 2^(attempt−1)),
 * "equal jitter" (half fixed, half random), capped at MAX_BACKOFF_MS. The reaper computes the same
 * in SQL for lost leases.
 */
export function backoffMs(attempt: number, baseMs: number): number {
  const exp = Math.min(MAX_BACKOFF_MS, baseMs * 2 ** Math.max(0, attempt - 1));
  return Math.round(exp * (0.5 + Math.random() / 2));
}
