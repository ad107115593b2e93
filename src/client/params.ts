// `--param key=value` pairs → the `parameters` object of a task, typed by the analysis type's JSON
// schema (from GET /api/analysis-types) and checked against it before anything is uploaded.
import { ClientUsageError } from "./exit.ts";

/** The parts of a JSON schema the client reads. */
export interface JsonSchema {
  type?: string;
  properties?: Record<string, JsonSchema>;
  required?: string[];
  items?: JsonSchema;
  anyOf?: JsonSchema[];
  enum?: unknown[];
  const?: unknown;
  description?: string;
  minLength?: number;
  maxLength?: number;
  minItems?: number;
  maxItems?: number;
}

/** The allowed values of an enumeration (`anyOf` of consts, or `enum`), or undefined. */
export function choicesOf(schema: JsonSchema): unknown[] | undefined {
  if (schema.enum) return schema.enum;
  if (schema.anyOf?.every((s) => "const" in s)) return schema.anyOf.map((s) => s.const);
  return undefined;
}

const isStringSchema = (s: JsonSchema) =>
  s.type === "string" || (choicesOf(s)?.every((v) => typeof v === "string") ?? false);

/** One value, typed by its schema: strings stay as given, numbers and booleans are parsed, the rest is JSON. */
function coerce(key: string, raw: string, schema: JsonSchema): unknown {
  if (isStringSchema(schema)) return raw;
  if (schema.type === "integer" || schema.type === "number") {
    const n = Number(raw);
    if (raw.trim() === "" || !Number.isFinite(n))
      throw new ClientUsageError(`--param ${key}: not a number: ${raw}`);
    return n;
  }
  if (schema.type === "boolean") {
    if (raw === "true" || raw === "false") return raw === "true";
    throw new ClientUsageError(`--param ${key}: must be true or false, not ${raw}`);
  }
  try {
    return JSON.parse(raw);
  } catch {
    throw new ClientUsageError(`--param ${key}: not valid JSON: ${raw}`);
  }
}

/**
 * The parameters object. A key whose schema is an array collects every `--param key=…` given (or takes
 * one JSON array: `columns=["a","b"]`); any other key may be given once.
 */
export function parseParams(pairs: string[], schema: JsonSchema, typeName: string): Record<string, unknown> {
  const properties = schema.properties ?? {};
  const out: Record<string, unknown> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf("=");
    if (eq <= 0) throw new ClientUsageError(`--param takes key=value, not ${JSON.stringify(pair)}`);
    const key = pair.slice(0, eq);
    const raw = pair.slice(eq + 1);
    const prop = Object.hasOwn(properties, key) ? properties[key] : undefined;
    if (!prop) throw new ClientUsageError(`${typeName} has no parameter ${key} (${knownParams(schema)})`);
    if (prop.type === "array" && !raw.startsWith("[")) {
      const list = (out[key] ?? []) as unknown[];
      list.push(coerce(key, raw, prop.items ?? {}));
      out[key] = list;
    } else {
      if (Object.hasOwn(out, key)) throw new ClientUsageError(`--param ${key} given twice`);
      out[key] = coerce(key, raw, prop);
    }
  }
  return out;
}

export function knownParams(schema: JsonSchema): string {
  const names = Object.keys(schema.properties ?? {});
  return names.length === 0 ? "it takes none" : `its parameters: ${names.join(", ")}`;
}

/** A parameter's one-line description for --help and errors: `method (required): one of mean, median…`. */
export function describeParam(name: string, prop: JsonSchema, required: boolean): string {
  const choices = choicesOf(prop);
  const kind = choices
    ? `one of ${choices.join(", ")}`
    : prop.type === "array"
      ? `a list (repeat --param ${name}=…)`
      : (prop.type ?? "JSON");
  return `${name}${required ? " (required)" : ""}: ${kind}${prop.description ? ` — ${prop.description}` : ""}`;
}

/**
 * Problems of `params` against `schema`, one readable line each (empty when valid): a missing
 * required parameter and a value outside a choice say what is allowed; anything else is the
 * validator's own message with the parameter's path.
 */
export async function paramProblems(params: Record<string, unknown>, schema: JsonSchema): Promise<string[]> {
  const { Errors } = await import("typebox/schema");
  const [valid, errors] = Errors(schema as never, params);
  if (valid) return [];
  const problems = new Map<string, string>();
  for (const name of schema.required ?? []) {
    if (!Object.hasOwn(params, name)) {
      problems.set(name, `missing parameter ${describeParam(name, schema.properties?.[name] ?? {}, true)}`);
    }
  }
  for (const e of errors) {
    const key = e.instancePath.split("/")[1];
    if (key === undefined || key === "" || problems.has(key)) continue;
    const prop = schema.properties?.[key] ?? {};
    const choices = choicesOf(prop);
    problems.set(
      key,
      choices && e.instancePath === `/${key}`
        ? `${key} must be one of ${choices.join(", ")}, not ${JSON.stringify(params[key])}`
        : `${e.instancePath.slice(1)} ${e.message}`,
    );
  }
  if (problems.size === 0) problems.set("", errors[0]?.message ?? "the parameters are invalid");
  return [...problems.values()];
}
