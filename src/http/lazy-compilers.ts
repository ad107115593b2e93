// Fastify's own schema compilers (Ajv for requests, fast-json-stringify for responses), each route's
// compiled on the first request that needs it instead of at start-up. Compiling every route's
// schemas up front was ~100 ms of `assay api`'s ~650 ms to ready (bench/startup.ts), most of it for
// routes an instance may never serve (/docs, the dashboard's, the rare error bodies); the first
// request of a route pays a few milliseconds instead. The compilers and their options are Fastify's
// defaults, with the same validation (coercion of a root value included) and serialization.
//
// One behaviour follows from giving Fastify a compiler factory: it counts the validator compiler as
// custom and passes header schemas as written instead of lower-casing their keys. Ours are written in
// lower case (HTTP/1 and HTTP/2 header names reach Fastify lower-cased); tasks-api.test.ts sends a
// mixed-case Idempotency-Key over real HTTP, and test/unit/lazy-compilers.test.ts compares these
// compilers' answers with the defaults' (coerced root values, shared schemas by $ref).

import ValidatorSelector from "@fastify/ajv-compiler";
import { SerializerSelector } from "@fastify/fast-json-stringify-compiler";
import type { FastifyServerOptions } from "fastify";

type Validate = ((data: unknown, context?: unknown) => unknown) & { errors?: unknown; schemaEnv?: unknown };

/**
 * A validator that compiles on first use. Fastify reads `errors` after a `false`, and reads
 * `schemaEnv` before the call to decide whether to pass the parent (so that Ajv can write a coerced
 * root value back into the request): both are forwarded, and reading `schemaEnv` compiles.
 */
function lazyValidator(compile: () => Validate): Validate {
  let validate: Validate | undefined;
  const compiled = () => {
    validate ??= compile();
    return validate;
  };
  const lazy: Validate = (data, context) => {
    const v = compiled();
    const result = context === undefined ? v(data) : v(data, context);
    lazy.errors = v.errors;
    return result;
  };
  Object.defineProperty(lazy, "schemaEnv", { get: () => compiled().schemaEnv });
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
 * Fastify's default factories, made once per server as Fastify does (the validator's keeps one Ajv
 * instance per distinct set of shared schemas and options), with each compiled function made lazy.
 */
export function lazyCompilers(o: { coerceBodies?: boolean } = {}): CompilersFactory {
  const validatorFactory = ValidatorSelector();
  const serializerFactory = SerializerSelector();
  type Options = Parameters<typeof validatorFactory>[1];
  return {
    buildValidator: (externalSchemas, options) => {
      // The Ajv instance too is made on first use: making it compiles JSON Schema's meta-schema to
      // check the shared schemas against (~50 ms of start-up). A shared schema Ajv refuses then fails
      // the requests that validate (500) instead of the start — each with the same error, remembered,
      // not by making Ajv again. Our schemas are code, and every route's tests would fail first.
      const ajvFor = (opts: Options) => {
        let made: { compile: ReturnType<typeof validatorFactory> } | { error: unknown } | undefined;
        return () => {
          if (!made) {
            try {
              made = { compile: validatorFactory(externalSchemas, opts) };
            } catch (error) {
              made = { error };
            }
          }
          if ("error" in made) throw made.error;
          return made.compile;
        };
      };
      const forParts = ajvFor(options);
      // JSON bodies carry their types: a value of the wrong one is refused, not coerced (Ajv's
      // coercion turns null into 0 and "7" into 7). Querystrings, params and headers are text, and
      // are coerced as configured.
      const forBodies =
        o.coerceBodies === false
          ? ajvFor({
              ...options,
              customOptions: { ...options?.customOptions, coerceTypes: false },
            } as Options)
          : forParts;
      return ((route) =>
        lazyValidator(
          () => (route.httpPart === "body" ? forBodies : forParts)()(route) as Validate,
        )) as AjvCompile;
    },
    buildSerializer: (externalSchemas, options) => {
      const compile = serializerFactory(externalSchemas, options);
      return (route) => lazySerializer(() => compile(route));
    },
  };
}
