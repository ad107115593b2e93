// The types of web/unseen.js, for src/client/output.ts (the CLI shows text by the dashboard's rule).
export declare const UNSEEN: RegExp;
export declare function showUnseen(s: string): string;
