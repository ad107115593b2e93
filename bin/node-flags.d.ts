// Types of node-flags.js, for the TypeScript that imports it (bench/big-task.ts, tests).
export declare const SERVER_NODE_FLAGS: string[];
export declare function serverNodeFlags(env?: NodeJS.ProcessEnv): string[];
export declare function execWithServerFlags(argv?: string[], env?: NodeJS.ProcessEnv): void;
