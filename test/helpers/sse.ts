// A minimal Server-Sent Events client over fetch, for tests against a real listening server.
export interface SseEvent {
  id: string | undefined;
  event: string | undefined;
  data: unknown;
}

export interface SseStream {
  status: number;
  events: SseEvent[];
  comments: number;
  /** Resolves when the server ends the stream. */
  ended: Promise<void>;
  waitFor(predicate: (events: SseEvent[]) => boolean, timeoutMs?: number): Promise<void>;
  close(): void;
}

export async function openSse(url: string, token: string, lastEventId?: string): Promise<SseStream> {
  const controller = new AbortController();
  const res = await fetch(url, {
    headers: {
      authorization: `Bearer ${token}`,
      accept: "text/event-stream",
      ...(lastEventId ? { "last-event-id": lastEventId } : {}),
    },
    signal: controller.signal,
  });
  const stream: SseStream = {
    status: res.status,
    events: [],
    comments: 0,
    ended: Promise.resolve(),
    waitFor: async (predicate, timeoutMs = 30_000) => {
      const deadline = Date.now() + timeoutMs;
      while (!predicate(stream.events)) {
        if (Date.now() > deadline)
          throw new Error(`timed out; got ${JSON.stringify(stream.events.map((e) => e.event))}`);
        await new Promise((r) => setTimeout(r, 10));
      }
    },
    close: () => controller.abort(),
  };
  if (!res.body || res.status !== 200) return stream;
  stream.ended = (async () => {
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        buffer += decoder.decode(chunk, { stream: true });
        for (let end = buffer.indexOf("\n\n"); end !== -1; end = buffer.indexOf("\n\n")) {
          const frame = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const fields: Record<string, string> = {};
          let comment = true;
          for (const line of frame.split("\n")) {
            if (line.startsWith(":")) continue;
            comment = false;
            const i = line.indexOf(":");
            const key = i === -1 ? line : line.slice(0, i);
            const value = i === -1 ? "" : line.slice(i + 1).replace(/^ /, "");
            fields[key] = key in fields ? `${fields[key]}\n${value}` : value;
          }
          if (comment) stream.comments++;
          else if (fields.data !== undefined) {
            stream.events.push({ id: fields.id, event: fields.event, data: JSON.parse(fields.data) });
          }
        }
      }
    } catch (err) {
      if ((err as Error).name !== "AbortError") throw err;
    }
  })();
  return stream;
}
