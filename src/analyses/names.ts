// The whitelisted analysis types by name, without their parameter schemas (./types.ts): the
// configuration and the worker need the names only, and must not load TypeBox for them.

export const ANALYSIS_TYPES = ["summary", "python-stats", "r-report"] as const;
export type AnalysisType = (typeof ANALYSIS_TYPES)[number];

export const isAnalysisType = (s: string): s is AnalysisType =>
  (ANALYSIS_TYPES as readonly string[]).includes(s);

/** `python-stats` → `PYTHON_STATS`: the infix of its per-type settings (`ASSAY_PYTHON_STATS_CONCURRENCY`). */
export const typeEnvInfix = (type: string) => type.toUpperCase().replace(/-/g, "_");
