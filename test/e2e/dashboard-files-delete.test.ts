// The Files page deletes chosen files: asked first in the page, then gone from the list and from the
// API; a file someone else deleted meanwhile counts as deleted; nothing is deleted when the user keeps
// them. Real API process, real browser.
import assert from "node:assert/strict";
import { test } from "node:test";
import { tokenCreate } from "../../src/auth/tokens.ts";
import { browserSkip, dashboardSuite, uploadFile } from "../helpers/browser.ts";

const skip = browserSkip;
const s = dashboardSuite();

test("deleting chosen files from the Files page: asked first, then gone; one deleted meanwhile elsewhere counts", {
  skip,
}, async () => {
  const { token } = await tokenCreate(s.env.db.sql, "dora ☂", "user");
  const names = ["keep «me».csv", "gone-1 \u202Ecod.exe.csv", "gone-2 日本.csv", "gone-3.csv"];
  const ids: string[] = [];
  for (const name of names) ids.push((await uploadFile(s.base, token, name, "a,b\n1,2\n")).fileId);
  const page = await s.open(`#token=${encodeURIComponent(token)}`);
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Files" }).click();
  const row = (id: string) => page.locator(`tr[data-file="${id}"]`);
  await row(ids[3] as string).waitFor();
  const remove = page.getByRole("button", { name: /^Delete \d+ selected$/ });
  assert.equal(await remove.isDisabled(), true, "nothing chosen, nothing to delete");
  for (const id of ids.slice(1)) await row(id).getByRole("checkbox").check();
  await page.getByRole("button", { name: "Delete 3 selected" }).click();
  // Kept: nothing deleted.
  await page.getByRole("button", { name: "Keep", exact: true }).click();
  assert.equal(await row(ids[1] as string).count(), 1);
  // One of them deleted by another client meanwhile.
  const gone = await fetch(`${s.base}/api/files/${ids[2]}`, {
    method: "DELETE",
    headers: { authorization: `Bearer ${token}` },
  });
  assert.equal(gone.status, 200);
  await page.getByRole("button", { name: "Delete 3 selected" }).click();
  await page.getByRole("alert").getByRole("button", { name: "Delete" }).click();
  for (const id of ids.slice(1)) await row(id).waitFor({ state: "detached" });
  assert.equal(await row(ids[0] as string).count(), 1, "the file not chosen stays");
  assert.equal(await page.locator(".error").count(), 0, "no error: the one deleted elsewhere counts");
  assert.equal(await page.getByRole("button", { name: "Delete 0 selected" }).isDisabled(), true);
  for (const [i, id] of ids.entries()) {
    const res = await fetch(`${s.base}/api/files/${id}`, { headers: { authorization: `Bearer ${token}` } });
    assert.equal(res.status, i === 0 ? 200 : 404, names[i]);
  }
  assert.deepEqual(s.problems, []);
});
