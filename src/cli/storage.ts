// `assay storage migrate`: moves a local installation's files into the configured object store, so
// that API and workers can leave the machine they shared. Keys stay the same (`files/<id>`,
// `outputs/...`), so the database needs no change. Resumable: objects already in the store with the same
// size are skipped. The local copies are left in place (remove them once the installation runs on S3).
import fs from "node:fs";
import fsp from "node:fs/promises";
import path from "node:path";
import type { Config } from "../config.ts";
import { LocalStore } from "../storage/local.ts";
import { openStore } from "../storage/open.ts";
import { isStoreKey, KEY_PREFIXES, type ObjectStore } from "../storage/store.ts";
import { need, parse, UsageError } from "./usage.ts";

const HELP = `Usage: assay storage migrate [--from DIR]

Copies uploaded files and outputs from a local data directory (DIR, default $ASSAY_DATA_DIR) into the
object store configured by ASSAY_STORAGE=s3 and ASSAY_S3_*, under the same keys. Objects already there
with the same size are skipped, so it can be run again after an interruption. Files whose names Assay
never makes (put there by hand) are left out and named on stderr. Symbolic links (and FIFOs, sockets)
inside files/ and outputs/ are never followed: each is named on stderr, nothing under it is copied,
and when its name is one Assay makes the command exits 1 — put the files themselves in their place
and run it again. The local copies are left in place. Run it with the service stopped (or before
switching the service to s3).

Example:
  ASSAY_STORAGE=s3 ASSAY_S3_BUCKET=assay-prod assay storage migrate --from /srv/assay`;

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
  const source = new LocalStore(checkSource(path.resolve(values.from ?? cfg.dataDir)));
  const target = await openStore(cfg);
  await target.check();
  const totals = { copied: 0, skipped: 0, ignored: 0, notCopied: 0, bytes: 0 };
  for (const prefix of KEY_PREFIXES) {
    const t = await migratePrefix(source, target, prefix, (line) => console.error(line));
    totals.copied += t.copied;
    totals.skipped += t.skipped;
    totals.ignored += t.ignored;
    totals.notCopied += t.notCopied;
    totals.bytes += t.bytes;
  }
  console.log(JSON.stringify({ from: source.root, storage: target.kind, ...totals }));
  if (totals.notCopied === 0) return 0;
  console.error(
    `assay: ${totals.notCopied} links or special files were not copied (named above): put the files themselves in their place and run it again`,
  );
  return 1;
}

/**
 * The source folder, when it can be an installation's data directory. A folder that is not there (a
 * typo, the default ./.assay run from elsewhere) or holds neither `files/` nor `outputs/` used to be
 * "migrated" with nothing copied and exit 0: a summary that read as done, and a service switched to a
 * bucket without its files.
 */
function checkSource(dir: string): string {
  let stat: fs.Stats;
  try {
    stat = fs.statSync(dir);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== "ENOENT" && code !== "ENOTDIR") throw err;
    throw new UsageError(`${dir} does not exist: give the old ASSAY_DATA_DIR with --from`);
  }
  if (!stat.isDirectory())
    throw new UsageError(`${dir} is not a directory: give the old ASSAY_DATA_DIR with --from`);
  if (!KEY_PREFIXES.some((p) => fs.existsSync(path.join(dir, p)))) {
    throw new UsageError(
      `${dir} holds neither files/ nor outputs/: it is not a data directory with anything to migrate (--from)`,
    );
  }
  return dir;
}

/**
 * Entries under `prefix` that are neither files nor folders — a symbolic link above all (a task's
 * outputs moved to another disk and linked back), a FIFO, a socket — with what each is. The local
 * store lists files and folders only, so the copy left these out without a word: a linked input was
 * missing from the bucket, and every run over it failed once the service used it. None is followed (a
 * link may lead out of the data directory, or round in a loop). `prefix`'s own folder may be a link.
 */
async function* notFiles(root: string, prefix: string): AsyncGenerator<{ key: string; what: string }> {
  // A walk of our own, not opendir's `recursive` (before Node 22.12 it listed at most 32 entries of
  // each subfolder; Dirent's parentPath is from 20.12).
  const top = path.join(root, prefix);
  for (const stack = [""]; stack.length > 0; ) {
    const rel = stack.pop() as string;
    let entries: fs.Dirent[];
    try {
      entries = await fsp.readdir(path.join(top, rel), { withFileTypes: true });
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (rel === "" && (code === "ENOENT" || code === "ENOTDIR")) return;
      throw err;
    }
    for (const e of entries) {
      const name = rel === "" ? e.name : `${rel}/${e.name}`;
      if (e.isDirectory()) stack.push(name);
      else if (!e.isFile()) {
        const full = path.join(top, name);
        const what = e.isSymbolicLink()
          ? `a symbolic link to ${JSON.stringify(await fsp.readlink(full).catch(() => "?"))}`
          : e.isFIFO()
            ? "a FIFO"
            : e.isSocket()
              ? "a socket"
              : "a device";
        yield { key: `${prefix}${name}`, what };
      }
    }
  }
}

/**
 * Copies every object under `prefix` that the target lacks (or holds with another size). Files whose
 * keys the service never makes (a note put there by hand, a name with spaces or accents) are left out
 * and named: no row references them, and the store would refuse the key — the whole migration failed on
 * the first one, and again at the same place when resumed. Links and special files (see notFiles) are
 * named and counted as `notCopied` when their key is one the service makes (a row may reference it),
 * as `ignored` when not.
 */
export async function migratePrefix(
  source: LocalStore,
  target: ObjectStore,
  prefix: string,
  progress: (line: string) => void = () => {},
): Promise<{ copied: number; skipped: number; ignored: number; notCopied: number; bytes: number }> {
  const t = { copied: 0, skipped: 0, ignored: 0, notCopied: 0, bytes: 0 };
  for await (const { key, what } of notFiles(source.root, prefix)) {
    if (isStoreKey(key)) {
      t.notCopied++;
      progress(`not copied ${JSON.stringify(key)}: ${what}, never followed (nothing under it is copied)`);
    } else {
      t.ignored++;
      progress(`left out ${JSON.stringify(key)}: ${what}, and not a key Assay makes`);
    }
  }
  for (let after: string | undefined; ; ) {
    const page = await source.list(prefix, after === undefined ? {} : { after });
    if (page.length === 0) break;
    const there = await sizesIn(target, prefix, after, page.at(-1)?.key as string);
    for (const o of page) {
      if (!isStoreKey(o.key)) {
        t.ignored++;
        progress(`left out ${JSON.stringify(o.key)}: not a key Assay makes, so nothing refers to it`);
        continue;
      }
      if (there.get(o.key) === o.size) {
        t.skipped++;
        continue;
      }
      await target.putFile(o.key, source.localPath(o.key));
      t.copied++;
      t.bytes += o.size;
    }
    progress(
      `${prefix}: ${t.copied} copied, ${t.skipped} already there, ${t.ignored + t.notCopied} left out`,
    );
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
