// The analysis types a client can choose from, with their parameter schemas and live availability.
import type { FastifyPluginAsyncTypebox } from "@fastify/type-provider-typebox";
import { Type } from "typebox";
import { analysisTypeList } from "../../tasks/analysis-types.ts";
import { AnalysisTypeBody } from "../api-types.ts";
import { Envelope, errorResponses, ok } from "../schemas.ts";

export const analysisTypeRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    "/analysis-types",
    {
      schema: {
        summary: "The analysis types: parameter schemas and whether a live worker runs them",
        tags: ["tasks"],
        security: [{ bearer: [] }],
        response: { 200: Envelope(Type.Object({ items: Type.Array(AnalysisTypeBody) })), ...errorResponses },
      },
    },
    async () => {
      const { config, database } = app.services;
      return ok({ items: await analysisTypeList(database.sql, config.leaseTtlMs) });
    },
  );
};
