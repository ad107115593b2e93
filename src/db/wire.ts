// What a pool connection's plain socket says, followed message by message without reading the
// messages themselves (pacedSocket, for the database gate): the backend's process id from its
// BackendKeyData, each ReadyForQuery, and how many answers the client is owed — one per start-up,
// simple query and Sync written (the protocol answers each with exactly one ReadyForQuery). Under TLS
// the plain socket carries ciphertext once the handshake starts: nothing is followed from then on.

/** The protocol codes of the untyped messages a client may send first (their second int32). */
const PROTOCOL_3 = 196_608;
const SSL_REQUEST = 80_877_103;
const GSSENC_REQUEST = 80_877_104;

const READY_FOR_QUERY = 0x5a; // 'Z'
const BACKEND_KEY_DATA = 0x4b; // 'K'
const QUERY = 0x51; // 'Q'
const SYNC = 0x53; // 'S'
const FLUSH = 0x48; // 'H'

/**
 * Splits a byte stream into messages (a type byte and an int32 length that counts itself, or — the
 * client's first messages — an int32 length and an int32 code), told to `on` with the bytes holding
 * the message's head (its type or length, and `headFor(type)` bytes more) and where it starts there.
 * Bodies are skipped, not copied; a head cut across chunks is kept until whole.
 */
class Frames {
  /** The client's messages up to its StartupMessage have no type byte. */
  untyped: boolean;
  /** Single bytes to pass over before the next message (the server's answer to an SSLRequest). */
  loose = 0;
  /** The stream stopped making sense (a length out of range): nothing more is followed. */
  lost = false;
  private head: Buffer | undefined;
  private skip = 0;
  private readonly headFor: (type: number) => number;
  private readonly on: (type: number, bytes: Buffer, at: number) => void;

  constructor(
    untyped: boolean,
    headFor: (type: number) => number,
    on: (type: number, bytes: Buffer, at: number) => void,
  ) {
    this.untyped = untyped;
    this.headFor = headFor;
    this.on = on;
  }

  feed(chunk: Buffer): void {
    let i = 0;
    while (i < chunk.length && !this.lost) {
      if (this.skip > 0) {
        const n = Math.min(this.skip, chunk.length - i);
        this.skip -= n;
        i += n;
        continue;
      }
      if (this.loose > 0 && this.head === undefined) {
        this.loose--;
        i++;
        continue;
      }
      // A message's head: 8 bytes untyped, else the type byte, its length and what headFor asks. Read
      // in place when the chunk holds it whole (no copy per message), else gathered across chunks.
      let head: Buffer;
      let at: number;
      const first = this.head?.[0] ?? (chunk[i] as number);
      const want = this.untyped ? 8 : 5 + this.headFor(first);
      if (this.head === undefined && chunk.length - i >= want) {
        head = chunk;
        at = i;
        i += want;
      } else {
        const have = this.head?.length ?? 0;
        const take = Math.min(want - have, chunk.length - i);
        const part = chunk.subarray(i, i + take);
        this.head = this.head === undefined ? Buffer.from(part) : Buffer.concat([this.head, part]);
        i += take;
        if (this.head.length < want) return;
        head = this.head;
        at = 0;
        this.head = undefined;
      }
      const length = head.readUInt32BE(at + (this.untyped ? 0 : 1));
      const rest = this.untyped ? length - want : length + 1 - want;
      if (length < (this.untyped ? 8 : 4) || rest < 0) {
        this.lost = true;
        return;
      }
      this.skip = rest;
      this.on(this.untyped ? -1 : first, head, at);
    }
  }
}

/** One pool connection's conversation with its database, as far as the database gate needs it. */
export class Conversation {
  /** The backend's process id (BackendKeyData, at the end of the start-up), once known. */
  pid: number | undefined;
  /** When BackendKeyData was read (performance.now()): its backend had started by then. */
  keyAt = 0;
  /** ReadyForQuery messages owed: start-ups, simple queries and Syncs written, less those read. */
  owed = 0;
  /** A Flush written and no message read since (a statement's first Parse/Describe, a cursor's Execute). */
  flushed = false;
  /** Whether an answer is owed. */
  get waiting(): boolean {
    return this.owed > 0 || this.flushed;
  }
  /** When the conversation last moved while answers were owed: a byte read, or an ask after none. */
  movedAt = 0;
  /** Whether the stream stopped making sense on either side (then it is never judged silent). */
  get lost(): boolean {
    return this.written.lost || this.read.lost;
  }
  private readonly written: Frames;
  private readonly read: Frames;
  private readonly onReady: () => void;

  /** `onReady`: each ReadyForQuery read (the database answered on this connection). */
  constructor(onReady: () => void) {
    this.onReady = onReady;
    this.written = new Frames(
      true,
      () => 0,
      (type, bytes, at) => this.sent(type, bytes, at),
    );
    this.read = new Frames(
      false,
      (type) => (type === BACKEND_KEY_DATA ? 4 : type === READY_FOR_QUERY ? 1 : 0),
      (type, bytes, at) => this.received(type, bytes, at),
    );
  }

  /** The client wrote something that is not followed: the conversation is never judged silent. */
  lose(): void {
    this.written.lost = true;
  }

  /** Bytes the client wrote. */
  wrote(chunk: Buffer): void {
    this.written.feed(chunk);
  }

  /** Bytes the client read. */
  got(chunk: Buffer): void {
    if (this.waiting) this.movedAt = performance.now();
    this.read.feed(chunk);
  }

  private ask(): void {
    if (!this.waiting) this.movedAt = performance.now();
    this.owed++;
  }

  private sent(type: number, bytes: Buffer, at: number): void {
    if (type !== -1) {
      if (type === QUERY || type === SYNC) this.ask();
      else if (type === FLUSH) {
        if (!this.waiting) this.movedAt = performance.now();
        this.flushed = true;
      }
      return;
    }
    const code = bytes.readUInt32BE(at + 4);
    if (code === SSL_REQUEST || code === GSSENC_REQUEST) {
      // Answered with one byte: 'N' (plain on) or 'S'/'G' (encrypted from then on: nothing more is
      // followed, postgres.js takes the socket's listeners away).
      this.read.loose++;
      return;
    }
    // The StartupMessage (answered, after authentication, with a ReadyForQuery); a CancelRequest
    // gets no answer. Typed messages follow either way.
    if (code >> 16 === PROTOCOL_3 >> 16) this.ask();
    this.written.untyped = false;
  }

  private received(type: number, bytes: Buffer, at: number): void {
    this.flushed = false;
    if (type === BACKEND_KEY_DATA) {
      this.pid = bytes.readInt32BE(at + 5);
      this.keyAt = performance.now();
    } else if (type === READY_FOR_QUERY) {
      if (this.owed > 0) this.owed--;
      this.onReady();
    }
  }
}
