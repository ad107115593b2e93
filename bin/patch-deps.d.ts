/** Types of bin/patch-deps.js (plain JavaScript: it runs at install, before anything is built). */
export interface Edit {
  find: string;
  replace: string;
}
export interface Patch {
  name: string;
  version: string;
  files: Record<string, Edit[]>;
}
export const POSTGRES_PATCH: string;
export const PATCHES: Patch[];
export function patchDeps(options?: { root?: string; check?: boolean }): string[];
