/**
 * Answers and ledger records (docs/protocol.md, sections 5 and 6).
 *
 * @module
 */

import type { JsonObject, JsonValue } from "./json.js";

/**
 * The state of an answer or a ledger record. `pending`, `approved` and
 * `forgotten` (an operator forgot the operation; the next call runs it
 * again) appear only in the ledger.
 */
export type Status =
  | "pending"
  | "completed"
  | "failed"
  | "conflict"
  | "rejected"
  | "awaiting_approval"
  | "approved"
  | "denied"
  | "uncertain"
  | "already_done"
  | "forgotten";

/** The statuses at which a caller stops waiting. */
export const FINAL_STATUSES: readonly Status[] = ["completed", "failed", "denied", "conflict", "rejected", "already_done"];

/**
 * The status and error code of a repeat of a completed operation whose tool
 * refuses repeats (`on_complete: reject`): nothing ran, and the answer
 * carries the recorded `result`, `completed_at` and `attempts` of what ran.
 */
export const ALREADY_DONE = "already_done";

/**
 * Reports whether `res` is an `already_done` answer (see {@link ALREADY_DONE}).
 *
 * @param res - an answer
 * @returns true when the operation ran before and its tool refused the repeat
 */
export function isAlreadyDone(res: Pick<Result, "status" | "error">): boolean {
  return res.status === ALREADY_DONE || res.error?.code === ALREADY_DONE;
}

/** Every status a caller is answered with: the final ones, plus `awaiting_approval` and `uncertain`. */
export const ANSWERED_STATUSES: readonly Status[] = [...FINAL_STATUSES, "awaiting_approval", "uncertain"];

/**
 * Reports whether a caller stops waiting at `status`.
 *
 * @param status - a status
 * @returns true for completed, failed, denied, conflict, rejected and already_done
 */
export function isFinal(status: string): boolean {
  return (FINAL_STATUSES as readonly string[]).includes(status);
}

/**
 * Reports whether a ledger record in `status` answers a caller: every final
 * status, and `awaiting_approval` and `uncertain` (the caller may keep
 * watching those).
 *
 * @param status - a status
 * @returns true when the record is an answer
 */
export function isAnswered(status: string): boolean {
  return (ANSWERED_STATUSES as readonly string[]).includes(status);
}

/** The error half of an answer. */
export interface ErrorInfo {
  /** One of the protocol's error codes (docs/protocol.md section 5): invalid_intent, unknown_tool, tool_mismatch, too_large, conflict, key_mismatch, effect_failed, denied, uncertain, wrong_state, not_found, rate_limited, already_done. */
  code: string;
  /** A human-readable explanation. */
  message: string;
}

/** The answer every caller of an operation receives. */
export interface Result {
  /** The key (empty when the intent could not be read). */
  key: string;
  /** The tool (empty when unknown). */
  tool: string;
  /** The outcome. */
  status: Status;
  /** True exactly when the answer reports an outcome a different call caused (a rejection or conflict is about this call: false). */
  replayed: boolean;
  /** This intent's fingerprint (for a conflict too; the record's is then `record_fingerprint`). */
  fingerprint?: string;
  /** For a conflict: the fingerprint of the recorded operation the key belongs to. */
  record_fingerprint?: string;
  /** How many times the effect was invoked for this key, retries included (a vanished holder's claim counting as one). */
  attempts: number;
  /** In a final answer: the stream sequence of the intent whose claim recorded the outcome (a conflict's: the refused intent's). Its receipt binds it. */
  intent_seq?: number;
  /** In a final answer: the number of the claim that recorded the outcome (1 for the first, +1 per takeover or retry). Its receipt binds it. */
  attempt?: number;
  /** The effect's result, for `completed`. */
  result?: JsonValue;
  /** What went wrong, for every status that is not a success. */
  error?: ErrorInfo;
  /** The intent's call_id, echoed when it had one. */
  call_id?: string;
  /** RFC 3339 time the outcome was recorded; absent from the non-final answers (awaiting_approval, uncertain). */
  completed_at?: string;
  /** The signed event that recorded the outcome (docs/audit.md): on completed, failed, denied and already_done answers, and on a conflict a worker answered. Verify it with `verifyReceipt`. */
  receipt?: JsonObject;
}

/** One ledger record, the JSON value of a key in the `IDEM_LEDGER` bucket. */
export interface LedgerRecord {
  /** The operation's key, in a ledger of layout 2 (docs/protocol.md, 6.2), whose KV keys are not the keys themselves. */
  key?: string;
  /** The record's state. */
  status: Status;
  /** The tool. */
  tool?: string;
  /** The session (tenant scope) of the intent that claimed the key. */
  session?: string;
  /** Fingerprint of the intent that claimed the key. */
  fingerprint: string;
  /** The worker holding (or last holding) the claim. */
  holder?: string;
  /** RFC 3339 deadline of the holder's lease. */
  lease_until?: string;
  /** The current claim's number (1 for the first holder, +1 per takeover). */
  attempt: number;
  /** How many times the effect was invoked, retries included. */
  attempts: number;
  /** The recorded result, once completed. */
  result?: JsonValue;
  /** The recorded error, once failed or denied. */
  error?: ErrorInfo;
  /** Stream sequence of the intent that claimed the key. */
  intent_seq?: number;
  /** The claiming intent's call_id. */
  call_id?: string;
  /** RFC 3339 time of the claim. */
  created_at: string;
  /** RFC 3339 time of the last change. */
  updated_at: string;
  /** The latest operator decision on the key. */
  decision?: RecordDecision;
  /** RFC 3339 time of the terminal outcome. */
  completed_at?: string;
  /** The signed event of a final outcome, whole, as older records keep it; `recordReceipt` gives every record's. */
  receipt?: JsonObject;
  /** What newer records keep of that signed event instead: its signature, which with the record's members gives it back. */
  signature?: RecordSignature;
}

/** An operator's decision, as a ledger record keeps the latest. */
export interface RecordDecision {
  /** approve, deny or resolve (forget, in a forgotten record). */
  op: string;
  /** The operator, as given. */
  by?: string;
  /** The operator's reason, as given. */
  reason?: string;
  /** RFC 3339 time the decision was recorded. */
  at: string;
  /** RFC 3339 time an approval lapses if the firing has not started. */
  until?: string;
}

/**
 * The signature of a final record's outcome event: the event's members the
 * record cannot give, and what signing added.
 */
export interface RecordSignature {
  /** The key the outcome was written under (the operation's, or its compact ledger key). */
  key: string;
  /** The worker that wrote the outcome, when it is not the record's holder. */
  holder?: string;
  /** The signing key's id. */
  signer: string;
  /** The signature, base64url without padding. */
  sig: string;
  /** The Merkle proof, base64url without padding: per step its side (`L` or `R`) and the sibling's 32 bytes. */
  proof?: string;
}

/**
 * Decodes a ledger record, or returns undefined when `data` is not one.
 *
 * @param data - the KV value
 * @returns the record, or undefined
 */
export function decodeRecord(data: Uint8Array): LedgerRecord | undefined {
  try {
    const v: unknown = JSON.parse(new TextDecoder().decode(data));
    if (typeof v !== "object" || v === null || typeof (v as { status?: unknown }).status !== "string") {
      return undefined;
    }
    return v as LedgerRecord;
  } catch {
    return undefined;
  }
}
