// The production registry: which program runs each analysis type. Executables are resolved once,
// at start-up, from trusted configuration (ASSAY_PYTHON, ASSAY_RSCRIPT) or PATH; scripts are files
// of this package. Nothing a user sends reaches this table except the type name.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { AnalysisType } from "./names.ts";

export interface Program {
  type: string;
  /** Absolute path of the interpreter. */
  executable: string;
  /** Absolute path of the script, the first argument. */
  script: string;
  /** A fixed, existing working directory. */
  cwd: string;
}

export const ANALYSES_DIR = path.dirname(fileURLToPath(import.meta.url));

const SCRIPTS: Record<AnalysisType, string> = {
  summary: "summary.mjs",
  "python-stats": "python_stats.py",
  "r-report": "r_report.R",
};

/** The absolute path of an executable file named or located by `nameOrPath`, or undefined. */
export function resolveExecutable(
  nameOrPath: string,
  searchPath = process.env.PATH ?? "",
): string | undefined {
  const isExecutable = (p: string) => {
    try {
      fs.accessSync(p, fs.constants.X_OK);
      return fs.statSync(p).isFile();
    } catch {
      return false;
    }
  };
  if (nameOrPath.includes("/")) {
    const abs = path.resolve(nameOrPath);
    return isExecutable(abs) ? abs : undefined;
  }
  for (const dir of searchPath.split(":").filter(Boolean)) {
    const candidate = path.join(dir, nameOrPath);
    if (isExecutable(candidate)) return fs.realpathSync(candidate);
  }
  return undefined;
}

export interface ProgramsFound {
  available: Program[];
  /** Types this machine cannot run, with the reason. */
  missing: { type: AnalysisType; reason: string }[];
}

export function findPrograms(
  settings: { python?: string; rscript?: string },
  searchPath?: string,
): ProgramsFound {
  const interpreters: Record<AnalysisType, { name: string; resolved: string | undefined }> = {
    summary: { name: "node", resolved: process.execPath },
    "python-stats": {
      name: settings.python ?? "python3",
      resolved: resolveExecutable(settings.python ?? "python3", searchPath),
    },
    "r-report": {
      name: settings.rscript ?? "Rscript",
      resolved: resolveExecutable(settings.rscript ?? "Rscript", searchPath),
    },
  };
  const found: ProgramsFound = { available: [], missing: [] };
  for (const [type, script] of Object.entries(SCRIPTS) as [AnalysisType, string][]) {
    const { name, resolved } = interpreters[type];
    if (!resolved) {
      found.missing.push({ type, reason: `${name} not found` });
      continue;
    }
    found.available.push({
      type,
      executable: resolved,
      script: path.join(ANALYSES_DIR, script),
      cwd: ANALYSES_DIR,
    });
  }
  return found;
}
