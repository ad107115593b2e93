// Types of early-signals.js, for the TypeScript that imports it (tests).
export declare function holdEarlySignals(): void;
export declare function releaseEarlySignals(): NodeJS.Signals | undefined;
