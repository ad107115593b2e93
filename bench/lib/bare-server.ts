// The yardstick of bench/api.ts: a bare Fastify route that returns a fixed JSON body (the one the
// real route returned), no authentication, no database. Prints its URL on stdout once listening.
//   BARE_BODY_FILE=body.json node bench/lib/bare-server.ts
import fs from "node:fs";
import Fastify from "fastify";

const body = JSON.parse(fs.readFileSync(process.env.BARE_BODY_FILE as string, "utf8")) as unknown;
const app = Fastify({ logger: false });
app.get("/bare/:id", async () => body);
const url = await app.listen({ host: "127.0.0.1", port: 0 });
console.log(url);
process.on("SIGTERM", () => void app.close().then(() => process.exit(0)));
