/**
 * Receipts: the Go implementation's vectors (pkg/audit/testdata/receipts.json,
 * copied into the package at build) verify here as they do there.
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { test } from "node:test";

import { KeySet, ReceiptError, verifyReceipt, verifyReceiptText, type PublicKeyInfo, type Result } from "../index.js";

const TESTDATA = new URL("../testdata/", import.meta.url);
const ORIGINAL = new URL("../../../../pkg/audit/testdata/receipts.json", import.meta.url);

interface Vectors {
  keys: { keys: PublicKeyInfo[] };
  cases: { name: string; answer: Result; answer_text?: string; error: string }[];
}

const vectors = JSON.parse(readFileSync(new URL("receipts.json", TESTDATA), "utf8")) as Vectors;

test("the copy is the repository's", { skip: !existsSync(ORIGINAL) && "outside the repository" }, () => {
  assert.equal(readFileSync(new URL("receipts.json", TESTDATA), "utf8"), readFileSync(ORIGINAL, "utf8"));
});

test("every receipt vector", () => {
  const keys = KeySet.fromJSON(vectors.keys);
  assert.ok(vectors.cases.length >= 15);
  for (const c of vectors.cases) {
    // A case a parser must see as written comes as text too.
    const check = (): unknown => (c.answer_text !== undefined ? verifyReceiptText(c.answer_text, keys) : verifyReceipt(c.answer, keys));
    if (c.error === "") {
      assert.doesNotThrow(check, c.name);
      continue;
    }
    assert.throws(
      check,
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
