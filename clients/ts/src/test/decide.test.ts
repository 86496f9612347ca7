/** Operator decisions are checked as the workers check them (intent.DecodeControl). */

import assert from "node:assert/strict";
import { test } from "node:test";

import { encodeDecision, IdemError } from "../index.js";

test("well-formed decisions encode", () => {
  assert.deepEqual(JSON.parse(encodeDecision("approve", { key: "k", fingerprint: "f", by: "ops", reason: "ok" })), {
    key: "k",
    fingerprint: "f",
    by: "ops",
    reason: "ok",
  });
  assert.deepEqual(JSON.parse(encodeDecision("deny", { key: "k" })), { key: "k" });
  assert.deepEqual(JSON.parse(encodeDecision("resolve", { key: "k", outcome: "succeeded", result: { id: 7 } })), {
    key: "k",
    outcome: "succeeded",
    result: { id: 7 },
  });
  assert.deepEqual(JSON.parse(encodeDecision("resolve", { key: "k", outcome: "failed", reason: "bounced" })), {
    key: "k",
    outcome: "failed",
    reason: "bounced",
  });
});

test("malformed decisions are refused", () => {
  const cases: [string, Parameters<typeof encodeDecision>[1], RegExp][] = [
    ["cancel", { key: "k" }, /unknown decision "cancel"/],
    ["approve", { key: "" }, /no key/],
    ["resolve", { key: "k" }, /outcome "": use succeeded or failed/],
    ["resolve", { key: "k", outcome: "maybe" as "failed" }, /outcome "maybe"/],
    ["approve", { key: "k", outcome: "succeeded" }, /belong to resolve/],
    ["deny", { key: "k", result: 1 }, /belong to resolve/],
  ];
  for (const [op, d, want] of cases) {
    assert.throws(
      () => encodeDecision(op, d),
      (err: unknown) => err instanceof IdemError && err.code === "invalid_decision" && want.test(err.message),
      `${op} ${JSON.stringify(d)}`,
    );
  }
});
