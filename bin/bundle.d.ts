// Types of bundle.js, for the TypeScript that imports it (tests).
export declare const ROOT: string;
export declare const DEFAULT_BUNDLE_DIR: string;
export declare const MANIFEST: string;
export declare const ENTRY: string;
export declare function bundleDir(env?: NodeJS.ProcessEnv): string;
export declare function fingerprint(root: string, files: string[]): [string, number, number][] | null;
export declare function manifestFor(
  root: string,
  inputs: string[],
): { version: number; root: string; builtAt: string; files: [string, number, number][] };
export declare function staleReason(dir: string, root?: string): string | null;
export declare function bundleEntry(env?: NodeJS.ProcessEnv): string | undefined;
