// Buckets for tests on the S3-compatible server that test/run.ts starts (s3rver on 127.0.0.1): each
// test file makes its own, and removes it with everything in it.
import { randomBytes } from "node:crypto";
import { CreateBucketCommand, DeleteBucketCommand, DeleteObjectsCommand, S3Client } from "@aws-sdk/client-s3";
import { S3Store } from "../../src/storage/s3.ts";

export interface TestBucket {
  name: string;
  endpoint: string;
  /** The configuration a process needs to use this bucket (credentials come from the environment). */
  env: Record<string, string>;
  store(prefix?: string): S3Store;
  /** Deletes every object (whatever its key: a test may have put odd ones), then the bucket. */
  drop(): Promise<void>;
}

export function s3Endpoint(): string {
  const endpoint = process.env.ASSAY_TEST_S3_ENDPOINT;
  if (!endpoint) throw new Error("ASSAY_TEST_S3_ENDPOINT is not set: run tests through `make test`");
  return endpoint;
}

export async function createTestBucket(): Promise<TestBucket> {
  const endpoint = s3Endpoint();
  const name = `assay-t-${randomBytes(6).toString("hex")}`;
  const client = new S3Client({ endpoint, forcePathStyle: true });
  await client.send(new CreateBucketCommand({ Bucket: name }));
  const stores: S3Store[] = [];
  const store = (prefix = "") => {
    const s = new S3Store({ bucket: name, prefix, endpoint, forcePathStyle: true });
    stores.push(s);
    return s;
  };
  return {
    name,
    endpoint,
    env: {
      ASSAY_STORAGE: "s3",
      ASSAY_S3_BUCKET: name,
      ASSAY_S3_ENDPOINT: endpoint,
      ASSAY_S3_FORCE_PATH_STYLE: "true",
    },
    store,
    drop: async () => {
      const all = new S3Store({ bucket: name, endpoint, forcePathStyle: true });
      for (;;) {
        const page = await all.list("", { limit: 1000 });
        if (page.length === 0) break;
        const res = await client.send(
          new DeleteObjectsCommand({
            Bucket: name,
            Delete: { Objects: page.map((o) => ({ Key: o.key })), Quiet: true },
          }),
        );
        if (res.Errors?.length) throw new Error(`could not empty ${name}: ${res.Errors[0]?.Code}`);
      }
      await client.send(new DeleteBucketCommand({ Bucket: name }));
      for (const s of [...stores, all]) s.client.destroy();
      client.destroy();
    },
  };
}
