// A TCP relay in front of PostgreSQL that a test switches between closing every connection it accepts
// (in order, before a byte, or at once), holding them without a word, and passing them through: a
// proxy or port forward with nothing behind it, a database that stops answering, and one that comes
// back. With
// `tls`, it answers a client's SSLRequest itself and speaks TLS to it (test/fixtures/tls: a self-signed
// certificate for localhost), and plain protocol to PostgreSQL: a database under `sslmode=require`.
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import tls from "node:tls";
import { tcpRelay } from "./client.ts";

/** The relay's TLS key and certificate (self-signed, localhost, valid until 2126). */
const TLS_FILES = path.join(import.meta.dirname, "../fixtures/tls");

/**
 * close: accepted and closed in order before a byte; refuse: accepted and destroyed (a reset: the
 * client's query fails at once); hold: accepted, never answered; forward: passed through;
 * tls-close (with `tls`): the SSLRequest answered and the TLS handshake made, then closed — a TLS
 * proxy with nothing behind it; too-many: the start-up answered with PostgreSQL's FATAL 53300 (too many
 * connections), as a database at its `max_connections` answers a new connection; slow: passed through
 * after `slowMs` (a pooler queueing new clients). Assigning `mode` instead of calling set() changes
 * what new connections meet and leaves the open ones be.
 */
export type RelayMode = "close" | "refuse" | "hold" | "forward" | "tls-close" | "too-many" | "slow";

/** An ErrorResponse: FATAL 53300, "sorry, too many clients already". */
function tooManyClients(): Buffer {
  const fields = Buffer.from("SFATAL\0VFATAL\0C53300\0Msorry, too many clients already\0\0");
  const head = Buffer.alloc(5);
  head.write("E", 0);
  head.writeInt32BE(4 + fields.length, 1);
  return Buffer.concat([head, fields]);
}

/** A connection passed through: the client's side and PostgreSQL's. */
interface Pair {
  client: net.Socket;
  upstream: net.Socket;
  joined?: boolean;
  /** strand(): carries nothing for good, and neither side closing closes the other. */
  stranded?: boolean;
}

/** A TCP relay in front of PostgreSQL. Changing the mode cuts every connection it carries or holds. */
export class DbRelay {
  mode: RelayMode;
  private readonly sockets = new Set<net.Socket>();
  private readonly server: net.Server;
  private readonly target: { host: string; port: number };
  port = 0;
  /** Connections accepted so far, whatever the mode. */
  accepted = 0;
  /** How long `slow` holds a new connection before passing it through. */
  slowMs = 1_000;
  /** Connections passed through (without `tls`), for freeze(). */
  private readonly pairs = new Set<Pair>();
  private frozen = false;

  /**
   * Sockets open now (either side). `set` cuts them: a client cut during its TLS handshake fails its
   * waiting query (postgres.js takes a TLS error as the query's), where one closed after it waits on.
   */
  get open(): number {
    return this.sockets.size;
  }

  /**
   * The local ports of the connections passed through to PostgreSQL now (without `tls`): their
   * `client_port` in pg_stat_activity.
   */
  get upstreamPorts(): number[] {
    return [...this.pairs].flatMap(({ upstream }) => (upstream.localPort ? [upstream.localPort] : []));
  }

  private readonly tls: { key: Buffer; cert: Buffer } | undefined;

  constructor(target: { host: string; port: number }, mode: RelayMode, options: { tls?: boolean } = {}) {
    this.target = target;
    this.mode = mode;
    this.tls = options.tls
      ? {
          key: fs.readFileSync(path.join(TLS_FILES, "localhost-key.pem")),
          cert: fs.readFileSync(path.join(TLS_FILES, "localhost-cert.pem")),
        }
      : undefined;
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
    if (this.mode === "refuse") return void client.destroy();
    if (this.mode === "hold") return; // accepted, never answered
    if (this.mode === "too-many") return void client.once("data", () => client.end(tooManyClients()));
    // (Read to the end as well, or the client's FIN is never seen and the socket never closes.)
    if (this.mode === "tls-close") return void this.secure(client, (secure) => secure.resume().end());
    if (this.mode === "slow") {
      const timer = setTimeout(() => this.forward(client), this.slowMs);
      client.once("close", () => clearTimeout(timer));
      return;
    }
    this.forward(client);
  }

  private forward(client: net.Socket): void {
    const upstream = net.connect(this.target.port, this.target.host);
    this.track(upstream);
    if (!this.tls) {
      const pair: Pair = { client, upstream };
      // A stranded pair's client closing says nothing to PostgreSQL either: its backend lives on (as
      // across a cut path), until close() or the backend's end.
      client.on("close", () => {
        if (!pair.stranded) upstream.destroy();
      });
      upstream.on("close", () => {
        if (!pair.stranded) client.destroy();
      });
      this.pairs.add(pair);
      client.on("close", () => this.pairs.delete(pair));
      if (!this.frozen) this.join(pair);
      return;
    }
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
    this.secure(client, (secure) => {
      secure.on("close", () => upstream.destroy());
      upstream.on("close", () => secure.destroy());
      secure.pipe(upstream);
      upstream.pipe(secure);
    });
  }

  private join(pair: Pair): void {
    if (pair.joined || pair.stranded) return;
    pair.joined = true;
    pair.client.pipe(pair.upstream);
    pair.upstream.pipe(pair.client);
  }

  /**
   * A network partition: the connections passed through (without `tls`) stop carrying bytes either
   * way without closing — what each side sends waits — and new connections are held unanswered.
   */
  freeze(): void {
    this.frozen = true;
    this.mode = "hold";
    this.pause([...this.pairs]);
  }

  /** `pairs` stop carrying bytes either way; what each side sends waits. */
  private pause(pairs: Pair[]): void {
    for (const pair of pairs) {
      pair.client.unpipe(pair.upstream);
      pair.upstream.unpipe(pair.client);
      pair.client.pause();
      pair.upstream.pause();
      pair.joined = false;
    }
  }

  /**
   * The connections passed through now (without `tls`) stop carrying bytes either way for good,
   * without closing — not even when PostgreSQL ends their backends: a path to a database host that
   * went away without a word, as a failover leaves its clients' old connections. New connections are
   * passed through as before. With "answers", only PostgreSQL's side stops (what the clients send
   * still arrives; the answers wait: a backend writing a large one blocks). Returns the stranded
   * connections' local ports on PostgreSQL's side (their backends' `client_port`).
   */
  strand(which: "both" | "answers" = "both"): number[] {
    const ports = this.upstreamPorts;
    for (const pair of this.pairs) pair.stranded = true;
    if (which === "both") this.pause([...this.pairs]);
    else
      for (const pair of this.pairs) {
        pair.upstream.unpipe(pair.client);
        pair.upstream.pause();
      }
    return ports;
  }

  /** The partition healed: what waited is delivered, and new connections are passed through. */
  thaw(): void {
    this.frozen = false;
    this.mode = "forward";
    for (const pair of this.pairs) this.join(pair);
  }

  /** Answers the client's SSLRequest (8 bytes) with 'S' and ends TLS here; `then` gets the TLS side. */
  private secure(client: net.Socket, then: (secure: tls.TLSSocket) => void): void {
    const keys = this.tls;
    if (!keys) throw new Error("this relay has no TLS");
    const onReadable = () => {
      const request = client.read(8);
      if (request === null) return void client.once("readable", onReadable);
      client.write("S");
      const secure = new tls.TLSSocket(client, { isServer: true, ...keys });
      // The TLS socket takes the plain one's handle: that one emits no `close` any more.
      this.sockets.delete(client);
      this.track(secure);
      secure.once("secure", () => then(secure));
    };
    client.once("readable", onReadable);
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
export async function relayTo(
  url: string,
  mode: RelayMode,
  options: { tls?: boolean } = {},
): Promise<DbRelay> {
  const u = new URL(url);
  const relay = new DbRelay({ host: u.hostname, port: Number(u.port) }, mode, options);
  await relay.listen();
  return relay;
}

/**
 * A TCP proxy to the server of `url` that passes everything through but the backend's BackendKeyData
 * in each connection's start-up, whose pid it replaces with one of its own — as a pooler (PgBouncer)
 * answers with a key of its own. Returns its port and how to close it.
 */
export async function keyFakingProxy(url: string): Promise<{ port: number; close(): void }> {
  let fake = 1_000_000;
  return tcpRelay(new URL(url), (client, upstream) => {
    client.pipe(upstream);
    // The start-up's messages, one by one, until its ReadyForQuery; then everything as it comes.
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      while (head.length >= 5 && head.length >= head.readUInt32BE(1) + 1) {
        const message = Buffer.from(head.subarray(0, head.readUInt32BE(1) + 1));
        head = head.subarray(message.length);
        if (message[0] === 0x4b) message.writeInt32BE(fake++, 5);
        client.write(message);
        if (message[0] === 0x5a) {
          upstream.off("data", onData);
          if (head.length > 0) client.write(head);
          upstream.pipe(client);
          return;
        }
      }
    };
    upstream.on("data", onData);
  });
}
