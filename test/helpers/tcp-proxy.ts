// A TCP proxy in front of the test database, for cutting its connections at a chosen moment: a
// hook sees every chunk one way and says whether it passes or the connection is cut in its place.
import net from "node:net";

/**
 * What becomes of a chunk: passed on, or the connection cut instead (the server's side destroyed,
 * the client's too — or, with `cutAfterSending`, ended after those bytes, such as a backend's last
 * ErrorResponse).
 */
export type ChunkDecision = "pass" | "cut" | { cutAfterSending: Buffer };

export interface TcpProxyHooks {
  /** Each chunk a client sends, before it reaches the server. */
  fromClient?: (chunk: Buffer) => ChunkDecision;
  /** Each chunk the server answers, before it reaches the client. */
  fromServer?: (chunk: Buffer) => ChunkDecision;
}

export interface TcpProxy {
  /** `dbUrl` with the proxy's port. */
  readonly url: string;
  /** How many connections a hook has had cut so far. */
  cuts(): number;
  /**
   * Drops every connection open now, both sides, whatever passes on them (a network gone for the
   * clients: a backend busy or waiting on a lock finds out only when it next writes). Returns how many
   * connections were open.
   */
  dropAll(): number;
  /** Stops listening and drops every connection still open. */
  close(): Promise<void>;
}

/** Listens on a free port of 127.0.0.1 and relays each connection to `dbUrl`'s host and port. */
export async function startTcpProxy(dbUrl: string, hooks: TcpProxyHooks = {}): Promise<TcpProxy> {
  const upstream = new URL(dbUrl);
  const sockets = new Set<net.Socket>();
  /** Each open connection's client side (its server side is in `sockets` too). */
  const clients = new Map<net.Socket, () => void>();
  let cuts = 0;
  const listener = net.createServer((client) => {
    const server = net.connect(Number(upstream.port), upstream.hostname);
    const cut = (lastWords?: Buffer) => {
      if (lastWords) client.end(lastWords);
      else client.destroy();
      server.destroy();
    };
    const relay = (from: net.Socket, to: net.Socket, hook?: (chunk: Buffer) => ChunkDecision) => {
      sockets.add(from);
      from.on("close", () => sockets.delete(from));
      from.on("error", () => cut());
      from.on("data", (chunk: Buffer) => {
        const decision = hook?.(chunk) ?? "pass";
        if (decision === "pass") to.write(chunk);
        else {
          cuts++;
          cut(decision === "cut" ? undefined : decision.cutAfterSending);
        }
      });
      from.on("end", () => to.end());
    };
    relay(client, server, hooks.fromClient);
    relay(server, client, hooks.fromServer);
    clients.set(client, () => cut());
    client.on("close", () => clients.delete(client));
  });
  await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
  const url = new URL(dbUrl);
  url.port = String((listener.address() as net.AddressInfo).port);
  return {
    url: url.toString(),
    cuts: () => cuts,
    dropAll: () => {
      const open = [...clients.values()];
      for (const drop of open) drop();
      return open.length;
    },
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((r) => listener.close(r));
    },
  };
}
