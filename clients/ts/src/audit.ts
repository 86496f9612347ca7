/**
 * Receipts (docs/audit.md): the signed event every final answer carries.
 *
 * A receipt is an audit event. Its RFC 8785 form without `sig` and `proof`
 * is a Merkle leaf, SHA-256(0x00 || JCS); the leaf folded with each proof
 * step (`L<hex>`: a left sibling, `R<hex>`: a right one, each node
 * SHA-256(0x01 || left || right)) is the root its signer signed with
 * Ed25519. {@link verifyReceipt} also checks that the receipt records the
 * answer it came with: the same key (or its compact ledger key),
 * fingerprint, status and attempts, and the digests of its result and
 * error. A ledger record keeps its receipt as the signature alone;
 * {@link recordReceipt} gives the receipt back.
 *
 * @example
 * ```ts
 * const keys = KeySet.fromJSON(readFileSync("keys.json", "utf8"));
 * const client = await IdemClient.connect(url, { receiptKeys: keys });
 * const res = await client.submit(env); // throws BadReceiptError if its receipt does not hold
 * ```
 *
 * @module
 */

import { createHash, createPublicKey, verify, type KeyObject } from "node:crypto";

import type { LedgerRecord, Result } from "./answer.js";
import { canonical } from "./derive.js";
import { IdemError } from "./errors.js";
import { parseStrict, setMember, type JsonObject, type JsonValue } from "./json.js";
import { LAYOUT_COMPACT, ledgerKey } from "./layout.js";

/** What is wrong with a receipt. */
export type ReceiptErrorKind = "no_receipt" | "invalid" | "bad_signature" | "unknown_signer" | "key_not_valid" | "mismatch";

/** A receipt that does not hold. `code` is `"bad_receipt"`; `kind` says how. */
export class ReceiptError extends IdemError {
  /** What is wrong. */
  readonly kind: ReceiptErrorKind;

  /**
   * @param kind - what is wrong
   * @param message - how
   */
  constructor(kind: ReceiptErrorKind, message: string) {
    super("bad_receipt", `${kind}: ${message}`);
    this.kind = kind;
  }
}

/**
 * A client given receipt keys got an answer whose receipt is missing or does
 * not hold. `answer` is the answer; `kind` the {@link ReceiptError}'s.
 */
export class BadReceiptError extends ReceiptError {
  /** The answer whose receipt failed. */
  readonly answer: Result;

  /**
   * @param answer - the answer
   * @param err - why its receipt failed
   */
  constructor(answer: Result, err: ReceiptError) {
    super(err.kind, err.message.slice(err.kind.length + 2));
    this.answer = answer;
  }
}

const RFC3339 = /^(\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$/;

/** An RFC 3339 time as nanoseconds since the epoch. */
function nanos(text: unknown): bigint {
  const m = typeof text === "string" ? RFC3339.exec(text) : null;
  if (m?.[1] === undefined || m[3] === undefined) {
    throw new ReceiptError("invalid", `time ${JSON.stringify(text)} is not RFC 3339`);
  }
  const ms = Date.parse(`${m[1]}${m[3].toUpperCase()}`);
  if (Number.isNaN(ms)) {
    throw new ReceiptError("invalid", `time ${String(text)} is not RFC 3339`);
  }
  return BigInt(ms) * 1_000_000n + BigInt((m[2] ?? "").padEnd(9, "0"));
}

/** One key of a keys file. */
export interface PublicKeyInfo {
  /** The first 16 hex digits of the key's SHA-256. */
  id: string;
  /** The raw 32-byte Ed25519 public key, base64url without padding. */
  public_key: string;
  /** Who made or uses it. */
  holder?: string;
  /** RFC 3339: events before it are not vouched for by this key. */
  not_before?: string;
  /** RFC 3339: events from it on are not vouched for by this key. */
  not_after?: string;
}

/** The public keys a verifier trusts, each with its validity (a keys file). */
export class KeySet {
  readonly #keys = new Map<string, { key: KeyObject; notBefore?: bigint; notAfter?: bigint }>();

  /**
   * @param keys - the keys
   * @throws {@link ReceiptError} (`invalid`) for a key that is not one, or whose id is not its own
   */
  constructor(keys: readonly PublicKeyInfo[]) {
    for (const k of keys) {
      const raw = Buffer.from(k.public_key ?? "", "base64url");
      if (raw.length !== 32) {
        throw new ReceiptError("invalid", `key ${k.id}: public_key is not 32 bytes of base64url`);
      }
      const id = createHash("sha256").update(raw).digest("hex").slice(0, 16);
      if (id !== k.id) {
        throw new ReceiptError("invalid", `key ${k.id}: its public_key has id ${id}`);
      }
      const key = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: raw.toString("base64url") }, format: "jwk" });
      this.#keys.set(k.id, {
        key,
        ...(k.not_before ? { notBefore: nanos(k.not_before) } : {}),
        ...(k.not_after ? { notAfter: nanos(k.not_after) } : {}),
      });
    }
  }

  /**
   * A key set from a keys file (`{"keys": [...]}`), as text or parsed.
   *
   * @param doc - the keys file
   * @returns the key set
   */
  static fromJSON(doc: string | { keys?: PublicKeyInfo[] }): KeySet {
    const v = typeof doc === "string" ? (JSON.parse(doc) as { keys?: PublicKeyInfo[] }) : doc;
    return new KeySet(v.keys ?? []);
  }

  /** How many keys the set holds. */
  get size(): number {
    return this.#keys.size;
  }

  /**
   * The key `id` names, valid at `at`.
   *
   * @param id - the key id
   * @param at - an RFC 3339 time
   * @returns the key
   * @throws {@link ReceiptError} (`unknown_signer`, `key_not_valid`)
   */
  lookup(id: string, at: unknown): KeyObject {
    const k = this.#keys.get(id);
    if (k === undefined) {
      throw new ReceiptError("unknown_signer", `${JSON.stringify(id)} is not among the ${this.#keys.size} keys given`);
    }
    const t = nanos(at);
    if ((k.notBefore !== undefined && t < k.notBefore) || (k.notAfter !== undefined && t >= k.notAfter)) {
      throw new ReceiptError("key_not_valid", `key ${id} is not valid at ${String(at)}`);
    }
    return k.key;
  }
}

function sha256(...parts: Buffer[]): Buffer {
  const h = createHash("sha256");
  for (const p of parts) {
    h.update(p);
  }
  return h.digest();
}

/** Whether every number in v is within ±2^53: what RFC 8785's canonical form (as the protocol uses it) takes. */
function safeNumbers(v: JsonValue | undefined): boolean {
  if (typeof v === "number") {
    return Number.isFinite(v) && Math.abs(v) <= 2 ** 53;
  }
  if (Array.isArray(v)) {
    return v.every(safeNumbers);
  }
  if (v !== null && typeof v === "object") {
    return Object.values(v).every(safeNumbers);
  }
  return true;
}

/** Whether every string and member name in v is well-formed UTF-16 (no lone surrogate). */
function wellFormed(v: JsonValue | undefined): boolean {
  if (typeof v === "string") {
    return v.isWellFormed();
  }
  if (Array.isArray(v)) {
    return v.every(wellFormed);
  }
  if (v !== null && typeof v === "object") {
    return Object.entries(v).every(([k, x]) => k.isWellFormed() && wellFormed(x));
  }
  return true;
}

/**
 * hex(sha256(JCS(result))), as a receipt binds a result; "" for a result
 * with no canonical form (a number beyond ±2^53), which a receipt does not bind.
 *
 * @param result - the answer's result
 * @returns the digest
 * @throws {@link ReceiptError} (`invalid`) for a result holding a lone surrogate
 */
export function resultDigest(result: JsonValue): string {
  if (!wellFormed(result)) {
    throw new ReceiptError("invalid", "the answer's result holds a lone surrogate");
  }
  if (!safeNumbers(result)) {
    return "";
  }
  return sha256(Buffer.from(canonical(result), "utf8")).toString("hex");
}

/**
 * hex(sha256(JCS({code, message}))) of an answer's error.
 *
 * @param error - the answer's error
 * @returns the digest
 */
export function errorDigest(error: { code?: string; message?: string }): string {
  return sha256(Buffer.from(canonical({ code: error.code ?? "", message: error.message ?? "" }), "utf8")).toString("hex");
}

/** An instant as Go writes it in events: RFC 3339 in UTC, with the nanoseconds that are not trailing zeros. */
function rfc3339(ns: bigint): string {
  let sec = ns / 1_000_000_000n;
  let frac = ns % 1_000_000_000n;
  if (frac < 0n) {
    frac += 1_000_000_000n;
    sec -= 1n;
  }
  const digits = frac === 0n ? "" : `.${frac.toString().padStart(9, "0").replace(/0+$/, "")}`;
  return `${new Date(Number(sec) * 1000).toISOString().slice(0, 19)}${digits}Z`;
}

/** The steps of a compact Merkle proof (33 bytes a step: `L` or `R`, then the sibling), or undefined for a malformed one. */
function parseCompactProof(text: string): string[] | undefined {
  const b64 = text.replace(/[\r\n]/g, ""); // which Go's decoder skips
  if (!/^[A-Za-z0-9_-]*$/.test(b64) || b64.length % 44 !== 0) {
    return undefined; // 44 characters encode 33 bytes
  }
  const raw = Buffer.from(b64, "base64url");
  const steps: string[] = [];
  for (let i = 0; i < raw.length; i += 33) {
    const side = raw[i];
    if (side !== 0x4c && side !== 0x52) {
      return undefined;
    }
    steps.push(String.fromCharCode(side) + raw.subarray(i + 1, i + 33).toString("hex"));
  }
  return steps;
}

/**
 * The receipt of a ledger record: its `receipt` when it keeps one whole,
 * else the signed outcome event its `signature` and members give back, for
 * a completed, failed or denied record.
 *
 * @param rec - a ledger record
 * @returns the receipt, or undefined when the record has none (or a malformed signature)
 */
export function recordReceipt(rec: LedgerRecord): JsonObject | undefined {
  if (rec.receipt !== undefined && rec.receipt !== null) {
    return rec.receipt;
  }
  const s = rec.signature;
  if (typeof s !== "object" || s === null || typeof s.sig !== "string" || !["completed", "failed", "denied"].includes(rec.status)) {
    return undefined;
  }
  try {
    const proof = parseCompactProof(s.proof ?? "");
    if (proof === undefined) {
      return undefined;
    }
    const done = rec.completed_at !== undefined ? nanos(rec.completed_at) : undefined;
    const ev: JsonObject = { v: 1, kind: "outcome" };
    const put = (name: string, v: JsonValue | undefined): void => {
      if (v !== undefined && v !== null && v !== "" && v !== 0 && !(Array.isArray(v) && v.length === 0)) {
        ev[name] = v;
      }
    };
    put("key", s.key);
    put("tool", rec.tool);
    put("session", rec.session);
    put("fingerprint", rec.fingerprint);
    put("status", rec.status);
    put("attempts", rec.attempts);
    put("attempt", rec.attempt);
    put("intent_seq", rec.intent_seq);
    put("holder", s.holder || rec.holder);
    put("at", rfc3339(done ?? 0n)); // Go's zero time is written as the epoch
    if (rec.result !== undefined) {
      put("result_digest", resultDigest(rec.result));
    }
    if (rec.error !== undefined && rec.error !== null) {
      put("error_code", rec.error.code);
      put("error_digest", errorDigest(rec.error));
    }
    const d = rec.decision;
    // A decision made the outcome when it was recorded with it; an approval never does.
    if (d !== undefined && d !== null && done !== undefined && d.op !== "approve" && nanos(d.at) === done) {
      put("op", d.op);
      put("by", d.by);
      put("reason", d.reason);
    }
    put("signer", s.signer);
    put("sig", s.sig);
    put("proof", proof);
    return ev;
  } catch {
    return undefined; // a time that is not RFC 3339, or a member of another type
  }
}

/**
 * Checks a signed event's signature with the key its `signer` names in
 * `keys`, valid at its `at`.
 *
 * @param event - the event (a receipt)
 * @param keys - the trusted keys
 * @returns the event
 * @throws {@link ReceiptError}
 */
export function verifyEvent(event: JsonValue | undefined, keys: KeySet): JsonObject {
  if (event === null || typeof event !== "object" || Array.isArray(event) || typeof event.sig !== "string" || typeof event.signer !== "string") {
    throw new ReceiptError("bad_signature", "the event is not signed");
  }
  const rest: JsonObject = {};
  for (const [k, v] of Object.entries(event)) {
    if (k !== "sig" && k !== "proof") {
      setMember(rest, k, v); // every member is signed, one named __proto__ too
    }
  }
  if (!safeNumbers(rest)) {
    throw new ReceiptError("invalid", "the event has a number beyond ±2^53");
  }
  let h = sha256(Buffer.from([0]), Buffer.from(canonical(rest), "utf8"));
  const proof = event.proof ?? [];
  if (!Array.isArray(proof)) {
    throw new ReceiptError("invalid", "proof is not a list");
  }
  for (const step of proof) {
    if (typeof step !== "string" || !/^[LR][0-9a-f]{64}$/.test(step)) {
      throw new ReceiptError("invalid", `proof step ${JSON.stringify(step)}: want L or R and 64 hex digits`);
    }
    const sibling = Buffer.from(step.slice(1), "hex");
    h = step[0] === "L" ? sha256(Buffer.from([1]), sibling, h) : sha256(Buffer.from([1]), h, sibling);
  }
  const key = keys.lookup(event.signer, event.at);
  // One text per signature: 86 base64url characters, the unused last bits zero.
  const sig = Buffer.from(event.sig, "base64url");
  if (!SIG_TEXT.test(event.sig) || sig.toString("base64url") !== event.sig || !verify(null, h, key, sig)) {
    throw new ReceiptError("bad_signature", `signer ${event.signer}`);
  }
  return event;
}

/** A signature's one text: 64 bytes, base64url without padding. */
const SIG_TEXT = /^[A-Za-z0-9_-]{86}$/;

/**
 * Whether an answer of `status` carries a receipt: already_done carries its
 * completion's; a conflict does when a worker answered it.
 *
 * @param status - the answer's status
 * @returns true for completed, failed, denied, already_done and conflict
 */
export function receipted(status: string): boolean {
  return status === "completed" || status === "failed" || status === "denied" || status === "already_done" || status === "conflict";
}

/** The nesting an answer's text may have: a result as deep as the workers canonicalize (1000), inside the answer. */
const ANSWER_DEPTH = 1002;

/**
 * Checks an answer's receipt from the answer's JSON text as it came: the
 * text must repeat no member name and hold no lone surrogate (a JSON
 * parser would merge or keep them unseen), then {@link verifyReceipt}.
 *
 * @param text - the answer's JSON text, or its UTF-8 bytes
 * @param keys - the trusted keys
 * @returns the receipt
 * @throws {@link ReceiptError}
 */
export function verifyReceiptText(text: string | Uint8Array, keys: KeySet): JsonObject {
  return verifyReceipt(strictAnswer(text), keys);
}

/**
 * An answer's JSON text read strictly (no repeated member name, no lone
 * surrogate, a number beyond ±2^53 read as an infinity: unbound).
 *
 * @param text - the answer's JSON text, or its UTF-8 bytes
 * @returns the answer as the receipt check reads it
 * @throws {@link ReceiptError} (`invalid`)
 */
export function strictAnswer(text: string | Uint8Array): Result {
  let v: JsonValue;
  try {
    v = parseStrict(text, ANSWER_DEPTH, { bigNumbers: true });
  } catch (err) {
    throw new ReceiptError("invalid", `the answer: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (v === null || typeof v !== "object" || Array.isArray(v)) {
    throw new ReceiptError("invalid", "the answer is not a JSON object");
  }
  return v as unknown as Result;
}

/**
 * Checks an answer's receipt: its signature, and that it records this
 * answer — not another operation's, nor another outcome.
 *
 * @param res - the answer
 * @param keys - the trusted keys
 * @returns the receipt
 * @throws {@link ReceiptError} (`no_receipt`, `invalid`, `bad_signature`, `unknown_signer`, `key_not_valid`, `mismatch`)
 */
export function verifyReceipt(res: Result, keys: KeySet): JsonObject {
  if (res.receipt === undefined || res.receipt === null) {
    throw new ReceiptError("no_receipt", `the ${res.status} answer of ${res.key} carries no receipt`);
  }
  const ev = verifyEvent(res.receipt, keys);
  const differs = (what: string, got: unknown, want: unknown): void => {
    if (got !== want) {
      throw new ReceiptError("mismatch", `${res.key}: its ${what} is ${JSON.stringify(got)}, the answer's ${JSON.stringify(want)}`);
    }
  };
  const conflict = res.status === "conflict";
  const done = res.status === "already_done"; // reports a completion: its receipt is the completion's, its error (the refusal) unbound
  differs("kind", ev.kind, conflict ? "conflict" : "outcome");
  if (ev.key !== res.key && ev.key !== ledgerKey(res.key, LAYOUT_COMPACT)) {
    throw new ReceiptError("mismatch", `${res.key}: it is of key ${JSON.stringify(ev.key)}`);
  }
  differs("fingerprint", ev.fingerprint ?? "", res.fingerprint ?? "");
  differs("status", ev.status, done ? "completed" : res.status);
  if (conflict) {
    differs("record fingerprint", ev.record_fingerprint ?? "", res.record_fingerprint ?? "");
  } else {
    differs("attempts", ev.attempts ?? 0, res.attempts ?? 0);
    differs("attempt", ev.attempt ?? 0, res.attempt ?? 0);
  }
  differs("intent sequence", ev.intent_seq ?? 0, res.intent_seq ?? 0);
  let completed: bigint | undefined;
  try {
    completed = nanos(res.completed_at);
  } catch {
    completed = undefined;
  }
  if (completed === undefined || nanos(ev.at) !== completed) {
    throw new ReceiptError("mismatch", `${res.key}: it is of ${String(ev.at)}, the answer was completed at ${String(res.completed_at)}`);
  }
  differs("result digest", ev.result_digest ?? "", res.result !== undefined ? resultDigest(res.result) : "");
  differs("error digest", ev.error_digest ?? "", res.error !== undefined && !done ? errorDigest(res.error) : "");
  return ev;
}
