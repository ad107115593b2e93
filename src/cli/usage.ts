import { type ParseArgsConfig, parseArgs } from "node:util";
import type { Config } from "../config.ts";

/** A mistake in the command line: printed without a stack, exit code 2. */
export class UsageError extends Error {
  override name = "UsageError";
}

/** parseArgs with errors turned into UsageError. */
export function parse<T extends ParseArgsConfig>(config: T) {
  try {
    return parseArgs({ ...config, strict: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

/** The config, which main() loads for every command run without --help. */
export function need(config: Config | undefined): Config {
  if (!config) throw new Error("configuration was not loaded");
  return config;
}
