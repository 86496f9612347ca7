/**
 * Receipts: the Go implementation's vectors (pkg/audit/testdata/receipts.json,
 * copied into the package at build) verify here as they do there.
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { test } from "node:test";

import { BadReceiptError, KeySet, ReceiptError, verifyReceipt, verifyReceiptText, type PublicKeyInfo, type Result } from "../index.js";

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

test("the client checks an already_done answer's receipt", async () => {
  const { IdemClient } = await import("../client.js");
  const keys = KeySet.fromJSON(vectors.keys);
  const client = new IdemClient({ options: { inboxPrefix: "_INBOX" } } as unknown as ConstructorParameters<typeof IdemClient>[0], { receiptKeys: keys }) // no connection: checkReceipt needs none;
  const answer = (name: string): Result => {
    const c = vectors.cases.find((x) => x.name === name);
    assert.ok(c !== undefined, name);
    return c.answer;
  };
  const done = answer("already_done, with its completion's receipt");
  assert.equal(client.checkReceipt(done), done);
  for (const name of ["already_done, another result", "already_done, a receipt with a junk signature", "already_done without a receipt"]) {
    assert.throws(() => client.checkReceipt(answer(name)), BadReceiptError, name);
  }
});
