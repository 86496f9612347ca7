/**
 * The intent envelope (docs/protocol.md, section 1): its type, the strict
 * reader of envelope text, and the checks a hand-built envelope must pass
 * before it is published.
 *
 * @module
 */

import { InvalidIntentError, TooLargeError } from "./errors.js";
import { clip, MAX_SAFE_MAGNITUDE, parseStrict, setMember, type JsonObject, type JsonValue } from "./json.js";

/**
 * One tool intent, as published on `idem.intents.<tool>`. Field names are
 * the wire names; an object with any other field is rejected.
 */
export interface Envelope {
  /** The tool; matches `^[a-z0-9_-]{1,64}$`. Required. */
  tool: string;
  /** The tool's arguments, a JSON object (`{}` when there are none). Required. */
  args: JsonObject;
  /** The scope of the key (a run, a conversation, a tenant). Absent and `""` are the same scope. */
  session?: string;
  /** Overrides what the key is derived from: 1 to 256 bytes of UTF-8. */
  key?: string;
  /** The model's `tool_call_id`; informational, never part of a key or fingerprint. */
  call_id?: string;
  /** RFC 3339 creation time, used only by window tools. */
  created_at?: string;
}

/** Limits {@link parseEnvelope} applies; every field has the workers' default. */
export interface Limits {
  /** The largest envelope in bytes. Default: {@link DEFAULT_MAX_BYTES} (256 KiB). */
  maxBytes?: number;
  /** The deepest nesting, the envelope itself being depth 1. Default: {@link DEFAULT_MAX_DEPTH} (32). */
  maxDepth?: number;
}

/** The workers' default size limit of an envelope, in bytes (256 KiB). */
export const DEFAULT_MAX_BYTES = 256 * 1024;

/** The workers' default nesting limit, the envelope itself being depth 1. */
export const DEFAULT_MAX_DEPTH = 32;

/** The longest key override, in bytes of UTF-8. */
export const MAX_KEY_BYTES = 256;

/**
 * The nesting limit {@link checkEnvelope} applies to a hand-built envelope's
 * args (as the Go reference does); workers apply {@link DEFAULT_MAX_DEPTH}.
 */
const MAX_CANONICAL_DEPTH = 1000;

const ENVELOPE_FIELDS = ["tool", "args", "session", "key", "call_id", "created_at"] as const;
const STRING_FIELDS = new Set<string>(["tool", "session", "key", "call_id", "created_at"]);
const TOOL_PATTERN = /^[a-z0-9_-]{1,64}$/;

/**
 * Reports whether `name` is a valid tool name: 1 to 64 characters of
 * `a-z`, `0-9`, `_` and `-`.
 *
 * @param name - the candidate tool name
 * @returns true when valid
 */
export function validTool(name: unknown): name is string {
  return typeof name === "string" && TOOL_PATTERN.test(name);
}

/**
 * Reads envelope text (or its UTF-8 bytes) with the rules a worker applies:
 * the size is checked first, then the text must be one strict JSON object
 * whose members are exactly, case-sensitively, `tool`, `args`, `session`,
 * `key`, `call_id` and `created_at`, each at most once; `tool` and `args` are
 * required; the others are strings when present (`null` is rejected); `key`
 * is 1 to 256 bytes; `created_at` is RFC 3339.
 *
 * Use it rather than `JSON.parse` for envelope text: `JSON.parse` keeps the
 * last of repeated names and silently rounds `9007199254740993` to
 * `9007199254740992`, which would change the operation's key.
 *
 * @param text - the envelope as text or UTF-8 bytes
 * @param limits - size and nesting limits (the workers' defaults when omitted)
 * @returns the envelope
 * @throws {@link TooLargeError} over the size limit; {@link InvalidIntentError} for any other violation
 */
export function parseEnvelope(text: string | Uint8Array, limits: Limits = {}): Envelope {
  const maxBytes = limits.maxBytes !== undefined && limits.maxBytes > 0 ? limits.maxBytes : DEFAULT_MAX_BYTES;
  const maxDepth = limits.maxDepth !== undefined && limits.maxDepth > 0 ? limits.maxDepth : DEFAULT_MAX_DEPTH;
  const size = typeof text === "string" ? Buffer.byteLength(text, "utf8") : text.byteLength;
  if (size > maxBytes) {
    throw new TooLargeError(`the envelope is ${size} bytes, the limit is ${maxBytes}`);
  }
  const root = parseStrict(text, maxDepth);
  if (!isObject(root)) {
    throw new InvalidIntentError(`the envelope must be a JSON object, got ${kindOf(root)}`);
  }
  const env: Partial<Envelope> = {};
  for (const name of Object.keys(root)) {
    const v = root[name] as JsonValue;
    if (name === "args") {
      if (!isObject(v)) {
        throw new InvalidIntentError(`field "args" must be an object, got ${kindOf(v)}`);
      }
      env.args = v;
      continue;
    }
    if (!STRING_FIELDS.has(name)) {
      throw unknownField(name);
    }
    if (typeof v !== "string") {
      const hint = v === null && name !== "tool" ? " (omit the field instead of sending null)" : "";
      throw new InvalidIntentError(`field ${JSON.stringify(name)} must be a string, got ${kindOf(v)}${hint}`);
    }
    setField(env, name, v);
  }
  if (env.tool === undefined) {
    throw new InvalidIntentError(`field "tool" is required`);
  }
  if (env.args === undefined) {
    throw new InvalidIntentError(`field "args" is required (send {} for no arguments)`);
  }
  const full: Envelope = { ...env, tool: env.tool, args: env.args };
  checkFields(full);
  return full;
}

function setField(env: Partial<Envelope>, name: string, v: string): void {
  switch (name) {
    case "tool":
      env.tool = v;
      break;
    case "session":
      env.session = v;
      break;
    case "key":
      env.key = v;
      break;
    case "call_id":
      env.call_id = v;
      break;
    case "created_at":
      env.created_at = v;
      break;
  }
}

/**
 * Applies the protocol's rules to a possibly hand-built envelope, as a worker
 * would to its JSON: only the six fields; `tool` valid; `args` a plain
 * object of JSON values (no `undefined`, functions, symbols, `bigint`,
 * class instances or cycles); numbers finite and within ±2^53; strings well
 * formed (no lone surrogates); optional fields strings when present; `key`
 * 1 to 256 bytes; `created_at` RFC 3339.
 *
 * A number in a JavaScript value has already been rounded to a double, so
 * `9007199254740993` written in source code arrives as `2^53` and passes;
 * read envelope text with {@link parseEnvelope} to catch it, and keep big
 * identifiers in strings.
 *
 * @param env - the envelope to check
 * @throws {@link InvalidIntentError} naming the first violation
 */
export function checkEnvelope(env: unknown): asserts env is Envelope {
  if (!isPlainObject(env)) {
    throw new InvalidIntentError("the envelope must be an object");
  }
  for (const name of Object.keys(env)) {
    if (!(ENVELOPE_FIELDS as readonly string[]).includes(name)) {
      throw unknownField(name);
    }
    const v = env[name];
    if (name === "args") {
      continue;
    }
    if (v === undefined) {
      continue; // an absent field
    }
    if (typeof v !== "string") {
      throw new InvalidIntentError(`field ${JSON.stringify(name)} must be a string, got ${describeJS(v)}`);
    }
  }
  if (!("tool" in env) || env["tool"] === undefined) {
    throw new InvalidIntentError(`field "tool" is required`);
  }
  if (!("args" in env) || env["args"] === undefined) {
    throw new InvalidIntentError(`field "args" is required (send {} for no arguments)`);
  }
  const args = env["args"];
  if (!isPlainObject(args)) {
    throw new InvalidIntentError(`field "args" must be an object, got ${describeJS(args)}`);
  }
  checkValue(args, "args", 2, new Set());
  checkFields(env as unknown as Envelope);
}

/** The string-field rules shared by parseEnvelope and checkEnvelope. */
function checkFields(env: Envelope): void {
  if (!validTool(env.tool)) {
    throw new InvalidIntentError(`field "tool": ${JSON.stringify(clip(env.tool))} must match [a-z0-9_-]{1,64}`);
  }
  for (const name of ["session", "key", "call_id", "created_at"] as const) {
    const v = env[name];
    if (v !== undefined && !v.isWellFormed()) {
      throw new InvalidIntentError(`field ${JSON.stringify(name)} holds a lone surrogate`);
    }
  }
  for (const name of ["session", "call_id"] as const) {
    const v = env[name];
    if (v !== undefined) {
      checkHeaderText(name, v);
    }
  }
  if (env.key !== undefined) {
    checkKeyOverride(env.key);
  }
  if (env.created_at !== undefined) {
    parseRFC3339(env.created_at);
  }
}

/**
 * Refuses a control character (Unicode Cc: U+0000 to U+001F, U+007F to
 * U+009F) in `session` or `call_id`: effects forward both as header values,
 * where none can go (docs/protocol.md, 1).
 */
function checkHeaderText(name: string, v: string): void {
  let i = 0;
  for (const ch of v) {
    const c = ch.codePointAt(0)!;
    if (c <= 0x1f || (c >= 0x7f && c <= 0x9f)) {
      const hex = c.toString(16).toUpperCase().padStart(4, "0");
      throw new InvalidIntentError(`field ${JSON.stringify(name)} holds the control character U+${hex} at byte ${i}: it is sent as a header value, which holds none`);
    }
    i += Buffer.byteLength(ch);
  }
}

function checkKeyOverride(k: string): void {
  if (k === "") {
    throw new InvalidIntentError(`field "key" is empty: omit it to derive the key from the args`);
  }
  const n = Buffer.byteLength(k, "utf8");
  if (n > MAX_KEY_BYTES) {
    throw new InvalidIntentError(`field "key" is ${n} bytes, the limit is ${MAX_KEY_BYTES}`);
  }
}

/** Checks that v is JSON the protocol accepts; path names it in messages. */
function checkValue(v: unknown, path: string, depth: number, seen: Set<object>): void {
  switch (typeof v) {
    case "string":
      if (!v.isWellFormed()) {
        throw new InvalidIntentError(`${path} holds a lone surrogate, which RFC 8785 cannot canonicalize`);
      }
      return;
    case "boolean":
      return;
    case "number":
      if (!Number.isFinite(v)) {
        throw new InvalidIntentError(`${path} is ${v}: only finite numbers are JSON`);
      }
      if (Math.abs(v) > MAX_SAFE_MAGNITUDE) {
        throw new InvalidIntentError(
          `${path} is ${v}, beyond ±2^53 (9007199254740992) and not exact; send big identifiers as strings`,
        );
      }
      return;
    case "object":
      break;
    default:
      throw new InvalidIntentError(
        `${path} is ${describeJS(v)}, not a JSON value` +
          (typeof v === "bigint" ? " (send big integers as strings)" : ""),
      );
  }
  if (v === null) {
    return;
  }
  if (depth > MAX_CANONICAL_DEPTH) {
    throw new InvalidIntentError(`${path}: nesting deeper than ${MAX_CANONICAL_DEPTH}`);
  }
  if (seen.has(v)) {
    throw new InvalidIntentError(`${path} refers back to itself: JSON has no cycles`);
  }
  seen.add(v);
  if (Array.isArray(v)) {
    v.forEach((e: unknown, i) => checkValue(e, `${path}[${i}]`, depth + 1, seen));
  } else if (isPlainObject(v)) {
    for (const name of Object.keys(v)) {
      if (!name.isWellFormed()) {
        throw new InvalidIntentError(`${path} has a member name with a lone surrogate`);
      }
      checkValue(v[name], `${path}.${name}`, depth + 1, seen);
    }
  } else {
    throw new InvalidIntentError(`${path} is ${describeJS(v)}, not a plain JSON object or array`);
  }
  seen.delete(v);
}

/** Reports whether v is an object created by `{}`, `Object.create(null)` or JSON parsing. */
function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    return false;
  }
  const proto: unknown = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

function isObject(v: JsonValue): v is JsonObject {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function kindOf(v: JsonValue): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  switch (typeof v) {
    case "string":
      return "a string";
    case "number":
      return "a number";
    case "boolean":
      return "a boolean";
    default:
      return "an object";
  }
}

function describeJS(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  if (typeof v === "object") {
    const proto: unknown = Object.getPrototypeOf(v);
    const ctor = proto !== null && typeof proto === "object" ? (proto as { constructor?: { name?: string } }).constructor?.name : undefined;
    return ctor !== undefined && ctor !== "Object" ? `a ${ctor}` : "an object";
  }
  return typeof v === "undefined" ? "undefined" : `a ${typeof v}`;
}

function unknownField(name: string): InvalidIntentError {
  const same = ENVELOPE_FIELDS.find((f) => f.toLowerCase() === name.toLowerCase());
  if (same !== undefined) {
    return new InvalidIntentError(
      `unknown field ${JSON.stringify(clip(name))} (field names are case-sensitive: use ${JSON.stringify(same)})`,
    );
  }
  return new InvalidIntentError(`unknown field ${JSON.stringify(clip(name))} (the fields are ${ENVELOPE_FIELDS.join(", ")})`);
}

/**
 * Serializes an envelope as the protocol's JSON object, for publishing:
 * `tool`, `args`, then the optional fields that are set.
 *
 * @param env - a checked envelope
 * @returns the JSON text
 */
export function encodeEnvelope(env: Envelope): string {
  const out: JsonObject = { tool: env.tool };
  setMember(out, "args", env.args);
  for (const name of ["session", "key", "call_id", "created_at"] as const) {
    const v = env[name];
    if (v !== undefined && v !== "") {
      out[name] = v;
    }
  }
  return JSON.stringify(out);
}

const RFC3339 =
  /^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?(Z|([+-])([0-9]{2}):([0-9]{2}))$/;

/** Seconds from 0001-01-01T00:00:00Z to the Unix epoch, negated: the zero time of Go and of the protocol. */
const ZERO_TIME_UNIX = -62135596800;

/**
 * Parses an RFC 3339 time (`YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, `T` and
 * `Z` upper case, a real calendar date) and returns its Unix time in whole
 * seconds, rounded toward negative infinity.
 *
 * @param s - the time
 * @returns Unix seconds
 * @throws {@link InvalidIntentError} when s is not such a time
 */
export function parseRFC3339(s: string): number {
  const bad = (): InvalidIntentError =>
    new InvalidIntentError(
      `field "created_at": ${JSON.stringify(clip(s))} is not an RFC 3339 time such as 2025-01-02T15:04:05Z`,
    );
  const m = RFC3339.exec(s);
  if (m === null) {
    throw bad();
  }
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number) as [number, number, number, number, number, number];
  if (month < 1 || month > 12 || day < 1 || day > daysIn(year, month) || hour > 23 || minute > 59 || second > 59) {
    throw bad();
  }
  let offset = 0;
  if (m[8] !== "Z") {
    const oh = Number(m[10]);
    const om = Number(m[11]);
    if (oh > 23 || om > 59) {
      throw bad();
    }
    offset = (m[9] === "-" ? -1 : 1) * (oh * 3600 + om * 60);
  }
  const unix = daysFromCivil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - offset;
  const fractionZero = m[7] === undefined || /^\.0+$/.test(m[7]);
  if (unix === ZERO_TIME_UNIX && fractionZero) {
    throw new InvalidIntentError(`field "created_at": ${JSON.stringify(s)} is the zero time; omit the field instead`);
  }
  return unix;
}

function daysIn(year: number, month: number): number {
  if (month === 2) {
    const leap = (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0;
    return leap ? 29 : 28;
  }
  return [4, 6, 9, 11].includes(month) ? 30 : 31;
}

/** Days from 1970-01-01 to the proleptic Gregorian date y-m-d (H. Hinnant's algorithm). */
function daysFromCivil(y: number, m: number, d: number): number {
  const yy = m <= 2 ? y - 1 : y;
  const era = Math.floor(yy / 400);
  const yoe = yy - era * 400;
  const mp = (m + 9) % 12;
  const doy = Math.floor((153 * mp + 2) / 5) + d - 1;
  const doe = yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy;
  return era * 146097 + doe - 719468;
}
