/**
 * The package's `engines` claim is true: every package the lock file
 * installs supports the oldest Node the package says it runs on.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

const ROOT = new URL("../../", import.meta.url);

/** The lowest Node major a range admits, for the forms packages use (>=N, >= N.x, ^N, N.x, *); undefined otherwise. */
export function lowestMajor(range: string): number | undefined {
  const r = range.trim();
  if (r === "*" || r === "") return 0;
  const m = /^(?:>=|\^|~)?\s*v?(\d+)(?:\.(?:\d+|x))*(?:\.x)?$/.exec(r);
  return m === null ? undefined : Number(m[1]);
}

test("lowestMajor reads the forms in use", () => {
  assert.equal(lowestMajor(">=20"), 20);
  assert.equal(lowestMajor(">= 22.x"), 22);
  assert.equal(lowestMajor(">= 18.0.0"), 18);
  assert.equal(lowestMajor("^14.17"), 14);
  assert.equal(lowestMajor("*"), 0);
  assert.equal(lowestMajor(">=14 <16 || >=18"), undefined);
});

test("every installed package runs on the Node the package claims", () => {
  const pkg = JSON.parse(readFileSync(new URL("package.json", ROOT), "utf8")) as { engines: { node: string } };
  const claimed = lowestMajor(pkg.engines.node);
  assert.ok(claimed !== undefined, `package.json engines.node ${pkg.engines.node}: write >=N`);
  const lock = JSON.parse(readFileSync(new URL("package-lock.json", ROOT), "utf8")) as {
    packages: Record<string, { engines?: { node?: string }; dev?: boolean }>;
  };
  for (const [path, p] of Object.entries(lock.packages)) {
    const range = p.engines?.node;
    if (path === "" || range === undefined) continue;
    const low = lowestMajor(range);
    assert.ok(low !== undefined, `${path}: engines.node ${JSON.stringify(range)} is a form this test cannot read`);
    assert.ok(low <= claimed, `${path} needs Node ${range}, but package.json claims ${pkg.engines.node}`);
  }
  assert.ok(Number(process.versions.node.split(".")[0]) >= claimed, "these tests run on a Node the package supports");
});
