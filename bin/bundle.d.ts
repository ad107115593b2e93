// Types of bundle.js, for the TypeScript that imports it (tests, benchmarks).
export type FileStamp = [file: string, size: number, mtimeMs: number];
export interface Manifest {
  version: number;
  root: string;
  builtAt: string;
  entry: string;
  outputs: string[];
  files: FileStamp[];
}
export declare const ROOT: string;
export declare const DEFAULT_BUNDLE_DIR: string;
export declare const MANIFEST: string;
export declare const MANIFEST_VERSION: number;
export declare const ABSENT: number;
export declare function bundleDir(env?: NodeJS.ProcessEnv): string;
export declare function insideCheckout(dir: string, root?: string): boolean;
export declare function stamp(root: string, file: string): FileStamp | null;
export declare function readManifest(dir: string): Manifest | string;
export declare function currentBundle(dir: string, root?: string): Manifest | string;
export declare function staleReason(dir: string, root?: string): string | null;
export declare function bundleEntry(env?: NodeJS.ProcessEnv): string | undefined;
