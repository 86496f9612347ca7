/**
 * Which pushed answers a submission takes (docs/protocol.md 7.1): only
 * those bound by `Idem-Intent-Seq` to one of its own stored publishes.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import type { PubAck } from "@nats-io/jetstream";
import type { Msg, Subscription } from "@nats-io/transport-node";

import { answerBound, HEADER_INTENT_SEQ, IdemClient, Submission, type LedgerRecord, type Result } from "../index.js";

const KEY = "send_email.".padEnd(75, "a");
const FP = "f".repeat(64);

test("an answer counts only when bound to one of the submission's own stored publishes", () => {
  const sub = { key: KEY, fingerprint: FP, own: new Set([7]) };
  const done: Partial<Result> = { key: KEY, fingerprint: FP, status: "completed" };
  assert.equal(answerBound("7", done, sub), true, "the right sequence");
  assert.equal(answerBound(undefined, done, sub), false, "no header");
  assert.equal(answerBound(undefined, { key: KEY, status: "completed" }, sub), false, "no header, no fingerprint");
  assert.equal(answerBound("", done, sub), false, "an empty header");
  assert.equal(answerBound("8", done, sub), false, "another message's sequence");
  assert.equal(answerBound("07", done, sub), false, "not a sequence as a worker writes it");
  assert.equal(answerBound("7", { ...done, key: "send_email.other" }, sub), false, "bound, but another operation");
  assert.equal(answerBound("7", { ...done, fingerprint: "e".repeat(64) }, sub), false, "bound, but other arguments");
  assert.equal(answerBound("7", { status: "rejected", key: "" }, sub), true, "a rejection before derivation names no key");
  assert.equal(answerBound("7", { ...done, intent_seq: 7 }, sub), true, "its own run");
  assert.equal(answerBound("7", { ...done, intent_seq: 3, replayed: false }, sub), false, "bound, not replayed, but another run's");
  assert.equal(answerBound("7", { ...done, intent_seq: 3, replayed: true }, sub), true, "a replay names another call's run");
  const duplicate = { key: KEY, fingerprint: FP, own: new Set<number>() };
  assert.equal(answerBound("7", done, duplicate), false, "a duplicate's ack names another caller's message");
});

/** A subscription the test feeds by hand. */
class FakeSub {
  readonly #queue: Msg[] = [];
  #waiting: ((r: IteratorResult<Msg>) => void) | undefined;
  #closed = false;

  push(res: Partial<Result> | string, intentSeq?: number): void {
    const text = typeof res === "string" ? res : JSON.stringify(res);
    const m = {
      string: () => text,
      headers: { get: (k: string) => (k === HEADER_INTENT_SEQ && intentSeq !== undefined ? String(intentSeq) : "") },
    } as unknown as Msg;
    if (this.#waiting !== undefined) {
      const w = this.#waiting;
      this.#waiting = undefined;
      w({ value: m, done: false });
    } else {
      this.#queue.push(m);
    }
  }

  unsubscribe(): void {
    this.#closed = true;
    this.#waiting?.({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterator<Msg> {
    return {
      next: () => {
        const m = this.#queue.shift();
        if (m !== undefined) return Promise.resolve({ value: m, done: false });
        if (this.#closed) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => (this.#waiting = resolve));
      },
    };
  }
}

/** A client whose ledger watch answers with `record` once it is resolved, else never. */
function fakeClient(record?: Promise<LedgerRecord>): IdemClient {
  return {
    followKey: (_key: string, each: (rec: LedgerRecord | undefined) => boolean | Promise<boolean>) => ({
      done: (record ?? new Promise<LedgerRecord>(() => undefined)).then(async (rec) => ((await each(rec)) ? rec : undefined)),
      stop: () => undefined,
    }),
    checkReceipt: (res: Result) => res, // no receipt keys: every answer stands
  } as unknown as IdemClient;
}

function submission(client: IdemClient, sub: FakeSub, ack: { seq: number; duplicate: boolean }, republish?: () => Promise<PubAck>, grace = 3_600_000): Submission {
  return new Submission(
    client,
    sub as unknown as Subscription,
    { tool: "send_email", args: {} },
    { key: KEY, fingerprint: FP },
    { stream: "IDEM_INTENTS", ...ack } as PubAck,
    { grace, noLedger: false, leaseMs: 30_000, republish: republish ?? (() => Promise.reject(new Error("unused"))) },
  );
}

const completed = (result: string): Result => ({ key: KEY, tool: "send_email", status: "completed", replayed: false, fingerprint: FP, attempts: 1, result });

test("wait drops answers without the header, bound to another message, or naming another operation", async () => {
  const sub = new FakeSub();
  const s = submission(fakeClient(), sub, { seq: 7, duplicate: false });
  sub.push(completed("no header"));
  sub.push(completed("another message"), 8);
  sub.push({ ...completed("another operation"), key: "send_email.other" }, 7);
  sub.push("not json", 7);
  sub.push(completed("own"), 7);
  const res = await s.wait(60_000);
  assert.equal(res.result, "own");
  assert.equal(s.dropped, 4);
});

test("wait of a duplicate drops an answer bound to the duplicate's sequence and answers from the ledger", async () => {
  const sub = new FakeSub();
  let record!: (rec: LedgerRecord) => void;
  const s = submission(fakeClient(new Promise((resolve) => (record = resolve))), sub, { seq: 7, duplicate: true });
  sub.push(completed("forged"), 7);
  const waited = s.wait(60_000);
  await new Promise((resolve) => setImmediate(resolve)); // the pushed answer is looked at first
  record({ status: "completed", fingerprint: FP, attempt: 1, attempts: 1, intent_seq: 7, result: "recorded", created_at: "", updated_at: "" });
  const res = await waited;
  assert.equal(res.result, "recorded");
  assert.equal(res.replayed, true, "another call's outcome");
  assert.equal(s.dropped, 1);
});

test("an answer to a republish that comes before its PubAck is held, then taken", async () => {
  const sub = new FakeSub();
  let acked!: (ack: PubAck) => void;
  let republished!: () => void;
  const sent = new Promise<void>((resolve) => (republished = resolve));
  const republish = (): Promise<PubAck> => {
    republished();
    return new Promise((resolve) => (acked = resolve));
  };
  const s = submission(fakeClient(), sub, { seq: 7, duplicate: true }, republish, 1);
  const waited = s.wait(60_000);
  await sent;
  sub.push(completed("the republished copy's"), 9); // before its PubAck
  await new Promise((resolve) => setImmediate(resolve));
  acked({ stream: "IDEM_INTENTS", seq: 9, duplicate: false } as PubAck);
  const res = await waited;
  assert.equal(res.result, "the republished copy's");
  assert.equal(s.dropped, 0);
  assert.equal(s.republished, 1);
});
