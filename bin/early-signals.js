// Stop signals that come while a server command loads (~0.2 s of imports before src/cli/serve.ts
// installs its handlers): held here, and handed to those handlers once they listen, so that the signal
// ends the start and the process exits 0 as docs/operations.md says — until 2026-12-07 Node's default
// action killed the process (exit 143). Installed after the re-exec with the server's Node flags (an
// exec forgets a caught signal; before it, the default action still applies), so a signal within the
// first few tens of milliseconds of each process image is not held.

/** The signals held: those the server's shutdown (close-with-grace) takes to stop. */
const STOP_SIGNALS = ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"];
const KEY = Symbol.for("assay.earlySignals");

/**
 * Holds the stop signals until `release()` of globalThis[Symbol.for("assay.earlySignals")], which
 * src/cli/serve.ts calls (through globalThis: the bundle it runs in does not import bin/).
 */
export function holdEarlySignals() {
  let first;
  const hold = (signal) => {
    first ??= signal;
  };
  for (const s of STOP_SIGNALS) process.on(s, hold);
  globalThis[KEY] = {
    /** Stops holding; returns the first signal held, if any. */
    release() {
      for (const s of STOP_SIGNALS) process.off(s, hold);
      delete globalThis[KEY];
      return first;
    },
  };
}
