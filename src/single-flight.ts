// One piece of work at a time, shared by the callers that arrive while it runs: readiness probes'
// checks (http/routes/health.ts), the error handler's migration count, a store's check after a failed
// store call (storage/store.ts, storeFault).

/**
 * A check still running after this long is no longer shared: the next probe starts another. Only a
 * check that is stuck gets this old (a query sent on a connection that died without a word waits for
 * TCP keepalive, minutes), and readiness must not stay 503 for that long once the database answers
 * again on other connections.
 */
const READY_FLIGHT_STALE_MS = 30_000;
/**
 * Checks of one kind outstanding at most: behind a proxy that closes every connection, postgres.js
 * keeps a query waiting for ever, so each stale check would stay, one more every 30 s of an outage.
 */
const READY_FLIGHTS_MAX = 2;
/**
 * A check this old is forgotten (it may still end, unheeded): with READY_FLIGHTS_MAX checks stuck on
 * connections that died without a word (a NAT that dropped them), readiness would wait for TCP to give
 * up on them, ~15 minutes, while new connections work. One more query every 2 minutes of an outage at
 * most.
 */
const READY_FLIGHT_FORGET_MS = 120_000;

/**
 * One check at a time, shared by the probes that arrive while it runs (each still bounded by its own
 * timeout). A database that does not answer keeps its query queued in the pool (postgres.js 3.4.9
 * makes the connection again and again, the query waiting), and the check did not end with the probe
 * that gave up on it: a load balancer probing every second from a few places piled up queries
 * without bound, all run at once when the database came back. The same for the object store's check
 * (a bucket that does not answer holds a socket per check for up to 10 s). A check older than
 * READY_FLIGHT_STALE_MS is not shared, while fewer than READY_FLIGHTS_MAX are outstanding; one older
 * than READY_FLIGHT_FORGET_MS no longer counts.
 */
export function singleFlight<T>(
  work: () => Promise<T>,
  { staleMs = READY_FLIGHT_STALE_MS, max = READY_FLIGHTS_MAX, forgetMs = READY_FLIGHT_FORGET_MS } = {},
): () => Promise<T> {
  const flights: { promise: Promise<T>; startedAt: number }[] = [];
  return () => {
    const now = performance.now();
    while (flights.length > 0 && now - (flights[0]?.startedAt ?? now) >= forgetMs) flights.shift();
    const newest = flights.at(-1);
    if (newest !== undefined && (now - newest.startedAt < staleMs || flights.length >= max))
      return newest.promise;
    const flight = {
      promise: work().finally(() => {
        const i = flights.indexOf(flight);
        if (i >= 0) flights.splice(i, 1);
      }),
      startedAt: now,
    };
    flights.push(flight);
    return flight.promise;
  };
}
