// Fastify's own schema compilers (Ajv for requests, fast-json-stringify for responses), each route's
// compiled on the first request that needs it instead of at start-up. Compiling every route's
// schemas up front was ~100 ms of `assay api`'s ~650 ms to ready (bench/startup.ts), most of it for
// routes an instance may never serve (/docs, the dashboard's, the rare error bodies); the first
// request of a route pays a few milliseconds instead. The compilers and their options are Fastify's
// defaults, with the same validation and serialization; one Ajv instance per server (see memoized).
//
// One behaviour follows from giving Fastify a compiler factory: it counts the validator compiler as
// custom and passes header schemas as written instead of lower-casing their keys. Ours are written in
// lower case (HTTP/1 and HTTP/2 header names reach Fastify lower-cased), and a test sends mixed-case
// headers through both routes that have header schemas.

import ValidatorSelector from "@fastify/ajv-compiler";
import { SerializerSelector } from "@fastify/fast-json-stringify-compiler";
import type { FastifyServerOptions } from "fastify";

type Validate = ((data: unknown) => unknown) & { errors?: unknown };

/** A validator that compiles on its first call; Fastify reads `errors` after a `false`. */
function lazyValidator(compile: () => Validate): Validate {
  let validate: Validate | undefined;
  const lazy: Validate = (data) => {
    validate ??= compile();
    const result = validate(data);
    lazy.errors = validate.errors;
    return result;
  };
  return lazy;
}

function lazySerializer(compile: () => (doc: unknown) => string): (doc: unknown) => string {
  let serialize: ((doc: unknown) => string) | undefined;
  return (doc) => {
    serialize ??= compile();
    return serialize(doc);
  };
}

type CompilersFactory = NonNullable<
  NonNullable<FastifyServerOptions["schemaController"]>["compilersFactory"]
>;

type AjvCompile = ReturnType<ReturnType<typeof ValidatorSelector>>;

/**
 * One compiler per distinct set of shared schemas and options. Fastify builds a compiler (for Ajv a
 * new instance, ~10–40 ms with the shared schemas added) in every plugin context that has not
 * inherited one yet: `assay api` built five identical Ajv instances at start-up.
 */
function memoized<C>(build: (externalSchemas: unknown, options: unknown) => C) {
  const built = new Map<string, C>();
  return (externalSchemas: unknown, options: unknown): C => {
    const key = JSON.stringify([externalSchemas, options ?? null]);
    let compiler = built.get(key);
    if (compiler === undefined) {
      compiler = build(externalSchemas, options);
      built.set(key, compiler);
    }
    return compiler;
  };
}

export function lazyCompilers(): CompilersFactory {
  const validator = memoized((externalSchemas, options) =>
    ValidatorSelector()(
      externalSchemas as Parameters<ReturnType<typeof ValidatorSelector>>[0],
      options as Parameters<ReturnType<typeof ValidatorSelector>>[1],
    ),
  );
  const serializer = memoized((externalSchemas, options) =>
    SerializerSelector()(externalSchemas, options as Parameters<ReturnType<typeof SerializerSelector>>[1]),
  );
  return {
    buildValidator: (externalSchemas, options) => {
      const compile = validator(externalSchemas, options);
      // Fastify calls the function and reads `errors`; Ajv's other fields are for Ajv's own callers.
      return ((route) => lazyValidator(() => compile(route) as Validate)) as AjvCompile;
    },
    buildSerializer: (externalSchemas, options) => {
      const compile = serializer(externalSchemas, options);
      return (route) => lazySerializer(() => compile(route));
    },
  };
}
