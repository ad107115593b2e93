// Keeps the last `capacity` bytes written to it (a child's stderr, for diagnostics only).
export class RingBuffer {
  private readonly buffer: Buffer;
  private end = 0;
  private filled = false;

  constructor(readonly capacity = 64 * 1024) {
    this.buffer = Buffer.alloc(capacity);
  }

  write(chunk: Buffer): void {
    if (chunk.length >= this.capacity) {
      chunk.copy(this.buffer, 0, chunk.length - this.capacity);
      this.end = 0;
      this.filled = true;
      return;
    }
    const first = Math.min(chunk.length, this.capacity - this.end);
    chunk.copy(this.buffer, this.end, 0, first);
    if (first < chunk.length) {
      chunk.copy(this.buffer, 0, first);
      this.end = chunk.length - first;
      this.filled = true;
    } else {
      this.end += first;
      if (this.end === this.capacity) {
        this.end = 0;
        this.filled = true;
      }
    }
  }

  /** The retained bytes, oldest first. */
  contents(): Buffer {
    return this.filled
      ? Buffer.concat([this.buffer.subarray(this.end), this.buffer.subarray(0, this.end)])
      : Buffer.from(this.buffer.subarray(0, this.end));
  }

  /** The last `maxChars` characters as text (a cut multi-byte character becomes U+FFFD). */
  tail(maxChars: number): string {
    const text = this.contents().toString("utf8");
    return text.length > maxChars ? text.slice(text.length - maxChars) : text;
  }
}
