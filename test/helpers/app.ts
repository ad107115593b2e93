// An app on its own test database and data directory, driven with `inject`.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import type { FastifyInstance } from "fastify";
import { type Role, tokenCreate } from "../../src/auth/tokens.ts";
import { type Config, loadConfig } from "../../src/config.ts";
import { expectedMigrationCount } from "../../src/db/migrate.ts";
import { buildServer } from "../../src/http/server.ts";
import { createLogger } from "../../src/log.ts";
import { openStore } from "../../src/storage/open.ts";
import type { ObjectStore } from "../../src/storage/store.ts";
import { createTestDatabase, type TestDatabase } from "./db.ts";

export interface TestApp {
  app: FastifyInstance;
  db: TestDatabase;
  config: Config;
  storage: ObjectStore;
  /** Every log line the app wrote, as parsed JSON. */
  logs: Record<string, unknown>[];
  /** A fresh token for `name` (created with `role` if new). */
  token(name: string, role?: Role): Promise<string>;
  close(): Promise<void>;
}

export async function startTestApp(env: Record<string, string> = {}): Promise<TestApp> {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-app-"));
  const db = await createTestDatabase();
  const config = loadConfig({ ASSAY_DATA_DIR: dataDir, DATABASE_URL: db.url, ...env });
  const logs: Record<string, unknown>[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split("\n")) if (line) logs.push(JSON.parse(line));
      done();
    },
  });
  const logger = createLogger({ level: "info", destination });
  const storage = await openStore(config);
  const app = await buildServer(
    { config, database: db, storage, expectedMigrations: expectedMigrationCount() },
    logger,
  );
  return {
    app,
    db,
    config,
    storage,
    logs,
    token: async (name, role) => (await tokenCreate(db.sql, name, role)).token,
    close: async () => {
      await app.close();
      await db.drop();
      fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** A multipart/form-data body with one part. */
export function multipart(
  field: string,
  content: Buffer | string,
  filename = "data.csv",
  contentType = "text/csv",
): { payload: Buffer; headers: Record<string, string> } {
  const boundary = `----assay${Math.random().toString(16).slice(2)}`;
  const head = Buffer.from(
    `--${boundary}\r\nContent-Disposition: form-data; name="${field}"; filename="${filename}"\r\n` +
      `Content-Type: ${contentType}\r\n\r\n`,
  );
  const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
  return {
    payload: Buffer.concat([head, Buffer.isBuffer(content) ? content : Buffer.from(content), tail]),
    headers: { "content-type": `multipart/form-data; boundary=${boundary}` },
  };
}

export const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

/** Uploads `content` as `data.csv` through `app` for `token`'s user; the new file's id (a 201 asserted). */
export async function uploadedFileId(
  app: FastifyInstance,
  token: string,
  content = "a,b\n1,2\n",
): Promise<string> {
  const { payload, headers } = multipart("file", content);
  const res = await app.inject({
    method: "POST",
    url: "/api/files",
    payload,
    headers: { ...headers, ...bearer(token) },
  });
  if (res.statusCode !== 201) throw new Error(`upload: ${res.statusCode} ${res.body}`);
  return res.json().data.fileId;
}
