// The configured object store (ASSAY_STORAGE). The S3 backend and its SDK are loaded only when chosen.
import type { Config } from "../config.ts";
import { LocalStore } from "./local.ts";
import type { ObjectStore } from "./store.ts";

export async function openStore(config: Config): Promise<ObjectStore> {
  if (config.storage === "local") return new LocalStore(config.dataDir);
  const { S3Store } = await import("./s3.ts");
  return new S3Store({
    bucket: config.s3Bucket as string,
    prefix: config.s3Prefix,
    ...(config.s3Endpoint ? { endpoint: config.s3Endpoint } : {}),
    ...(config.s3Region ? { region: config.s3Region } : {}),
    forcePathStyle: config.s3ForcePathStyle === "true",
  });
}
