// `assay storage migrate`: moves a local installation's files into the configured object store, so
// that API and workers can leave the machine they shared. Keys stay the same (`files/<id>`,
// `outputs/...`), so the database needs no change. Resumable: objects already in the store with the same
// size are skipped. The local copies are left in place (remove them once the installation runs on S3).
import path from "node:path";
import type { Config } from "../config.ts";
import { LocalStore } from "../storage/local.ts";
import { openStore } from "../storage/open.ts";
import type { ObjectStore } from "../storage/store.ts";
import { need, parse, UsageError } from "./usage.ts";

const HELP = `Usage: assay storage migrate [--from DIR]

Copies uploaded files and outputs from a local data directory (DIR, default $ASSAY_DATA_DIR) into the
object store configured by ASSAY_STORAGE=s3 and ASSAY_S3_*, under the same keys. Objects already there
with the same size are skipped, so it can be run again after an interruption. The local copies are
left in place. Run it with the service stopped (or before switching the service to s3).

Example:
  ASSAY_STORAGE=s3 ASSAY_S3_BUCKET=assay-prod assay storage migrate --from /srv/assay`;

const PREFIXES = ["files/", "outputs/"];

export async function storageCommand(argv: string[], config: Config | undefined): Promise<number> {
  const [sub, ...rest] = argv;
  const { values } = parse({
    args: rest,
    options: { help: { type: "boolean", short: "h" }, from: { type: "string" } },
  });
  if (values.help || sub === "--help" || sub === "-h") {
    console.log(HELP);
    return 0;
  }
  if (sub !== "migrate") throw new UsageError(`unknown storage command: ${sub ?? "(none)"}\n\n${HELP}`);
  const cfg = need(config);
  if (cfg.storage !== "s3")
    throw new UsageError("set ASSAY_STORAGE=s3 (and ASSAY_S3_*) to migrate into a bucket");
  const source = new LocalStore(path.resolve(values.from ?? cfg.dataDir));
  const target = await openStore(cfg);
  await target.check();
  const totals = { copied: 0, skipped: 0, bytes: 0 };
  for (const prefix of PREFIXES) {
    const t = await migratePrefix(source, target, prefix, (line) => console.error(line));
    totals.copied += t.copied;
    totals.skipped += t.skipped;
    totals.bytes += t.bytes;
  }
  console.log(JSON.stringify({ from: source.root, storage: target.kind, ...totals }));
  return 0;
}

/** Copies every object under `prefix` that the target lacks (or holds with another size). */
export async function migratePrefix(
  source: LocalStore,
  target: ObjectStore,
  prefix: string,
  progress: (line: string) => void = () => {},
): Promise<{ copied: number; skipped: number; bytes: number }> {
  const t = { copied: 0, skipped: 0, bytes: 0 };
  for (let after: string | undefined; ; ) {
    const page = await source.list(prefix, after === undefined ? {} : { after });
    if (page.length === 0) break;
    const there = await sizesIn(target, prefix, after, page.at(-1)?.key as string);
    for (const o of page) {
      if (there.get(o.key) === o.size) {
        t.skipped++;
        continue;
      }
      await target.putFile(o.key, source.localPath(o.key));
      t.copied++;
      t.bytes += o.size;
    }
    progress(`${prefix}: ${t.copied} copied, ${t.skipped} already there`);
    if (page.length < 1000) break;
    after = page.at(-1)?.key;
  }
  return t;
}

/** Sizes of the target's objects with keys after `after` up to `last` (one or a few list requests). */
async function sizesIn(
  target: ObjectStore,
  prefix: string,
  after: string | undefined,
  last: string,
): Promise<Map<string, number>> {
  const sizes = new Map<string, number>();
  for (let from = after; ; ) {
    const listed = await target.list(prefix, { limit: 1000, ...(from === undefined ? {} : { after: from }) });
    for (const o of listed) sizes.set(o.key, o.size);
    const end = listed.at(-1)?.key;
    if (listed.length < 1000 || end === undefined || end >= last) return sizes;
    from = end;
  }
}
