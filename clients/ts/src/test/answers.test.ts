/**
 * Which answers a submission accepts, and what `replayed` says
 * (docs/protocol.md sections 5 and 7).
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import type { PubAck } from "@nats-io/jetstream";
import type { Subscription } from "@nats-io/transport-node";

import { answerMatches, IdemClient, Submission, type LedgerRecord } from "../index.js";
import { decisionExitCode, exitCode } from "../cli.js";

const KEY = "refund.0d5e".padEnd(71, "0");
const FP = "f".repeat(64);

test("only answers with the submission's key, and its fingerprint when given, are accepted", () => {
  assert.equal(answerMatches({ key: KEY, fingerprint: FP }, KEY, FP), true);
  assert.equal(answerMatches({ key: KEY }, KEY, FP), true, "no fingerprint: the key decides");
  assert.equal(answerMatches({ key: KEY, fingerprint: "" }, KEY, FP), true);
  assert.equal(answerMatches({ key: "refund.other", fingerprint: FP }, KEY, FP), false, "another operation's answer");
  assert.equal(answerMatches({ key: KEY, fingerprint: "e".repeat(64) }, KEY, FP), false, "another request's answer");
  assert.equal(answerMatches({ key: "" }, KEY, FP), false, "a keyless answer names no operation");
  assert.equal(answerMatches({}, KEY, FP), false);
});

/** A submission that is never waited on: only fromRecord is used. */
function submission(ack: Partial<PubAck>): Submission {
  return new Submission(
    {} as IdemClient,
    {} as Subscription,
    { tool: "refund", args: {}, call_id: "c1" },
    { key: KEY, fingerprint: FP },
    { seq: 7, duplicate: false, stream: "IDEM_INTENTS", ...ack } as PubAck,
    { grace: 3000, noLedger: false, leaseMs: 30_000, republish: () => Promise.reject(new Error("unused")) },
  );
}

function record(over: Partial<LedgerRecord>): LedgerRecord {
  return {
    status: "completed",
    fingerprint: FP,
    attempt: 1,
    attempts: 1,
    intent_seq: 7,
    created_at: "2026-11-30T09:00:00Z",
    updated_at: "2026-11-30T09:00:01Z",
    completed_at: "2026-11-30T09:00:01Z",
    ...over,
  };
}

test("replayed is true exactly when another call caused the outcome", () => {
  const own = submission({ seq: 7 });
  assert.equal(own.fromRecord(record({})).replayed, false, "the record was claimed by this publish");
  assert.equal(own.fromRecord(record({ intent_seq: 3 })).replayed, true, "claimed by another call");
  // The approved operation fires from the record this call created: still this call's.
  assert.equal(own.fromRecord(record({ status: "completed", intent_seq: 7 })).replayed, false);
  const dup = submission({ seq: 7, duplicate: true });
  assert.equal(dup.fromRecord(record({})).replayed, true, "a duplicate's ack names the original's sequence: another call");
});

test("non-final answers carry no completed_at; final ones do", () => {
  const s = submission({});
  const { completed_at: _, ...open } = record({ status: "awaiting_approval" });
  const parked = s.fromRecord(open);
  assert.equal(parked.status, "awaiting_approval");
  assert.equal("completed_at" in parked, false);
  assert.equal("completed_at" in s.fromRecord(record({ status: "uncertain" })), false);
  assert.equal(s.fromRecord(record({})).completed_at, "2026-11-30T09:00:01Z");
});

test("a conflict is about this call: its fingerprint, the record's beside it, not replayed", () => {
  const other = "e".repeat(64);
  const res = submission({ duplicate: true }).fromRecord(record({ fingerprint: other }));
  assert.equal(res.status, "conflict");
  assert.equal(res.replayed, false);
  assert.equal(res.fingerprint, FP);
  assert.equal(res.record_fingerprint, other);
  assert.equal(res.error?.code, "conflict");
  assert.equal(res.call_id, "c1");
  assert.equal(exitCode(res), 4);
});

test("decisions exit 0 when they took effect, 5 when rejected", () => {
  const base = { key: KEY, tool: "refund", replayed: false, attempts: 0 };
  assert.equal(decisionExitCode("deny", { ...base, status: "denied" }), 0);
  assert.equal(decisionExitCode("approve", { ...base, status: "completed" }), 0);
  assert.equal(decisionExitCode("resolve", { ...base, status: "failed" }), 0);
  assert.equal(decisionExitCode("approve", { ...base, status: "failed" }), 5, "approved, but the effect failed");
  assert.equal(decisionExitCode("deny", { ...base, status: "rejected", error: { code: "wrong_state", message: "" } }), 5);
});
