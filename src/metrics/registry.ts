// One Prometheus registry per process (per app in tests, which build many in one process), with the
// Node.js process metrics. `assay all` registers the API's and the worker's metrics in the same one.
import { collectDefaultMetrics, Registry } from "prom-client";

export function processRegistry(): Registry {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: "assay_" });
  return registry;
}
