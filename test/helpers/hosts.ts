// Separate "hosts" on one machine, for tests of an installation spread over machines (root only):
// each host is an OS user of its own with a 0700 data directory (no process can read another host's
// files, even by an absolute path) and a network namespace of its own, joined to this one by a veth
// pair. A host reaches PostgreSQL and the S3 server only through proxies this process listens with on
// its side of that host's veth pair — never any other address.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { ROOT } from "./cli.ts";

export interface Host {
  name: string;
  user: string;
  uid: number;
  gid: number;
  /** The host's own data directory (mode 0700, owned by its user). */
  dataDir: string;
  /** Its network namespace. */
  ns: string;
  /** Its address, inside its namespace. */
  address: string;
  /** This side of its veth pair: the only address it can reach here. */
  gateway: string;
}

export interface Hosts {
  /** A copy of the code every host can read (hard links: no bytes copied). */
  readonly code: string;
  readonly hosts: Record<string, Host>;
  /** Listens on `host.gateway` and forwards to 127.0.0.1:`port`; returns the port it listens on. */
  forward(host: Host, port: number): Promise<number>;
  /** `node <code>/bin/assay.js ...args` as the host's user, in its namespace. */
  assay(host: Host, args: string[], env: Record<string, string>): ChildProcess;
  /** `node -e <script>` as the host's user, in its namespace; resolves with its exit code and output. */
  node(host: Host, script: string): Promise<{ code: number | null; output: string }>;
  close(): Promise<void>;
}

const sh = (cmd: string, args: string[]) =>
  execFileSync(cmd, args, { stdio: ["ignore", "pipe", "pipe"] }).toString();

/** The environment every host process starts from: nothing of ours but what is listed. */
export function hostEnv(host: Host, extra: Record<string, string>): Record<string, string> {
  return {
    PATH: "/usr/local/bin:/usr/bin:/bin",
    HOME: host.dataDir,
    LANG: "C.UTF-8",
    ...Object.fromEntries(
      [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
        "AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED",
      ]
        .filter((k) => process.env[k] !== undefined)
        .map((k) => [k, process.env[k] as string]),
    ),
    ...extra,
  };
}

export async function createHosts(names: string[]): Promise<Hosts> {
  if (process.getuid?.() !== 0) throw new Error("separate hosts need root (users, namespaces, veth)");
  const tag = randomBytes(2).toString("hex");
  const net16 = 200 + (parseInt(tag, 16) % 50); // 10.<200..249>.<tag>.0/24, /30 per host
  const base = fs.mkdtempSync(path.join(os.tmpdir(), "assay-hosts-"));
  fs.chmodSync(base, 0o755);
  const servers: net.Server[] = [];
  const sockets = new Set<net.Socket>();
  const made: { ns: string[]; links: string[] } = { ns: [], links: [] };

  // The code, readable by every host: hard links (one filesystem), directories made anew with 0755 —
  // the checkout itself may sit in a directory only root can enter.
  const code = path.join(base, "code");
  fs.mkdirSync(code, { mode: 0o755 });
  for (const entry of ["bin", "src", "web", "migrations", "node_modules", "package.json", "tsconfig.json"]) {
    sh("cp", ["-rl", path.join(ROOT, entry), code]);
  }
  sh("chmod", ["-R", "a+rX", code]);
  // The runtime too: Node 24 lives in node_modules (the `node` package), under the checkout that hosts
  // may not be able to enter; they run the hard-linked copy. A Node from outside the checkout is used as is.
  const realNode = fs.realpathSync(process.execPath);
  const fromRoot = path.relative(fs.realpathSync(ROOT), realNode);
  const nodeBin =
    fromRoot.startsWith("..") || path.isAbsolute(fromRoot) ? realNode : path.join(code, fromRoot);

  const hosts: Record<string, Host> = {};
  try {
    names.forEach((name, i) => {
      const user = `assay-host-${name}`;
      try {
        sh("id", ["-u", user]);
      } catch {
        sh("useradd", ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user]);
      }
      const uid = Number(sh("id", ["-u", user]).trim());
      const gid = Number(sh("id", ["-g", user]).trim());
      const dataDir = path.join(base, name);
      fs.mkdirSync(dataDir, { mode: 0o700 });
      fs.chownSync(dataDir, uid, gid);
      fs.chmodSync(dataDir, 0o700);
      const ns = `assay-${tag}-${name}`;
      const link = `a${tag}${i}`;
      const gateway = `10.${net16}.${parseInt(tag.slice(2), 16)}.${4 * i + 1}`;
      const address = `10.${net16}.${parseInt(tag.slice(2), 16)}.${4 * i + 2}`;
      sh("ip", ["netns", "add", ns]);
      made.ns.push(ns);
      sh("ip", ["link", "add", `${link}h`, "type", "veth", "peer", "name", `${link}n`]);
      made.links.push(`${link}h`);
      sh("ip", ["link", "set", `${link}n`, "netns", ns]);
      sh("ip", ["addr", "add", `${gateway}/30`, "dev", `${link}h`]);
      sh("ip", ["link", "set", `${link}h`, "up"]);
      sh("ip", ["netns", "exec", ns, "ip", "addr", "add", `${address}/30`, "dev", `${link}n`]);
      sh("ip", ["netns", "exec", ns, "ip", "link", "set", `${link}n`, "up"]);
      sh("ip", ["netns", "exec", ns, "ip", "link", "set", "lo", "up"]);
      hosts[name] = { name, user, uid, gid, dataDir, ns, address, gateway };
    });
  } catch (err) {
    for (const l of made.links) sh("ip", ["link", "del", l]);
    for (const n of made.ns) sh("ip", ["netns", "del", n]);
    throw err;
  }

  const asHost = (host: Host, argv: string[]) => [
    "netns",
    "exec",
    host.ns,
    "setpriv",
    `--reuid=${host.uid}`,
    `--regid=${host.gid}`,
    "--clear-groups",
    ...argv,
  ];

  return {
    code,
    hosts,
    forward: (host, port) =>
      new Promise((resolve, reject) => {
        const server = net.createServer((client) => {
          const upstream = net.connect(port, "127.0.0.1");
          for (const s of [client, upstream]) {
            sockets.add(s);
            s.on("close", () => sockets.delete(s));
            s.on("error", () => {
              client.destroy();
              upstream.destroy();
            });
          }
          client.pipe(upstream).pipe(client);
        });
        servers.push(server);
        server.once("error", reject);
        server.listen(0, host.gateway, () => resolve((server.address() as net.AddressInfo).port));
      }),
    assay: (host, args, env) =>
      spawn("ip", asHost(host, [nodeBin, path.join(code, "bin", "assay.js"), ...args]), {
        cwd: code,
        env: hostEnv(host, env),
        stdio: ["ignore", "pipe", "pipe"],
      }),
    node: (host, script) =>
      new Promise((resolve) => {
        const child = spawn("ip", asHost(host, [nodeBin, "-e", script]), {
          cwd: "/",
          env: hostEnv(host, {}),
          stdio: ["ignore", "pipe", "pipe"],
        });
        let output = "";
        child.stdout?.on("data", (c: Buffer) => (output += c.toString()));
        child.stderr?.on("data", (c: Buffer) => (output += c.toString()));
        child.on("close", (code) => resolve({ code, output }));
      }),
    close: async () => {
      for (const s of sockets) s.destroy();
      await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
      for (const l of made.links) {
        try {
          sh("ip", ["link", "del", l]);
        } catch {
          // gone with its namespace
        }
      }
      for (const n of made.ns) sh("ip", ["netns", "del", n]);
      fs.rmSync(base, { recursive: true, force: true });
    },
  };
}
