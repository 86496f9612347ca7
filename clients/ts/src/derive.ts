/**
 * Key and fingerprint derivation (docs/protocol.md, sections 3 and 4).
 *
 * @module
 */

import { createHash } from "node:crypto";
import canonicalize from "canonicalize";

import { checkEnvelope, parseRFC3339, type Envelope } from "./envelope.js";
import { InvalidIntentError, InvalidSpecError } from "./errors.js";
import { setMember, type JsonObject, type JsonValue } from "./json.js";

/**
 * How a tool derives keys and fingerprints, with the names the tool
 * catalogue and the test vectors use. The empty spec `{}` derives the key
 * from all args, with no window.
 */
export interface KeySpec {
  /** The distinguishing args: when non-empty only these top-level args enter the key. Default: all args. */
  key_args?: readonly string[];
  /** When positive, a whole number of seconds: the key is scoped to floor(t / window_seconds). Default: 0, no window. */
  window_seconds?: number;
  /** Top-level args that are not part of the operation's identity (timestamps, trace ids): left out of the key material and the fingerprint. Default: none. */
  volatile_args?: readonly string[];
}

/** What derivation yields for one intent. */
export interface Identity {
  /** `<tool>.` followed by the 64 lowercase hex digits of sha256(material). */
  key: string;
  /** hex(sha256(JCS({tool, session, args minus volatile_args}))). */
  fingerprint: string;
  /** The RFC 8785 canonical key material whose SHA-256 is the key's hex part. */
  material: string;
}

/** The "v" member of every key material. */
const MATERIAL_VERSION = 1;

/** 2^53, the largest magnitude of a window number. */
const MAX_WINDOW = 2 ** 53;

/**
 * Derives the key and fingerprint of an intent exactly as the workers do.
 *
 * The material is `{"v":1,"tool":T,"session":S,"args":A}` (`S` is `""` when
 * absent; `A` the whole args, or only the `key_args` members present, minus
 * `volatile_args`), plus
 * `"window": floor(t / window_seconds)` for a window tool, where `t` is
 * `created_at` in Unix seconds, else `msgTime`; with a key override it is
 * `{"v":1,"tool":T,"session":S,"key":K}` instead. The key is
 * `T + "." + hex(sha256(JCS(material)))`. The fingerprint is
 * `hex(sha256(JCS({"tool":T,"session":S,"args":F})))`, `F` being the args
 * minus `volatile_args`.
 *
 * The envelope is checked first ({@link checkEnvelope}). Numbers are
 * JavaScript doubles: an integer above 2^53 in source code or in
 * `JSON.parse`d text has already been rounded and cannot be detected here,
 * so read envelope text with {@link parseEnvelope} and send big identifiers
 * as strings.
 *
 * @param env - the envelope (not modified)
 * @param spec - the tool's key spec (see {@link IdemClient.tools})
 * @param msgTime - the JetStream message time, used by a window tool when the envelope has no `created_at` (a `Date` or an RFC 3339 string)
 * @returns the key, fingerprint and canonical material
 * @throws {@link InvalidIntentError} for an envelope a worker would reject, or a window tool with neither time; {@link InvalidSpecError} for a bad window
 */
export function deriveKey(env: Envelope, spec: KeySpec = {}, msgTime?: Date | string): Identity {
  checkEnvelope(env);
  const material = canonical(buildMaterial(env, spec, msgTime));
  const fp: JsonObject = {
    tool: env.tool,
    session: env.session ?? "",
    args: pick(env.args, (name) => !(spec.volatile_args ?? []).includes(name)),
  };
  return {
    key: `${env.tool}.${sha256hex(material)}`,
    fingerprint: sha256hex(canonical(fp)),
    material,
  };
}

/**
 * Canonicalizes a JSON value with RFC 8785 (JCS).
 *
 * @param v - a JSON value (checked by the caller)
 * @returns the canonical text
 */
export function canonical(v: JsonValue): string {
  const s = canonicalize(v);
  if (s === undefined) {
    throw new InvalidIntentError("the value has no JSON form");
  }
  return s;
}

function buildMaterial(env: Envelope, spec: KeySpec, msgTime: Date | string | undefined): JsonObject {
  const window = checkSpec(spec);
  const m: JsonObject = { v: MATERIAL_VERSION, tool: env.tool, session: env.session ?? "" };
  if (env.key !== undefined) {
    m["key"] = env.key;
    return m;
  }
  const keyArgs = spec.key_args ?? [];
  const volatile = spec.volatile_args ?? [];
  // A volatile arg is not part of the operation's identity: it leaves the
  // key material as it leaves the fingerprint.
  setMember(
    m,
    "args",
    pick(env.args, (name) => (keyArgs.length === 0 || keyArgs.includes(name)) && !volatile.includes(name)),
  );
  if (window > 0) {
    const t = creationTime(env, msgTime);
    const w = Math.floor(t / window);
    if (Math.abs(w) > MAX_WINDOW) {
      throw new InvalidIntentError(`window number ${w} is beyond ±2^53`);
    }
    m["window"] = w;
  }
  return m;
}

/** Validates spec and returns its window in seconds (0: none). */
function checkSpec(spec: KeySpec): number {
  const w = spec.window_seconds ?? 0;
  if (!Number.isSafeInteger(w) || w < 0) {
    throw new InvalidSpecError(
      `window_seconds ${w} is not a whole number of seconds (at least 1); use 0 for no window`,
    );
  }
  return w;
}

/** The intent's creation time in whole Unix seconds (floored). */
function creationTime(env: Envelope, msgTime: Date | string | undefined): number {
  if (env.created_at !== undefined) {
    return parseRFC3339(env.created_at);
  }
  if (msgTime instanceof Date) {
    const ms = msgTime.getTime();
    if (!Number.isFinite(ms)) {
      throw new InvalidIntentError("the message time is an invalid Date");
    }
    return Math.floor(ms / 1000);
  }
  if (typeof msgTime === "string" && msgTime !== "") {
    return parseRFC3339(msgTime);
  }
  throw new InvalidIntentError(
    `tool ${JSON.stringify(env.tool)} is keyed by a time window and the intent has no created_at or message time`,
  );
}

/** The members of o whose names pass keep, in o's order. */
function pick(o: JsonObject, keep: (name: string) => boolean): JsonObject {
  const out: JsonObject = {};
  for (const name of Object.keys(o)) {
    if (keep(name)) {
      setMember(out, name, o[name] as JsonValue);
    }
  }
  return out;
}

function sha256hex(s: string): string {
  return createHash("sha256").update(s, "utf8").digest("hex");
}
