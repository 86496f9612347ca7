/**
 * Operator decisions — approve, deny, resolve — as the Go `submit approve|deny|resolve`
 * commands send them: a JSON decision on the control subject, answered by a
 * worker on the reply inbox.
 *
 * @module
 */

import { IdemError } from "./errors.js";
import type { JsonValue } from "./json.js";

/** The decisions an operator may take. */
export type DecisionOp = "approve" | "deny" | "resolve";

/** An operator's decision on one key, as the workers read it. */
export interface Decision {
  /** The operation's key. Required. */
  key: string;
  /** Binds an approval to the arguments the operator saw: it must equal the record's. */
  fingerprint?: string;
  /** Names the operator; recorded. */
  by?: string;
  /** Recorded; for a deny, the callers' error message. */
  reason?: string;
  /** `succeeded` or `failed`: resolve only. */
  outcome?: "succeeded" | "failed";
  /** The operation's result when it succeeded: resolve only. */
  result?: JsonValue;
}

/**
 * Checks a decision as the workers do and encodes it.
 *
 * @param op - approve, deny or resolve
 * @param d - the decision
 * @returns the JSON payload
 * @throws {@link IdemError} (`invalid_decision`) for a decision the workers would reject
 */
export function encodeDecision(op: string, d: Decision): string {
  const bad = (msg: string): never => {
    throw new IdemError("invalid_decision", msg);
  };
  if (op !== "approve" && op !== "deny" && op !== "resolve") {
    bad(`unknown decision ${JSON.stringify(op)}: use approve, deny or resolve`);
  }
  if (typeof d.key !== "string" || d.key === "") {
    bad(`${op} decision: no key`);
  }
  if (op === "resolve" && d.outcome !== "succeeded" && d.outcome !== "failed") {
    bad(`resolve: outcome ${JSON.stringify(d.outcome ?? "")}: use succeeded or failed`);
  }
  if (op !== "resolve" && (d.outcome !== undefined || d.result !== undefined)) {
    bad(`${op} decision: outcome and result belong to resolve`);
  }
  const out: Record<string, unknown> = { key: d.key };
  for (const name of ["fingerprint", "by", "reason", "outcome"] as const) {
    const v = d[name];
    if (v !== undefined && v !== "") {
      out[name] = v;
    }
  }
  if (d.result !== undefined) {
    out["result"] = d.result;
  }
  return JSON.stringify(out);
}
