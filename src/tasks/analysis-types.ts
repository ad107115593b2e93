// What a client may choose from (GET /api/analysis-types): every whitelisted type with its parameter
// schema, and whether a live worker runs it now — judged like the reaper judges liveness — or why not.
import { ANALYSIS_TYPES, type AnalysisType, DESCRIPTIONS, PARAMETER_SCHEMAS } from "../analyses/types.ts";
import type { Sql } from "../db/client.ts";
import { type TypeAvailability, workerStaleMs, workerTypeAvailability } from "../queue/sql.ts";

export interface AnalysisTypeView {
  name: AnalysisType;
  description: string;
  /** The JSON schema POST /api/analysis-tasks validates `parameters` with. */
  parameters: (typeof PARAMETER_SCHEMAS)[AnalysisType];
  available: boolean;
  /** Why not, when unavailable; null when available. */
  reason: string | null;
  /** Live workers offering the type. */
  workers: number;
}

export const NO_WORKER_RUNNING = "no worker is running";

/** The reason an unavailable type gives: what live workers said, with how many said it. */
export function unavailableReason(a: TypeAvailability): string | null {
  if (a.workers > 0) return null;
  if (a.liveWorkers === 0) return NO_WORKER_RUNNING;
  if (a.reasons.length === 0) return "no live worker offers this analysis type";
  return a.reasons
    .map((r) => `${r.reason} (${r.workers} ${r.workers === 1 ? "worker" : "workers"})`)
    .join("; ");
}

export async function analysisTypeList(sql: Sql, leaseTtlMs: number): Promise<AnalysisTypeView[]> {
  const rows = await workerTypeAvailability(sql, ANALYSIS_TYPES, workerStaleMs(leaseTtlMs));
  return ANALYSIS_TYPES.map((name, i) => {
    const a = rows[i] ?? { type: name, workers: 0, liveWorkers: 0, reasons: [] };
    return {
      name,
      description: DESCRIPTIONS[name],
      parameters: PARAMETER_SCHEMAS[name],
      available: a.workers > 0,
      reason: unavailableReason(a),
      workers: a.workers,
    };
  });
}
