// A node:test reporter that test/run.ts adds next to spec and TAP: at the end of the run it writes one
// line per test file, `<milliseconds>\t<file>`, the file's wall time (its process, start to exit). The
// TAP stream has no file names; node:test reports each file as a test of its own, named by its path,
// whose `test:complete` carries that time — the longest top-level duration of the file.
export default async function* fileTimes(source) {
  const times = new Map();
  for await (const event of source) {
    if (event.type !== "test:complete" || event.data.nesting !== 0 || !event.data.file) continue;
    const ms = event.data.details?.duration_ms ?? 0;
    times.set(event.data.file, Math.max(times.get(event.data.file) ?? 0, ms));
  }
  for (const [file, ms] of times) yield `${Math.round(ms)}\t${file}\n`;
}
