import { defineConfig } from "drizzle-kit";

// Only `generate` (make db/generate) uses this file; it needs no database connection.
export default defineConfig({
  dialect: "postgresql",
  schema: "./src/db/schema.ts",
  out: "./migrations",
});
