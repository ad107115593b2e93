// A process of SSE clients for bench/sse.ts: opens N streams to one URL, records when each event id
// arrives (epoch milliseconds, sub-millisecond precision, comparable across processes), prints
// "ready" once all are connected, and on SIGTERM prints one JSON line {received: {id: [times]}}.
import { performance } from "node:perf_hooks";

const [url, token, countArg] = process.argv.slice(2);
const count = Number(countArg);
const now = () => performance.timeOrigin + performance.now();
const received: Record<string, number[]> = {};
const controllers: AbortController[] = [];

await Promise.all(
  Array.from({ length: count }, async () => {
    const controller = new AbortController();
    controllers.push(controller);
    const res = await fetch(url as string, {
      headers: { authorization: `Bearer ${token}`, accept: "text/event-stream" },
      signal: controller.signal,
    });
    void (async () => {
      const decoder = new TextDecoder();
      let buffer = "";
      try {
        for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
          const at = now();
          buffer += decoder.decode(chunk, { stream: true });
          for (let end = buffer.indexOf("\n\n"); end !== -1; end = buffer.indexOf("\n\n")) {
            const id = /^id: ?(\d+)$/m.exec(buffer.slice(0, end))?.[1];
            buffer = buffer.slice(end + 2);
            if (id) {
              received[id] ??= [];
              received[id].push(at);
            }
          }
        }
      } catch {
        // aborted at the end
      }
    })();
  }),
);
process.stdout.write("ready\n");
process.once("SIGTERM", () => {
  for (const c of controllers) c.abort();
  process.stdout.write(`${JSON.stringify({ received })}\n`, () => process.exit(0));
});
