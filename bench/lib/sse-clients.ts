// A process of SSE clients for bench/sse.ts: N plain TCP connections (a minimal HTTP/1.1 client, so
// the clients' own parsing costs microseconds, not the server's share of the measurement), recording
// when each event id arrives (epoch ms with sub-ms precision, comparable across processes). Prints
// "ready" once every stream has its response headers; on SIGTERM prints {received: {id: [times]}}.
import net from "node:net";
import { performance } from "node:perf_hooks";

const [urlArg, token, countArg] = process.argv.slice(2);
const url = new URL(urlArg as string);
const count = Number(countArg);
const now = () => performance.timeOrigin + performance.now();
const received: Record<string, number[]> = {};
const READY_TIMEOUT_MS = 60_000;
const sockets: net.Socket[] = [];
const request =
  `GET ${url.pathname} HTTP/1.1\r\nHost: ${url.host}\r\nAuthorization: Bearer ${token}\r\n` +
  "Accept: text/event-stream\r\nConnection: keep-alive\r\n\r\n";

/** Streams whose response headers have arrived (for the message when they do not all arrive). */
let open = 0;
// A stream that never gets its headers must not leave bench/sse.ts waiting for "ready" forever: after
// this long the process says how many it has and exits (bench/sse.ts then fails with that).
const readyTimer = setTimeout(() => {
  process.stderr.write(`sse-clients: ${open} of ${count} streams open after ${READY_TIMEOUT_MS} ms\n`, () =>
    process.exit(1),
  );
}, READY_TIMEOUT_MS);
await Promise.all(
  Array.from(
    { length: count },
    () =>
      new Promise<void>((resolve, reject) => {
        const socket = net.connect(Number(url.port), url.hostname, () => socket.write(request));
        sockets.push(socket);
        socket.setEncoding("utf8");
        let headers = true;
        let buffer = "";
        socket.on("error", reject);
        // Closed by the server before its headers (a clean close is no "error"): fail, do not wait.
        socket.on("close", () => {
          if (headers)
            reject(new Error(`stream closed before its headers: ${JSON.stringify(buffer.slice(0, 80))}`));
        });
        socket.on("data", (chunk: string) => {
          const at = now();
          buffer += chunk;
          if (headers) {
            const end = buffer.indexOf("\r\n\r\n");
            if (end === -1) return;
            if (!buffer.startsWith("HTTP/1.1 200")) return reject(new Error(buffer.slice(0, 80)));
            buffer = buffer.slice(end + 4);
            headers = false;
            open++;
            resolve();
          }
          // Chunked encoding wraps the frames; only the `id:` lines matter here.
          for (let i = buffer.indexOf("\nid: "); i !== -1; i = buffer.indexOf("\nid: ", i + 1)) {
            const eol = buffer.indexOf("\n", i + 5);
            if (eol === -1) break;
            const id = buffer.slice(i + 5, eol);
            received[id] ??= [];
            received[id].push(at);
            buffer = buffer.slice(eol);
            i = -1;
          }
          if (buffer.length > 4096) buffer = buffer.slice(-256);
        });
      }),
  ),
);
clearTimeout(readyTimer);
process.stdout.write("ready\n");
process.once("SIGTERM", () => {
  for (const s of sockets) s.destroy();
  process.stdout.write(`${JSON.stringify({ received })}\n`, () => process.exit(0));
});
