// A TCP relay in front of PostgreSQL that a test switches between closing every connection it accepts
// (in order, before a byte), holding them without a word, and passing them through: a proxy or port
// forward with nothing behind it, a database that stops answering, and one that comes back.
import net from "node:net";

export type RelayMode = "close" | "hold" | "forward";

/** A TCP relay in front of PostgreSQL. Changing the mode cuts every connection it carries or holds. */
export class DbRelay {
  mode: RelayMode;
  private readonly sockets = new Set<net.Socket>();
  private readonly server: net.Server;
  private readonly target: { host: string; port: number };
  port = 0;
  /** Connections accepted so far, whatever the mode. */
  accepted = 0;

  constructor(target: { host: string; port: number }, mode: RelayMode) {
    this.target = target;
    this.mode = mode;
    this.server = net.createServer((client) => this.accept(client));
  }

  async listen(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.port = (this.server.address() as net.AddressInfo).port;
  }

  private track(s: net.Socket): void {
    this.sockets.add(s);
    s.on("error", () => {});
    s.on("close", () => this.sockets.delete(s));
  }

  private accept(client: net.Socket): void {
    this.accepted++;
    this.track(client);
    // Closed in order (a reset instead fails the query at once, which piles nothing up).
    if (this.mode === "close") return void client.resume().end();
    if (this.mode === "hold") return; // accepted, never answered
    const upstream = net.connect(this.target.port, this.target.host);
    this.track(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  }

  set(mode: RelayMode): void {
    this.mode = mode;
    for (const s of this.sockets) s.destroy();
  }

  close(): Promise<void> {
    this.set("close");
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

/** `url` with its host and port those of `relay` (which leads to `url`'s server). */
export function throughRelay(url: string, relay: DbRelay): string {
  const u = new URL(url);
  u.hostname = "127.0.0.1";
  u.port = String(relay.port);
  return u.toString();
}

/** A relay in `mode` to the server of `url`, listening. */
export async function relayTo(url: string, mode: RelayMode): Promise<DbRelay> {
  const u = new URL(url);
  const relay = new DbRelay({ host: u.hostname, port: Number(u.port) }, mode);
  await relay.listen();
  return relay;
}
