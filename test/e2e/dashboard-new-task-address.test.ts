// The new-task form follows its address: `#/new?files=…` edited, or Back and Forward between two such
// addresses, shows the files the address names, each looked up (a form kept from the address before
// showed its old choice and never looked the new ids up).
import assert from "node:assert/strict";
import { test } from "node:test";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { browserSkip, dashboardSuite, uploadFile } from "../helpers/browser.ts";

const skip = browserSkip;
const s = dashboardSuite();

test("the new-task form shows the files its address names, after an edit of the address and after Back", {
  skip,
}, async () => {
  const { token } = await tokenCreate(s.env.db.sql, "nora «n»", "user");
  const a = (await uploadFile(s.base, token, "first «a».csv", "a\n1\n")).fileId;
  const b = (await uploadFile(s.base, token, "second 日本.csv", "b\n2\n")).fileId;
  const page = await s.signedIn(token);
  await page.evaluate(`location.hash = "#/new?files=${a}"`);
  await page.getByText("(1 chosen)").waitFor();
  await page.evaluate(`location.hash = "#/new?files=${a},${b}"`);
  await page.getByText("(2 chosen)").waitFor();
  const box = (name: RegExp) => page.locator("ul.known").getByRole("checkbox", { name });
  assert.equal(await box(/second 日本\.csv/).isChecked(), true, "b is chosen");
  await page.goBack();
  await page.getByText("(1 chosen)").waitFor();
  assert.equal(await box(/second 日本\.csv/).isChecked(), false, "b is no longer chosen");
  assert.equal(await box(/first «a»\.csv/).isChecked(), true, "a still is");
  assert.deepEqual(s.problems, []);
});
