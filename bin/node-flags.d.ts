// Types of node-flags.js, for the TypeScript that imports it (bench/big-task.ts, tests).
export declare const WORKER_NODE_FLAGS: string[];
export declare const API_NODE_FLAGS: string[];
export declare function serverNodeFlags(env: NodeJS.ProcessEnv, command: "api" | "worker" | "all"): string[];
export declare function execWithServerFlags(argv?: string[], env?: NodeJS.ProcessEnv): void;
