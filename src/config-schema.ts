// The few JSON Schema shapes the configuration uses (integer, number, string, a choice of strings),
// built and checked here instead of with TypeBox. TypeBox validates the HTTP API; loading it costs
// ~0.25 s and ~12 MiB (about 700 modules), which a worker, whose only schema is its configuration,
// paid on every start (bench/startup.ts). The builders mirror TypeBox's names and produce the same
// JSON Schema, and the messages follow its wording, so config.ts reads as before.

export interface IntegerSchema {
  type: "integer";
  minimum?: number;
  maximum?: number;
  default?: number;
}

export interface NumberSchema {
  type: "number";
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  default?: number;
}

export interface StringSchema {
  type: "string";
  minLength?: number;
  maxLength?: number;
  pattern?: string;
  default?: string;
}

export interface LiteralSchema<L extends string = string> {
  const: L;
}

export interface UnionSchema<L extends string = string> {
  anyOf: LiteralSchema<L>[];
  default?: L;
}

export type Schema = IntegerSchema | NumberSchema | StringSchema | UnionSchema;

/** The TypeScript type of a value that passes `schema`. */
export type Static<S> =
  S extends UnionSchema<infer L>
    ? L
    : S extends IntegerSchema | NumberSchema
      ? number
      : S extends StringSchema
        ? string
        : never;

export const Type = {
  Integer: (options: Omit<IntegerSchema, "type"> = {}): IntegerSchema => ({ type: "integer", ...options }),
  Number: (options: Omit<NumberSchema, "type"> = {}): NumberSchema => ({ type: "number", ...options }),
  String: (options: Omit<StringSchema, "type"> = {}): StringSchema => ({ type: "string", ...options }),
  Literal: <L extends string>(value: L): LiteralSchema<L> => ({ const: value }),
  Union: <L extends string>(
    members: LiteralSchema<L>[],
    options: { default?: NoInfer<L> } = {},
  ): UnionSchema<L> => ({
    anyOf: members,
    ...options,
  }),
};

/** Why `value` does not match `schema` (the first reason), or undefined when it does. */
export function schemaError(schema: Schema, value: unknown): string | undefined {
  if ("anyOf" in schema) {
    return schema.anyOf.some((m) => m.const === value)
      ? undefined
      : `must be one of ${schema.anyOf.map((m) => m.const).join(", ")}`;
  }
  if (schema.type === "string") {
    if (typeof value !== "string") return "must be string";
    if (schema.minLength !== undefined && [...value].length < schema.minLength)
      return `must not have fewer than ${schema.minLength} characters`;
    if (schema.maxLength !== undefined && [...value].length > schema.maxLength)
      return `must not have more than ${schema.maxLength} characters`;
    if (schema.pattern !== undefined && !new RegExp(schema.pattern, "u").test(value))
      return `must match pattern "${schema.pattern}"`;
    return undefined;
  }
  if (typeof value !== "number" || !Number.isFinite(value)) return `must be ${schema.type}`;
  if (schema.type === "integer" && !Number.isInteger(value)) return "must be integer";
  if (schema.minimum !== undefined && value < schema.minimum) return `must be >= ${schema.minimum}`;
  if (schema.maximum !== undefined && value > schema.maximum) return `must be <= ${schema.maximum}`;
  if (
    "exclusiveMinimum" in schema &&
    schema.exclusiveMinimum !== undefined &&
    value <= schema.exclusiveMinimum
  )
    return `must be > ${schema.exclusiveMinimum}`;
  return undefined;
}
