// Node timers wait at most 2^31−1 ms (~24.8 days); a longer delay fires after 1 ms instead. Durations in
// the configuration are bounded by MAX_TIMER_MS, and delays computed from them (jitter, margins) go
// through timerDelay() so they cannot cross it.

/** The longest a Node timer can wait. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** `ms` as a timer can wait for it: never past MAX_TIMER_MS, never negative. */
export const timerDelay = (ms: number) => Math.min(MAX_TIMER_MS, Math.max(0, ms));
