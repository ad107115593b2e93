// `assay token revoke <id>`: an id that is numeric but out of range is said to be so (exit 2), not
// "needs a numeric token id"; one that is not numeric still is. Neither opens the database.
import assert from "node:assert/strict";
import { test } from "node:test";
import { cleanEnv, runCli } from "../helpers/cli.ts";

test("token revoke: a numeric id out of range says so; a non-numeric one needs a numeric id", async () => {
  // A database nothing answers at: a usage error comes before any connection.
  const env = cleanEnv({ DATABASE_URL: "postgres://assay:pw@127.0.0.1:1/assay_ünï" });
  for (const id of ["99999999999999999999", "1000000000000000", "0", "000"]) {
    const res = await runCli(["token", "revoke", id], env);
    assert.equal(res.code, 2, `${id}: ${res.stderr}`);
    assert.match(
      res.stderr,
      new RegExp(`token id ${id} is out of range: token ids are 1 to 999999999999999`),
      id,
    );
    assert.doesNotMatch(res.stderr, /needs a numeric token id|ECONNREFUSED/, id);
  }
  for (const id of ["abc", "+1", "1e3", "１２", "12 "]) {
    const res = await runCli(["token", "revoke", id], env);
    assert.equal(res.code, 2, `${id}: ${res.stderr}`);
    assert.match(res.stderr, /token revoke needs a numeric token id/, id);
  }
  // The largest id in range, and one with leading zeros (`007` is 7), reach the database.
  for (const id of ["999999999999999", "007", "0000000000000000000010000000000"]) {
    const res = await runCli(["token", "revoke", id], env);
    assert.equal(res.code, 1, `${id}: ${res.stderr}`);
    assert.match(res.stderr, /ECONNREFUSED/, id);
  }
});
