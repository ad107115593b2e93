// A streaming zip writer: entries are written one after the other as their content arrives, and all
// that is kept per entry until the end is its central directory record, as bytes, in large shared
// blocks (46 bytes + its name + 9; ~80 bytes for `<input name>/result.json`). The output is the same,
// byte for byte, as yazl's (which this replaced: it keeps an object per entry and scans them all for
// every entry it writes) with yazl's defaults — deflate at level 6, data descriptors, UTF-8 names, an
// Info-ZIP extended timestamp, mode 0664 — and ZIP64 records exactly when yazl writes them (an entry or
// an offset past 4 GiB; 65,535 entries or more). test/unit/zip.test.ts checks both.
import type { Readable } from "node:stream";
import { pipeline, Transform } from "node:stream";
import zlib from "node:zlib";

export interface ZipOptions {
  /** Every entry's modification time (default: when the writer is made). */
  mtime?: Date;
  /** Deflate (level 6, the default) or store. */
  compress?: boolean;
  /** ZIP64 records for every entry and the end record, whatever the sizes (for tests). */
  forceZip64?: boolean;
}

const LOCAL_HEADER = 30;
const CENTRAL_HEADER = 46;
const UT_EXTRA = 9;
const ZIP64_EXTRA = 28;
const VERSION_MADE_BY = (3 << 8) | 63; // unix, spec 6.3
const VERSION_UTF8 = 20;
const VERSION_ZIP64 = 45;
const FLAGS = (1 << 11) | (1 << 3); // UTF-8 name; sizes and CRC in a data descriptor
const UNIX_FILE_0664 = (0o100664 << 16) >>> 0;
const MAX32 = 0xffffffff;
/** Central directory records are written into blocks of this size (one more when one is full). */
const BLOCK = 256 * 1024;

/** CRC-32 (zlib's when it has one: Node ≥ 20.15). */
const crc32: (data: Buffer, value: number) => number =
  typeof zlib.crc32 === "function" ? zlib.crc32 : crc32Js;

let table: Int32Array | undefined;
function crc32Js(data: Buffer, value: number): number {
  if (!table) {
    table = new Int32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      table[n] = c;
    }
  }
  let c = ~value;
  for (let i = 0; i < data.length; i++) c = (table[(c ^ (data[i] as number)) & 0xff] as number) ^ (c >>> 8);
  return ~c >>> 0;
}

/** The DOS date and time of `d`, in local time (as yazl and Info-ZIP write them). */
function dosDateTime(d: Date): { date: number; time: number } {
  const min = new Date(1980, 0, 1);
  const max = new Date(2107, 11, 31, 23, 59, 58);
  const t = d < min ? min : d > max ? max : d;
  return {
    date: (t.getDate() & 0x1f) | (((t.getMonth() + 1) & 0xf) << 5) | (((t.getFullYear() - 1980) & 0x7f) << 9),
    time: Math.floor(t.getSeconds() / 2) | ((t.getMinutes() & 0x3f) << 5) | ((t.getHours() & 0x1f) << 11),
  };
}

function writeUInt64(b: Buffer, n: number, at: number): void {
  b.writeUInt32LE(n % 0x100000000, at);
  b.writeUInt32LE(Math.floor(n / 0x100000000), at + 4);
}

/** Checks a name the way yazl does: relative, no `..`, not a directory. */
function entryName(name: string): Buffer {
  const n = name.replace(/\\/g, "/");
  if (n === "") throw new Error("empty zip entry name");
  if (/^[a-zA-Z]:/.test(n) || n.startsWith("/")) throw new Error(`absolute path: ${n}`);
  if (n.split("/").includes("..")) throw new Error(`invalid relative path: ${n}`);
  if (n.endsWith("/")) throw new Error(`file path cannot end with '/': ${n}`);
  const bytes = Buffer.from(n);
  if (bytes.length > 0xffff) throw new Error(`zip entry name too long: ${bytes.length} bytes`);
  return bytes;
}

/**
 * Writes a zip as a sequence of chunks: `entry()` for each file, in order, then `end()`. Use it from
 * one async generator (e.g. behind `Readable.from`), so the reader's pace is the writer's.
 */
export class ZipWriter {
  private readonly compress: boolean;
  private readonly forceZip64: boolean;
  private readonly dos: { date: number; time: number };
  private readonly unixTime: number;
  /** Bytes written so far. */
  private offset = 0;
  private entries = 0;
  /** The central directory so far: full blocks, and the block being filled. */
  private readonly blocks: Buffer[] = [];
  private block = Buffer.allocUnsafe(BLOCK);
  private used = 0;

  constructor(o: ZipOptions = {}) {
    const mtime = o.mtime ?? new Date();
    this.compress = o.compress ?? true;
    this.forceZip64 = o.forceZip64 ?? false;
    this.dos = dosDateTime(mtime);
    this.unixTime = Math.min(0x7fffffff, Math.max(-0x80000000, Math.floor(mtime.getTime() / 1000)));
  }

  /** The zip's size so far, in bytes. */
  get size(): number {
    return this.offset;
  }

  /**
   * One file: its local header, its content from `source` (deflated as it comes) and its data
   * descriptor. `source` is consumed whole, or destroyed when this ends early (an error, or the
   * generator closed by a reader that left); its error is thrown.
   */
  async *entry(name: string, source: Readable): AsyncGenerator<Buffer> {
    // Whatever ends this early (a bad name, an error, a reader that left while the header was out)
    // releases the source.
    let out: Readable | undefined;
    try {
      const utf8 = entryName(name);
      const headerOffset = this.offset;
      const method = this.compress ? 8 : 0;
      const local = Buffer.alloc(LOCAL_HEADER + utf8.length);
      local.writeUInt32LE(0x04034b50, 0);
      local.writeUInt16LE(VERSION_UTF8, 4);
      local.writeUInt16LE(FLAGS, 6);
      local.writeUInt16LE(method, 8);
      local.writeUInt16LE(this.dos.time, 10);
      local.writeUInt16LE(this.dos.date, 12);
      // CRC and sizes (14..26) stay zero: they follow in the data descriptor.
      local.writeUInt16LE(utf8.length, 26);
      utf8.copy(local, LOCAL_HEADER);
      this.offset += local.length;
      yield local;

      let crc = 0;
      let size = 0;
      let compressedSize = 0;
      const meter = new Transform({
        transform(chunk: Buffer, _encoding, done) {
          crc = crc32(chunk, crc);
          size += chunk.length;
          done(null, chunk);
        },
      });
      // pipeline destroys every stream with the first error, so the output's iteration throws it.
      out = this.compress
        ? pipeline(source, meter, zlib.createDeflateRaw({ level: 6 }), () => {})
        : pipeline(source, meter, () => {});
      for await (const chunk of out as AsyncIterable<Buffer>) {
        compressedSize += chunk.length;
        this.offset += chunk.length;
        yield chunk;
      }

      const zip64 =
        this.forceZip64 || size > 0xfffffffe || compressedSize > 0xfffffffe || headerOffset > 0xfffffffe;
      const descriptor = Buffer.alloc(zip64 ? 24 : 16);
      descriptor.writeUInt32LE(0x08074b50, 0);
      descriptor.writeUInt32LE(crc, 4);
      if (zip64) {
        writeUInt64(descriptor, compressedSize, 8);
        writeUInt64(descriptor, size, 16);
      } else {
        descriptor.writeUInt32LE(compressedSize, 8);
        descriptor.writeUInt32LE(size, 12);
      }
      this.offset += descriptor.length;
      this.record(utf8, { crc, size, compressedSize, headerOffset, zip64, method });
      yield descriptor;
    } finally {
      // Destroying the last stream of the pipeline destroys the others; before it, the source alone.
      if (out) {
        if (!out.readableEnded) out.destroy();
      } else source.destroy();
    }
  }

  /** The entry's central directory record, appended to the blocks. */
  private record(
    utf8: Buffer,
    e: {
      crc: number;
      size: number;
      compressedSize: number;
      headerOffset: number;
      zip64: boolean;
      method: number;
    },
  ): void {
    const length = CENTRAL_HEADER + utf8.length + UT_EXTRA + (e.zip64 ? ZIP64_EXTRA : 0);
    if (this.used + length > this.block.length) {
      if (this.used > 0) this.blocks.push(this.block.subarray(0, this.used));
      this.block = Buffer.allocUnsafe(Math.max(BLOCK, length));
      this.used = 0;
    }
    const b = this.block;
    const at = this.used;
    b.writeUInt32LE(0x02014b50, at);
    b.writeUInt16LE(VERSION_MADE_BY, at + 4);
    b.writeUInt16LE(e.zip64 ? VERSION_ZIP64 : VERSION_UTF8, at + 6);
    b.writeUInt16LE(FLAGS, at + 8);
    b.writeUInt16LE(e.method, at + 10);
    b.writeUInt16LE(this.dos.time, at + 12);
    b.writeUInt16LE(this.dos.date, at + 14);
    b.writeUInt32LE(e.crc, at + 16);
    b.writeUInt32LE(e.zip64 ? MAX32 : e.compressedSize, at + 20);
    b.writeUInt32LE(e.zip64 ? MAX32 : e.size, at + 24);
    b.writeUInt16LE(utf8.length, at + 28);
    b.writeUInt16LE(UT_EXTRA + (e.zip64 ? ZIP64_EXTRA : 0), at + 30);
    b.writeUInt16LE(0, at + 32); // comment length
    b.writeUInt16LE(0, at + 34); // disk number
    b.writeUInt16LE(0, at + 36); // internal attributes
    b.writeUInt32LE(UNIX_FILE_0664, at + 38);
    b.writeUInt32LE(e.zip64 ? MAX32 : e.headerOffset, at + 42);
    let p = at + CENTRAL_HEADER;
    p += utf8.copy(b, p);
    // Info-ZIP extended timestamp: modification time (the access-time flag set, as Info-ZIP does).
    b.writeUInt16LE(0x5455, p);
    b.writeUInt16LE(UT_EXTRA - 4, p + 2);
    b.writeUInt8(3, p + 4);
    b.writeInt32LE(this.unixTime, p + 5);
    p += UT_EXTRA;
    if (e.zip64) {
      b.writeUInt16LE(0x0001, p);
      b.writeUInt16LE(ZIP64_EXTRA - 4, p + 2);
      writeUInt64(b, e.size, p + 4);
      writeUInt64(b, e.compressedSize, p + 12);
      writeUInt64(b, e.headerOffset, p + 20);
    }
    this.used += length;
    this.entries++;
  }

  /** The central directory and the end records; nothing may be added after. */
  *end(): Generator<Buffer> {
    const cdOffset = this.offset;
    const blocks = [...this.blocks, this.block.subarray(0, this.used)];
    this.blocks.length = 0;
    this.block = Buffer.alloc(0);
    this.used = 0;
    let cdSize = 0;
    for (const b of blocks) {
      cdSize += b.length;
      this.offset += b.length;
      if (b.length > 0) yield b;
    }
    const zip64 = this.forceZip64 || this.entries >= 0xffff || cdSize >= MAX32 || cdOffset >= MAX32;
    const eocd = Buffer.alloc(22);
    eocd.writeUInt32LE(0x06054b50, 0);
    const count = this.forceZip64 || this.entries >= 0xffff ? 0xffff : this.entries;
    eocd.writeUInt16LE(count, 8);
    eocd.writeUInt16LE(count, 10);
    eocd.writeUInt32LE(this.forceZip64 || cdSize >= MAX32 ? MAX32 : cdSize, 12);
    eocd.writeUInt32LE(this.forceZip64 || cdOffset >= MAX32 ? MAX32 : cdOffset, 16);
    if (!zip64) {
      this.offset += eocd.length;
      yield eocd;
      return;
    }
    const record = Buffer.alloc(56);
    record.writeUInt32LE(0x06064b50, 0);
    writeUInt64(record, 56 - 12, 4);
    record.writeUInt16LE(VERSION_MADE_BY, 12);
    record.writeUInt16LE(VERSION_ZIP64, 14);
    writeUInt64(record, this.entries, 24);
    writeUInt64(record, this.entries, 32);
    writeUInt64(record, cdSize, 40);
    writeUInt64(record, cdOffset, 48);
    const locator = Buffer.alloc(20);
    locator.writeUInt32LE(0x07064b50, 0);
    writeUInt64(locator, this.offset, 8);
    locator.writeUInt32LE(1, 16);
    const tail = Buffer.concat([record, locator, eocd]);
    this.offset += tail.length;
    yield tail;
  }
}
