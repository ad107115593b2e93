// The metrics endpoint of `assay worker`, which has no HTTP API: GET /metrics on ASSAY_METRICS_PORT.
import http from "node:http";
import type { AddressInfo } from "node:net";
import type { Registry } from "prom-client";
import type { Logger } from "../log.ts";

export interface MetricsServer {
  port: number;
  close(): Promise<void>;
}

export async function serveMetrics(
  registry: Registry,
  host: string,
  port: number,
  logger: Logger,
): Promise<MetricsServer> {
  const server = http.createServer((req, res) => {
    if (req.method !== "GET" || req.url?.split("?")[0] !== "/metrics") {
      res.writeHead(404, { "content-type": "text/plain" }).end("not found\n");
      return;
    }
    registry.metrics().then(
      (body) => res.writeHead(200, { "content-type": registry.contentType }).end(body),
      (err: unknown) => {
        logger.warn({ err }, "metrics collection failed");
        res.writeHead(500, { "content-type": "text/plain" }).end("metrics collection failed\n");
      },
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  const bound = (server.address() as AddressInfo).port;
  logger.info({ host, port: bound }, "worker metrics listening");
  return {
    port: bound,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
