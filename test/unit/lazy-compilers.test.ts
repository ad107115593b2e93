// The API's lazy schema compilers (src/http/lazy-compilers.ts) against Fastify's defaults: the same
// answers for the same requests, in any order, with nothing compiled before a route's first request.
import assert from "node:assert/strict";
import { test } from "node:test";
import Fastify, { type FastifyInstance } from "fastify";
import { Type } from "typebox";
import { lazyCompilers } from "../../src/http/lazy-compilers.ts";

const ErrorBody = Type.Object({ code: Type.String(), message: Type.String() }, { $id: "ErrorBody" });

async function build(lazy: boolean): Promise<FastifyInstance> {
  const app = Fastify({
    ajv: { customOptions: { removeAdditional: false, coerceTypes: "array", useDefaults: true } },
    ...(lazy ? { schemaController: { compilersFactory: lazyCompilers() } } : {}),
  });
  app.addSchema(ErrorBody);
  // Routes in separate plugin contexts, as the app's are.
  await app.register(async (a) => {
    a.get("/inline", { schema: { response: { 400: ErrorBody } } }, async (_r, reply) =>
      reply.code(400).send({ code: "A", message: "m", extra: 1 }),
    );
    // A root value Ajv coerces (5 → [5], "7" → 7) reaches the handler coerced only when Fastify
    // passes the parent along, which it does when the validator has `schemaEnv`.
    a.post("/coerce-array", { schema: { body: Type.Array(Type.Integer()) } }, async (r) => ({
      body: r.body,
    }));
    a.post("/coerce-int", { schema: { body: Type.Integer() } }, async (r) => ({ body: r.body }));
    a.get(
      "/query",
      { schema: { querystring: Type.Object({ limit: Type.Integer({ default: 20, maximum: 50 }) }) } },
      async (r) => r.query,
    );
  });
  await app.register(async (b) => {
    b.get("/ref", { schema: { response: { 400: Type.Unsafe({ $ref: "ErrorBody#" }) } } }, async (_r, reply) =>
      reply.code(400).send({ code: "B", message: "m", extra: 1 }),
    );
  });
  await app.ready();
  return app;
}

const requests = [
  { method: "GET", url: "/inline" },
  { method: "GET", url: "/ref" },
  { method: "POST", url: "/coerce-array", payload: "5", headers: { "content-type": "application/json" } },
  { method: "POST", url: "/coerce-int", payload: '"7"', headers: { "content-type": "application/json" } },
  { method: "POST", url: "/coerce-int", payload: '"x"', headers: { "content-type": "application/json" } },
  { method: "GET", url: "/query" },
  { method: "GET", url: "/query?limit=99" },
  { method: "GET", url: "/query?limit=7" },
] as const;

test("lazy compilers answer every request as Fastify's defaults do, in either order", async () => {
  for (const order of [requests, [...requests].reverse()]) {
    const [eager, lazy] = [await build(false), await build(true)];
    try {
      for (const r of order) {
        const [a, b] = [await eager.inject(r), await lazy.inject(r)];
        assert.equal(b.statusCode, a.statusCode, `${r.method} ${r.url}: ${b.body}`);
        assert.deepEqual(JSON.parse(b.body), JSON.parse(a.body), `${r.method} ${r.url}`);
      }
    } finally {
      await Promise.all([eager.close(), lazy.close()]);
    }
  }
  // And what the defaults answer is what the routes mean (the comparison is not of two wrong answers).
  const app = await build(true);
  try {
    assert.deepEqual((await app.inject(requests[2])).json(), { body: [5] });
    assert.deepEqual((await app.inject(requests[3])).json(), { body: 7 });
    assert.deepEqual((await app.inject(requests[1])).json(), { code: "B", message: "m" });
    assert.deepEqual((await app.inject(requests[5])).json(), { limit: 20 });
    assert.equal((await app.inject(requests[6])).statusCode, 400);
  } finally {
    await app.close();
  }
});

test("with coerceBodies false, a JSON body of the wrong type is refused while querystrings are still coerced", async () => {
  const app = Fastify({
    ajv: { customOptions: { removeAdditional: false, coerceTypes: "array", useDefaults: true } },
    schemaController: { compilersFactory: lazyCompilers({ coerceBodies: false }) },
  });
  app.post(
    "/task",
    {
      schema: {
        body: Type.Object({ priority: Type.Optional(Type.Integer()), ids: Type.Array(Type.String()) }),
        querystring: Type.Object({ limit: Type.Optional(Type.Integer()) }),
      },
    },
    async (r) => ({ body: r.body, query: r.query }),
  );
  try {
    const post = (body: unknown, url = "/task") =>
      app.inject({
        method: "POST",
        url,
        payload: JSON.stringify(body),
        headers: { "content-type": "application/json" },
      });
    // What Ajv's coercion would have made of them: 0, 0, 1, 7, 3, ["5"].
    for (const bad of [
      { priority: null },
      { priority: false },
      { priority: true },
      { priority: "7" },
      { priority: [3] },
    ])
      assert.equal((await post({ ...bad, ids: ["1"] })).statusCode, 400, JSON.stringify(bad));
    assert.equal((await post({ ids: "5" })).statusCode, 400, "a string for an array");
    assert.equal((await post({ ids: [5] })).statusCode, 400, "a number for a string");
    const good = await post({ priority: 3, ids: ["5"] }, "/task?limit=7");
    assert.equal(good.statusCode, 200);
    assert.deepEqual(good.json(), { body: { priority: 3, ids: ["5"] }, query: { limit: 7 } });
  } finally {
    await app.close();
  }
});
