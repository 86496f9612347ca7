/**
 * Receipts: the Go implementation's vectors (pkg/audit/testdata/receipts.json,
 * copied into the package at build) verify here as they do there.
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { test } from "node:test";

import { KeySet, ReceiptError, verifyReceipt, type PublicKeyInfo, type Result } from "../index.js";

const TESTDATA = new URL("../testdata/", import.meta.url);
const ORIGINAL = new URL("../../../../pkg/audit/testdata/receipts.json", import.meta.url);

interface Vectors {
  keys: { keys: PublicKeyInfo[] };
  cases: { name: string; answer: Result; error: string }[];
}

const vectors = JSON.parse(readFileSync(new URL("receipts.json", TESTDATA), "utf8")) as Vectors;

test("the copy is the repository's", { skip: !existsSync(ORIGINAL) && "outside the repository" }, () => {
  assert.equal(readFileSync(new URL("receipts.json", TESTDATA), "utf8"), readFileSync(ORIGINAL, "utf8"));
});

test("every receipt vector", () => {
  const keys = KeySet.fromJSON(vectors.keys);
  assert.ok(vectors.cases.length >= 15);
  for (const c of vectors.cases) {
    if (c.error === "") {
      assert.doesNotThrow(() => verifyReceipt(c.answer, keys), c.name);
      continue;
    }
    assert.throws(
      () => verifyReceipt(c.answer, keys),
      (err: unknown) => err instanceof ReceiptError && err.kind === c.error,
      `${c.name}: want ${c.error}`,
    );
  }
});

test("a key whose id is not its own is refused", () => {
  const k = vectors.keys.keys[0];
  assert.ok(k !== undefined);
  assert.throws(() => new KeySet([{ ...k, id: "0000000000000000" }]), ReceiptError);
});
