// The integer query fields a route may declare (src/http/query-check.ts): each is checked for decimal
// digits before the schema runs, and a value of over 15 digits is replaced by 2^53 - 1 for the schema to
// refuse by its maximum. A declaration that check could not serve rightly is refused at start-up.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { FastifyRequest } from "fastify";
import { Type } from "typebox";
import { checkDecimalQuery, integerQueryFields } from "../../src/http/query-check.ts";

test("a plain integer field with a maximum is checked", () => {
  const schema = Type.Object({
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100 })),
    status: Type.Optional(Type.String()),
  });
  assert.deepEqual(integerQueryFields("/x", schema), ["limit"]);
  assert.deepEqual(integerQueryFields("/x", Type.Object({})), []);
});

test("an integer field without a maximum, or with one of 2^53 - 1 or more, is refused", () => {
  for (const field of [Type.Integer(), Type.Integer({ maximum: Number.MAX_SAFE_INTEGER })])
    assert.throws(
      () => integerQueryFields("/api/things", Type.Object({ after: Type.Optional(field) })),
      /\/api\/things: the integer query field after must declare a maximum below 2\^53 - 1/,
    );
});

test("an integer inside a union is refused (Ajv would coerce it unchecked)", () => {
  const schema = Type.Object({ n: Type.Union([Type.Integer({ maximum: 9 }), Type.Literal("all")]) });
  assert.throws(() => integerQueryFields("/api/u", schema), /must be a plain \{ type: "integer" \} property/);
});

test("a value past 2^53 - 1 is replaced by it for the schema to refuse; an exact one is left as it is", () => {
  const query: Record<string, unknown> = {};
  const request = { routeOptions: { config: { integerQuery: ["n"] } }, query } as unknown as FastifyRequest;
  const seen = (value: string) => {
    query.n = value;
    checkDecimalQuery(request);
    return query.n;
  };
  // Exact: the schema's maximum decides (a field may allow up to 2^53 - 2).
  assert.equal(seen("9007199254740990"), "9007199254740990");
  assert.equal(seen("1000000000000000"), "1000000000000000");
  assert.equal(seen("0009007199254740991"), "0009007199254740991");
  assert.equal(seen("7"), "7");
  // Past it: 2^53 - 1, above every field's maximum.
  assert.equal(seen("9007199254740992"), "9007199254740991");
  assert.equal(seen("1".repeat(17)), "9007199254740991");
  assert.equal(seen("9".repeat(400)), "9007199254740991");
  assert.throws(() => seen("1e3"), /querystring\/n must be an integer in decimal digits/);
});
