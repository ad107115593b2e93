// The server's clock as the browser can tell it: run times ("running for 2 min 5 s") are the server's
// timestamps against "now", and a browser whose clock is minutes off (a laptop not yet synced, a VM)
// showed a running task's duration blank (clock behind: negative) or minutes too long (ahead).

/** Offsets under this are taken for the Date header's rounding (it has whole seconds), not a skew. */
const SKEW_TOLERANCE_MS = 2000;

let offsetMs = 0;

/**
 * Notes the server's `Date` header of a response just received: when the browser's clock is off from
 * it by more than SKEW_TOLERANCE_MS, serverNow() corrects by as much.
 */
export function noteServerDate(dateHeader) {
  const at = Date.parse(dateHeader ?? "");
  if (!Number.isFinite(at)) return;
  // The header says the second the answer was made: its middle is the best guess.
  const skew = at + 500 - Date.now();
  offsetMs = Math.abs(skew) > SKEW_TOLERANCE_MS ? skew : 0;
}

/** Now, on the server's clock as far as the browser can tell (ms since the epoch). */
export function serverNow() {
  return Date.now() + offsetMs;
}
