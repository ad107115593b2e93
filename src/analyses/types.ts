// The whitelisted analysis types and their parameter schemas. Nothing a user sends chooses a
// program: the type picks an entry here (commands arrive with the process runner).
import { type Static, Type } from "typebox";
import type { AnalysisType } from "./names.ts";

export { ANALYSIS_TYPES, type AnalysisType, isAnalysisType, typeEnvInfix } from "./names.ts";

const STATS_METHODS = ["mean", "median", "stdev", "min", "max"] as const;

export const PARAMETER_SCHEMAS = {
  summary: Type.Object({}, { additionalProperties: false }),
  "python-stats": Type.Object(
    {
      method: Type.Union(
        STATS_METHODS.map((m) => Type.Literal(m)),
        { description: "Statistic computed for each numeric column" },
      ),
      columns: Type.Optional(
        Type.Array(Type.String({ minLength: 1, maxLength: 200 }), {
          minItems: 1,
          maxItems: 100,
          description:
            "Columns to use, named as in the file's header (spaces around a name and its Unicode form do not count; case does) (default: every numeric column). A file without one of them fails ANALYSIS_INPUT_INVALID, one where it is not numeric ANALYSIS_DATA_INVALID",
        }),
      ),
    },
    { additionalProperties: false },
  ),
  "r-report": Type.Object(
    { title: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: "Report title" })) },
    { additionalProperties: false },
  ),
} as const;

/** One line per type, for clients that offer a choice (GET /api/analysis-types). */
export const DESCRIPTIONS: Record<AnalysisType, string> = {
  summary: "Rows, columns, and per column its type, non-null count and numeric min/max/mean (summary.json).",
  "python-stats":
    "One statistic (mean, median, stdev, min or max) of every numeric column, or of the chosen ones (stats.json, stats.csv).",
  "r-report": "An HTML report with a statistics table and a histogram of each numeric column (report.html).",
};

export type AnalysisParameters = {
  [K in AnalysisType]: Static<(typeof PARAMETER_SCHEMAS)[K]>;
};
