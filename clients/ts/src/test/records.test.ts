/**
 * Receipts of ledger records: a record keeps its receipt's signature, and
 * the receipt it gives back is the one the Go ledger signed
 * (src/test/testdata/records.json, copied into the package at build).
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import type { PubAck } from "@nats-io/jetstream";
import type { Subscription } from "@nats-io/transport-node";

import { decodeRecord } from "../answer.js";
import {
  IdemClient,
  KeySet,
  recordReceipt,
  Submission,
  verifyEvent,
  verifyReceipt,
  type JsonObject,
  type LedgerRecord,
  type PublicKeyInfo,
} from "../index.js";

interface Vectors {
  keys: { keys: PublicKeyInfo[] };
  records: { name: string; key: string; record: LedgerRecord; receipt: JsonObject }[];
}

const vectors = JSON.parse(readFileSync(new URL("../testdata/records.json", import.meta.url), "utf8")) as Vectors;
const keys = KeySet.fromJSON(vectors.keys);

/** The vector named `name`: a fresh copy of its record, as the ledger stores it, and its receipt. */
function vector(name: string): { key: string; record: LedgerRecord; receipt: JsonObject } {
  const v = vectors.records.find((r) => r.name === name);
  assert.ok(v !== undefined, name);
  const record = decodeRecord(new TextEncoder().encode(JSON.stringify(v.record)));
  assert.ok(record !== undefined);
  return { key: v.key, record, receipt: v.receipt };
}

/** A submission of `key` that is never waited on: only fromRecord is used. */
function submission(key: string, rec: LedgerRecord): Submission {
  return new Submission(
    {} as IdemClient,
    {} as Subscription,
    { tool: rec.tool ?? "", args: {} },
    { key, fingerprint: rec.fingerprint },
    { seq: 1, duplicate: false, stream: "IDEM_INTENTS" } as PubAck,
    { grace: 3000, noLedger: false, leaseMs: 30_000, republish: () => Promise.reject(new Error("unused")) },
  );
}

test("a Go record's signature gives back the receipt Go signed, which verifies", () => {
  const covered = { result: false, decision: false, holder: false, approval: false };
  assert.ok(vectors.records.length >= 4);
  for (const { name } of vectors.records) {
    const { record, receipt } = vector(name);
    assert.equal(record.receipt, undefined, `${name}: stored without its receipt`);
    assert.ok(record.signature?.proof, `${name}: signed in a batch`);
    const rebuilt = recordReceipt(record);
    assert.deepEqual(rebuilt, receipt, name);
    assert.doesNotThrow(() => verifyEvent(rebuilt, keys), name);
    covered.result ||= record.result !== undefined;
    covered.decision ||= record.status === "denied" && record.decision?.op === "deny" && record.error !== undefined;
    covered.holder ||= record.signature?.holder !== undefined && record.signature.holder !== record.holder && record.holder !== undefined;
    covered.approval ||= record.decision?.op === "approve";
  }
  assert.deepEqual(covered, { result: true, decision: true, holder: true, approval: true });
});

test("a decision is in the receipt when recorded at the completion's instant, and not an approval", () => {
  const denied = vector("denied by an operator");
  const d = denied.record.decision!;
  assert.equal(d.at, denied.record.completed_at);
  // The same instants, written otherwise: Go reads them as times, and writes the event's in UTC.
  const same = { ...denied.record, completed_at: "2026-11-30T10:00:05.120000000+01:00", decision: { ...d, at: "2026-11-30T09:00:05.120Z" } };
  assert.deepEqual(recordReceipt(same), denied.receipt);
  const earlier = recordReceipt({ ...denied.record, decision: { ...d, at: "2026-11-30T09:00:05.119999999Z" } });
  assert.equal(earlier?.op, undefined, "a decision before the outcome did not make it");
  assert.throws(() => verifyEvent(earlier, keys));

  const approved = vector("completed after an approval");
  const a = approved.record.decision!;
  assert.notEqual(a.at, approved.record.completed_at);
  const atOnce = recordReceipt({ ...approved.record, decision: { ...a, at: approved.record.completed_at! } });
  assert.deepEqual(atOnce, approved.receipt, "an approval is never in it");
});

test("answers from a record carry the rebuilt receipt, and it verifies", () => {
  for (const name of ["completed with a result", "denied by an operator", "failed, written by another holder than the record's"]) {
    const { key, record, receipt } = vector(name);
    const res = submission(key, record).fromRecord(record);
    assert.equal(res.status, record.status, name);
    assert.deepEqual(res.receipt, receipt, name);
    assert.doesNotThrow(() => verifyReceipt(res, keys), name);
  }
});

test("a record that keeps its receipt whole gives it as it is", () => {
  const { key, record, receipt } = vector("completed with a result");
  const whole = { ...receipt, note: "kept whole" };
  const rec: LedgerRecord = { ...record, receipt: whole };
  assert.equal(recordReceipt(rec), whole);
  const { signature: _, ...old } = rec;
  assert.equal(recordReceipt(old), whole, "a record of before signatures");
  assert.equal(recordReceipt({ ...rec, signature: { ...record.signature!, proof: "!" } }), whole, "its signature is not read");
  assert.equal(submission(key, rec).fromRecord(rec).receipt, whole);
});

test("a malformed signature, or a record that is not final, gives no receipt", () => {
  const { key, record } = vector("denied by an operator");
  const sig = record.signature!;
  const proof = Buffer.from(sig.proof!, "base64url");
  const side = Buffer.from(proof);
  side[33] = 0x58; // 'X': the second step's side
  const malformed: Record<string, string> = {
    "not base64url": `${sig.proof!.slice(0, -1)}+`,
    padded: `${sig.proof!}=`,
    "not whole steps": proof.subarray(0, proof.length - 1).toString("base64url"),
    "a step too long": Buffer.concat([proof, Buffer.from([0x4c])]).toString("base64url"),
    "a side that is neither L nor R": side.toString("base64url"),
  };
  for (const [why, p] of Object.entries(malformed)) {
    const rec: LedgerRecord = { ...record, signature: { ...sig, proof: p } };
    assert.equal(recordReceipt(rec), undefined, why);
    assert.equal("receipt" in submission(key, rec).fromRecord(rec), false, why);
  }
  const notJSON = { ...record, signature: { ...sig, proof: 7 } } as unknown as LedgerRecord;
  assert.equal(recordReceipt(notJSON), undefined, "a proof that is not a string");
  assert.equal(recordReceipt({ ...record, signature: "x" } as unknown as LedgerRecord), undefined, "a signature that is not an object");
  assert.equal(recordReceipt({ ...record, completed_at: "yesterday" }), undefined, "a time that is not RFC 3339");
  for (const status of ["pending", "awaiting_approval", "uncertain"] as const) {
    assert.equal(recordReceipt({ ...record, status }), undefined, status);
  }
  // No proof at all is an event signed alone: no "proof" member.
  const { proof: _, ...alone } = sig;
  assert.equal("proof" in (recordReceipt({ ...record, signature: alone }) ?? {}), false);
  assert.ok(recordReceipt({ ...record, signature: alone }) !== undefined);
});
