/**
 * The idemgate client for TypeScript and JavaScript: derive an operation's
 * key exactly as the workers do, publish tool intents, and wait for their
 * answers. The protocol is docs/protocol.md of the idemgate repository.
 *
 * @packageDocumentation
 */

export { ALREADY_DONE, ANSWERED_STATUSES, FINAL_STATUSES, isAlreadyDone, isAnswered, isFinal } from "./answer.js";
export { BadReceiptError, errorDigest, KeySet, ReceiptError, receipted, recordReceipt, resultDigest, strictAnswer, verifyEvent, verifyReceipt, verifyReceiptText } from "./audit.js";
export type { PublicKeyInfo, ReceiptErrorKind } from "./audit.js";
export type { ErrorInfo, LedgerRecord, RecordDecision, RecordSignature, Result, Status } from "./answer.js";
export {
  DEFAULT_CATALOG_TIMEOUT_MS,
  DEFAULT_PREFIX,
  DEFAULT_REPLY_GRACE_MS,
  DEFAULT_WAIT_MS,
  HEADER_FINGERPRINT,
  HEADER_INTENT_SEQ,
  HEADER_KEY,
  HEADER_REPLY_TO,
  HEADER_SUBMISSION,
  IdemClient,
  answerBound,
  answerMatches,
  names,
  Submission,
} from "./client.js";
export type { Catalog, ClientOptions, ConnectOptions, DeadLetter, Names, ToolInfo } from "./client.js";
export { encodeDecision } from "./decide.js";
export type { Decision, DecisionOp } from "./decide.js";
export { canonical, deriveKey } from "./derive.js";
export { LAYOUT_COMPACT, LAYOUT_FULL, LAYOUT_METADATA, ledgerKey, validLayout } from "./layout.js";
export { MAX_PARTITIONS, PARTITIONS_METADATA, partition, partitionBucket, validPartitions } from "./partition.js";
export type { Identity, KeySpec } from "./derive.js";
export {
  checkEnvelope,
  DEFAULT_MAX_BYTES,
  DEFAULT_MAX_DEPTH,
  encodeEnvelope,
  MAX_KEY_BYTES,
  parseEnvelope,
  parseRFC3339,
  validTool,
} from "./envelope.js";
export type { Envelope, Limits } from "./envelope.js";
export { IdemError, InvalidIntentError, InvalidSpecError, NoAnswerError, NotFoundError, TooLargeError } from "./errors.js";
export { parseStrict } from "./json.js";
export type { JsonObject, JsonPrimitive, JsonValue } from "./json.js";
