// For the command-line client's tests: a real `assay all` server (own database, own data directory,
// a fixed port so it can be restarted in place), tokens, the client run as a child process, and
// its JSON lines parsed.
import type { ChildProcess } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { freePort } from "../../src/db/embedded.ts";
import { type CliResult, cleanEnv, collect, runCli, spawnCli } from "./cli.ts";
import { createTestDatabase, type TestDatabase } from "./db.ts";
import { waitFor } from "./queue.ts";

export interface ClientServer {
  readonly url: string;
  readonly db: TestDatabase;
  readonly dataDir: string;
  /** Stops the server (SIGTERM, graceful) and waits for it to exit. */
  stop(): Promise<void>;
  /** Starts it again on the same port and waits until it is ready. */
  start(): Promise<void>;
  /** A token of a user of this name (created as a plain user). */
  token(user: string): Promise<string>;
  /** The client's environment for `token`. */
  env(token: string, extra?: Record<string, string>): NodeJS.ProcessEnv;
  close(): Promise<void>;
}

export async function startClientServer(
  o: { concurrency?: number; env?: Record<string, string> } = {},
): Promise<ClientServer> {
  const db = await createTestDatabase();
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-client-"));
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  let server: { child: ChildProcess; done: Promise<CliResult> } | undefined;
  const serverEnv = cleanEnv({
    DATABASE_URL: db.url,
    ASSAY_DATA_DIR: dataDir,
    HOST: "127.0.0.1",
    PORT: String(port),
    LOG_LEVEL: "warn",
    ASSAY_POLL_INTERVAL_MS: "200",
    ASSAY_SSE_HEARTBEAT_MS: "1000",
    ASSAY_SHUTDOWN_GRACE_MS: "3000",
    ...o.env,
  });
  const start = async () => {
    const child = spawnCli(["all", "--concurrency", String(o.concurrency ?? 2)], serverEnv);
    server = { child, done: collect(child) };
    const exited = server.done.then((r) => {
      throw new Error(`assay all exited early (${r.code}):\n${r.stderr}`);
    });
    exited.catch(() => {});
    await Promise.race([
      waitFor(
        () =>
          fetch(`${url}/readyz`).then(
            (r) => r.ok,
            () => false,
          ),
        60_000,
        "the server to be ready",
      ),
      exited,
    ]);
  };
  const stop = async () => {
    if (!server) return;
    const { child, done } = server;
    server = undefined;
    child.kill("SIGTERM");
    await done;
  };
  await start();
  return {
    url,
    db,
    dataDir,
    stop,
    start,
    token: async (user) => (await tokenCreate(db.sql, user)).token,
    env: (token, extra = {}) => cleanEnv({ ASSAY_URL: url, ASSAY_TOKEN: token, ...extra }),
    close: async () => {
      await stop();
      await db.drop();
      fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** Runs `assay <args>` as a client (stdout is a pipe: JSON lines). */
export const client = (args: string[], env: NodeJS.ProcessEnv) => runCli(args, env);

export type Line = Record<string, unknown> & { kind: string };

/** The JSON lines a client printed (every stdout line must be one). */
export function jsonLines(stdout: string): Line[] {
  return stdout
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => {
      try {
        return JSON.parse(l) as Line;
      } catch {
        throw new Error(`not a JSON line: ${l}`);
      }
    });
}

export const ofKind = (lines: Line[], kind: string) => lines.filter((l) => l.kind === kind);

/** A GET on the API with `token`, returning the envelope's data. */
export async function apiGet<T>(server: ClientServer, token: string, route: string): Promise<T> {
  const res = await fetch(`${server.url}${route}`, { headers: { authorization: `Bearer ${token}` } });
  if (!res.ok) throw new Error(`GET ${route}: ${res.status} ${await res.text()}`);
  return ((await res.json()) as { data: T }).data;
}

/** Every item of a paged list route. */
export async function apiAll<T>(server: ClientServer, token: string, route: string): Promise<T[]> {
  const items: T[] = [];
  const sep = route.includes("?") ? "&" : "?";
  for (let cursor: string | null = null; ; ) {
    const page: { items: T[]; nextCursor: string | null } = await apiGet(
      server,
      token,
      `${route}${sep}limit=100${cursor ? `&cursor=${cursor}` : ""}`,
    );
    items.push(...page.items);
    if (page.nextCursor === null) return items;
    cursor = page.nextCursor;
  }
}

/** Every event of a task's log (GET …/logs, all pages). */
export async function taskLog(
  server: ClientServer,
  token: string,
  taskId: string,
): Promise<Record<string, unknown>[]> {
  const events: Record<string, unknown>[] = [];
  for (let after: string | null = null; ; ) {
    const page: { items: { id: string }[]; nextCursor: string | null } = await apiGet(
      server,
      token,
      `/api/analysis-tasks/${taskId}/logs?limit=1000${after ? `&after=${after}` : ""}`,
    );
    events.push(...page.items);
    if (page.nextCursor === null) return events;
    after = page.nextCursor;
  }
}

/** A CSV of `rows` data rows (header `id,value,weight,label`), different for each `seed`. */
export function csv(rows: number, seed: number): string {
  const lines = ["id,value,weight,label"];
  for (let i = 0; i < rows; i++) lines.push(`${i},${(i * seed) % 97},${(i % 13) + seed / 10},row ${i}`);
  return `${lines.join("\n")}\n`;
}
