// Types of build.js, for the TypeScript that imports it (tests).
export declare function buildBundle(dir: string): Promise<{ files: number; inputs: number; entry: string }>;
