// For the command-line client's tests: a real `assay all` server (own database, own data directory,
// a fixed port so it can be restarted in place), tokens, the client run as a child process, and
// its JSON lines parsed.
import type { ChildProcess } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before } from "node:test";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { freePort } from "../../src/db/embedded.ts";
import { type CliResult, cleanEnv, collect, runCli, spawnCli } from "./cli.ts";
import { createTestDatabase, type TestDatabase } from "./db.ts";
import { idsCrossPowerOfTen, waitFor } from "./queue.ts";
import { scratchDir } from "./tmp.ts";

export interface ClientServer {
  readonly url: string;
  readonly db: TestDatabase;
  readonly dataDir: string;
  /** Whether a server process is up (started, and neither stopped nor exited since). */
  readonly running: boolean;
  /**
   * Stops the server (SIGTERM, graceful) and waits for it to exit: at most STOP_TIMEOUT_MS, after
   * which it is killed and stop() fails with the server's log.
   */
  stop(): Promise<void>;
  /** Starts it again on the same port and waits until it is ready (at most 60 s). */
  start(): Promise<void>;
  /**
   * Rejects, with the server's log, when the server that is up now exits without stop() (never
   * resolves): race a wait on a client against it, so a server that died fails the test at once.
   */
  exited(): Promise<never>;
  /** The last of what every server process of this instance printed, for failure messages. */
  log(): string;
  /** A token of a user of this name (created as a plain user). */
  token(user: string): Promise<string>;
  /** The client's environment for `token`. */
  env(token: string, extra?: Record<string, string>): NodeJS.ProcessEnv;
  close(): Promise<void>;
}

/**
 * How long stop() waits for the server to exit after SIGTERM. The server bounds its own shutdown
 * (close-with-grace; about 24 s with the settings below); beyond that it is stuck, and the test must
 * say so rather than wait for ever.
 */
const STOP_TIMEOUT_MS = 60_000;

/** `promise`, or a rejection naming `what` (and `detail()`, read then) after `ms`. */
export function within<T>(
  promise: Promise<T>,
  ms: number,
  what: string,
  detail: () => string = () => "",
): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`timed out after ${ms} ms waiting for ${what}\n${detail()}`)),
      ms,
    );
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** Whether `port` on 127.0.0.1 can be listened on now. */
function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = net.createServer();
    probe.unref();
    probe.once("error", () => resolve(false));
    probe.listen(port, "127.0.0.1", () => probe.close(() => resolve(true)));
  });
}

/**
 * A port for a server that is stopped and started again on it. A port of the kernel's ephemeral
 * range (where freePort()'s come from) may be handed to anyone while the server is down — another
 * test's freePort(), or the local end of any outgoing connection — and the restart then fails to
 * listen, or another test's server answers in its place. Ports below the range are never handed
 * out by the kernel: one is picked at random there (checked free now).
 */
async function restartablePort(): Promise<number> {
  let low = 32_768;
  try {
    low = Number(fs.readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
  } catch {
    // Not Linux: the usual range.
  }
  const floor = 10_000;
  if (Number.isInteger(low) && low > floor + 1000) {
    for (let i = 0; i < 50; i++) {
      const port = floor + Math.floor(Math.random() * (low - floor));
      if (await canListen(port)) return port;
    }
  }
  return freePort();
}

export async function startClientServer(
  o: { concurrency?: number; env?: Record<string, string> } = {},
): Promise<ClientServer> {
  const db = await createTestDatabase();
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-client-"));
  const port = await restartablePort();
  const url = `http://127.0.0.1:${port}`;
  let server:
    | { child: ChildProcess; done: Promise<CliResult>; exited: Promise<never>; stopping: boolean }
    | undefined;
  let log = "";
  let starts = 0;
  const append = (text: string) => {
    log = (log + text).slice(-20_000);
  };
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
  const logged = () => `assay all on ${url} printed:\n${log}`;
  const start = async () => {
    const child = spawnCli(["all", "--concurrency", String(o.concurrency ?? 2)], serverEnv);
    append(`--- start ${++starts} (pid ${child.pid}) ---\n`);
    child.stdout?.on("data", (c: Buffer) => append(c.toString()));
    child.stderr?.on("data", (c: Buffer) => append(c.toString()));
    const done = collect(child);
    const current = { child, done, exited: undefined as unknown as Promise<never>, stopping: false };
    // An exit stop() asked for is no news: only another one rejects.
    current.exited = done.then((r) =>
      current.stopping
        ? new Promise<never>(() => {})
        : Promise.reject(
            new Error(
              `assay all (pid ${child.pid}) exited (${r.code ?? r.signal}) while it was up\n${logged()}`,
            ),
          ),
    );
    current.exited.catch(() => {});
    const { exited } = current;
    server = current;
    done.then(() => {
      if (server === current) server = undefined;
    });
    try {
      await Promise.race([
        waitFor(
          () =>
            // Bounded: a connection accepted but never answered must not stall the wait.
            fetch(`${url}/readyz`, { signal: AbortSignal.timeout(5_000) }).then(
              (r) => r.ok,
              () => false,
            ),
          60_000,
          "the server to be ready",
        ).catch((err: Error) => {
          throw new Error(`${err.message}\n${logged()}`);
        }),
        exited,
      ]);
      // Answered, but by whom? A server that could not listen has exited by now or soon.
      if (child.exitCode !== null || child.signalCode !== null) await exited;
    } catch (err) {
      if (server === current) {
        current.stopping = true;
        server = undefined;
        child.kill("SIGKILL");
        await done;
      }
      throw err;
    }
  };
  const stop = async () => {
    if (!server) return;
    const { child, done } = server;
    server.stopping = true;
    server = undefined;
    child.kill("SIGTERM");
    try {
      await within(done, STOP_TIMEOUT_MS, `assay all (pid ${child.pid}) to exit after SIGTERM`, logged);
    } catch (err) {
      child.kill("SIGKILL");
      await within(done, 10_000, `assay all (pid ${child.pid}) to exit after SIGKILL`, logged);
      throw err;
    }
  };
  await start();
  return {
    url,
    db,
    dataDir,
    get running() {
      return server !== undefined;
    },
    stop,
    start,
    exited: () =>
      server?.exited ?? Promise.reject(new Error(`assay all on ${url} is not running\n${logged()}`)),
    log: () => log,
    token: async (user) => (await tokenCreate(db.sql, user)).token,
    env: (token, extra = {}) => cleanEnv({ ASSAY_URL: url, ASSAY_TOKEN: token, ...extra }),
    close: async () => {
      await stop();
      await db.drop();
      fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** What a client test file shares, set by clientSuite()'s `before` (read it in tests and hooks). */
export interface ClientSuite {
  readonly server: ClientServer;
  /** A token of the suite's user. */
  readonly token: string;
  /** A scratch folder of the file's own, removed when the test process exits. */
  readonly work: string;
  /** The client's environment for the suite's token (`server.env(token, extra)`). */
  env(extra?: Record<string, string>): NodeJS.ProcessEnv;
}

/**
 * Submits, with `assay submit --follow`, a task of `summary` over two CSVs with hostile names (a
 * right-to-left override, CJK) in a folder `entrées` of the suite's scratch folder; its id.
 */
export async function submitHostilePair(suite: ClientSuite): Promise<string> {
  const dir = path.join(suite.work, "entrées");
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, "relevé \u202efdp.csv"), csv(30, 3));
  fs.writeFileSync(path.join(dir, "日本語 データ.csv"), csv(30, 7));
  const r = await collect(spawnCli(["submit", "--type", "summary", dir, "--follow"], suite.env()));
  if (r.code !== 0) throw new Error(`submit exited ${r.code}: ${r.stderr}`);
  return String(ofKind(jsonLines(r.stdout), "task")[0]?.taskId);
}

/**
 * Registers the `before` and `after` of a client test file: a server (`concurrency`, 2 unless
 * told), a token of `user`, a scratch folder named from `scratch`, and the ids of `ids`' tables made
 * to cross a power of ten after that many of them (idsCrossPowerOfTen), so that one compared or
 * sorted as text comes out wrong.
 */
export function clientSuite(o: {
  user: string;
  scratch: string;
  concurrency?: number;
  ids?: Partial<Record<"tasks" | "runs" | "files", number>>;
  /** More set-up, run at the end of the suite's `before` (a `before` of the file's own would run alongside it). */
  setup?: () => Promise<void>;
}): ClientSuite {
  let state: { server: ClientServer; token: string; work: string } | undefined;
  let server: ClientServer | undefined;
  before(async () => {
    server = await startClientServer({ concurrency: o.concurrency ?? 2 });
    const token = await server.token(o.user);
    const work = scratchDir(o.scratch);
    for (const [table, below] of Object.entries(o.ids ?? {}))
      await idsCrossPowerOfTen(server.db.sql, table, below);
    state = { server, token, work };
    await o.setup?.();
  });
  after(async () => {
    await server?.close();
  });
  const get = () => {
    if (!state) throw new Error("clientSuite: read before its before() ran");
    return state;
  };
  return {
    get server() {
      return get().server;
    },
    get token() {
      return get().token;
    },
    get work() {
      return get().work;
    },
    env: (extra) => get().server.env(get().token, extra),
  };
}

/**
 * An HTTP proxy in front of the API at `target` (a server's url): each request goes first to
 * `intercept`, which returns true when it has taken the request (answered it, or holds it on
 * purpose); every other is forwarded as it came, and the API's answer passed back as it is.
 */
export async function apiProxy(
  target: string,
  intercept: (req: http.IncomingMessage, res: http.ServerResponse) => boolean,
): Promise<{ url: string; close(): void }> {
  const backend = new URL(target);
  const proxy = http.createServer((req, res) => {
    if (intercept(req, res)) return;
    const up = http.request(
      { host: backend.hostname, port: backend.port, method: req.method, path: req.url, headers: req.headers },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(proxy.address() as net.AddressInfo).port}`,
    close: () => {
      proxy.closeAllConnections();
      proxy.close();
    },
  };
}

/**
 * A TCP relay on a free port of 127.0.0.1 to `target`'s host and port (a database's or a store's), for
 * a test that passes the bytes on itself: `connection` wires each connection's two sockets. Errors on
 * either are ignored, and when one closes the other is destroyed; close() destroys every socket open.
 */
export async function tcpRelay(
  target: URL,
  connection: (client: net.Socket, upstream: net.Socket) => void,
): Promise<{ port: number; close(): void }> {
  const sockets = new Set<net.Socket>();
  const relay = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => {});
      s.on("close", () => sockets.delete(s));
    }
    connection(client, upstream);
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  await new Promise<void>((resolve) => relay.listen(0, "127.0.0.1", resolve));
  return {
    port: (relay.address() as net.AddressInfo).port,
    close: () => {
      for (const s of sockets) s.destroy();
      relay.close();
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

/** A client's error line: what it prints on stdout before it exits non-zero. */
export type ErrorLine = Line & { code: string; message: string; exitCode: number };

/** The first error line a client printed, if any. */
export const errorOf = (stdout: string) => ofKind(jsonLines(stdout), "error")[0] as ErrorLine | undefined;

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
