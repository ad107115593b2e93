// Keeps the last `capacity` bytes written to it (a child's stderr, for diagnostics only).
export class RingBuffer {
  /**
   * Allocated on the first write: most programs write nothing to stderr, and a 64 KiB buffer per run
   * was most of what the worker allocated per run — enough to force a full garbage collection every
   * hundred runs. Never read beyond what was written, so it need not be zeroed.
   */
  private buffer: Buffer | undefined;
  private end = 0;
  private filled = false;

  readonly capacity: number;

  constructor(capacity = 64 * 1024) {
    this.capacity = capacity;
  }

  write(chunk: Buffer): void {
    if (chunk.length === 0) return;
    this.buffer ??= Buffer.allocUnsafe(this.capacity);
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
    if (!this.buffer) return Buffer.alloc(0);
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
