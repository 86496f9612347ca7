/**
 * A strict JSON reader with the protocol's rules (docs/protocol.md, section 1):
 * exactly one value, no repeated member names, valid UTF-8 only, no lone
 * surrogate escapes, no number beyond ±2^53 or beyond the double range, and a
 * nesting limit. `JSON.parse` accepts all of those silently (a repeated name
 * keeps the last value; `9007199254740993` becomes `9007199254740992`), so
 * envelope text is read with this instead.
 *
 * @module
 */

import { InvalidIntentError } from "./errors.js";

/** A JSON scalar. */
export type JsonPrimitive = string | number | boolean | null;

/** Any JSON value. */
export type JsonValue = JsonPrimitive | JsonValue[] | JsonObject;

/** A JSON object. */
export interface JsonObject {
  [name: string]: JsonValue;
}

/** 2^53: every integer of at most this magnitude is exact in a double. */
export const MAX_SAFE_MAGNITUDE = 2 ** 53;

const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * Decodes bytes as strict UTF-8 (invalid sequences, including encoded
 * surrogates, are an error).
 *
 * @param data - the bytes
 * @returns the text
 * @throws {@link InvalidIntentError} when data is not valid UTF-8
 */
export function decodeUTF8(data: Uint8Array): string {
  try {
    return decoder.decode(data);
  } catch {
    throw new InvalidIntentError("invalid UTF-8");
  }
}

/**
 * Parses `text` as exactly one JSON value under the protocol's rules, with
 * objects and arrays nested at most `maxDepth` deep (the outermost container
 * is depth 1). Objects come back as plain objects whose members keep their
 * input order; a member named `__proto__` is an ordinary own property.
 *
 * @param text - JSON text, or its UTF-8 bytes
 * @param maxDepth - the nesting limit
 * @returns the value
 * @throws {@link InvalidIntentError} for any violation, with its offset
 */
export function parseStrict(text: string | Uint8Array, maxDepth: number, opts: StrictOptions = {}): JsonValue {
  const s = typeof text === "string" ? text : decodeUTF8(text);
  if (!s.isWellFormed()) {
    throw new InvalidIntentError("the text holds a lone surrogate, which is not valid UTF-8");
  }
  const p = new Parser(s, maxDepth, opts.bigNumbers === true);
  p.skipSpace();
  const v = p.value(0);
  p.skipSpace();
  if (p.pos < s.length) {
    throw p.error(`unexpected ${p.describe()} after the JSON value`);
  }
  return v;
}

/** Options of {@link parseStrict}. */
export interface StrictOptions {
  /**
   * Read a number beyond ±2^53 (or beyond the double range) as `Infinity`
   * or `-Infinity`, which has no canonical form, instead of refusing it:
   * for an answer, whose result may hold one (its receipt leaves it
   * unbound). Default: refused.
   */
  bigNumbers?: boolean;
}

/** Defines an own, enumerable member on o, even one named `__proto__`. */
export function setMember(o: JsonObject, name: string, v: JsonValue): void {
  Object.defineProperty(o, name, { value: v, enumerable: true, writable: true, configurable: true });
}

class Parser {
  pos = 0;

  constructor(
    readonly s: string,
    readonly maxDepth: number,
    readonly bigNumbers = false,
  ) {}

  error(msg: string, at = this.pos): InvalidIntentError {
    return new InvalidIntentError(`invalid JSON at offset ${at}: ${msg}`);
  }

  describe(): string {
    if (this.pos >= this.s.length) {
      return "end of input";
    }
    const c = this.s.charCodeAt(this.pos);
    if (c >= 0x20 && c < 0x7f) {
      return `character ${JSON.stringify(this.s[this.pos])}`;
    }
    return `character U+${c.toString(16).padStart(4, "0")}`;
  }

  skipSpace(): void {
    while (this.pos < this.s.length) {
      const c = this.s[this.pos];
      if (c !== " " && c !== "\t" && c !== "\n" && c !== "\r") {
        return;
      }
      this.pos++;
    }
  }

  value(depth: number): JsonValue {
    if (this.pos >= this.s.length) {
      throw this.error("unexpected end of input, expected a value");
    }
    const c = this.s[this.pos] as string;
    switch (c) {
      case "{":
        return this.object(depth + 1);
      case "[":
        return this.array(depth + 1);
      case '"':
        return this.string();
      case "t":
        return this.literal("true", true);
      case "f":
        return this.literal("false", false);
      case "n":
        return this.literal("null", null);
      default:
        if (c === "-" || (c >= "0" && c <= "9")) {
          return this.number();
        }
        throw this.error(`unexpected ${this.describe()}, expected a value`);
    }
  }

  literal<T extends JsonPrimitive>(word: string, v: T): T {
    if (!this.s.startsWith(word, this.pos)) {
      throw this.error(`invalid literal, expected ${word}`);
    }
    this.pos += word.length;
    return v;
  }

  object(depth: number): JsonObject {
    if (depth > this.maxDepth) {
      throw this.error(`nesting deeper than ${this.maxDepth}`);
    }
    this.pos++; // '{'
    const o: JsonObject = {};
    this.skipSpace();
    if (this.s[this.pos] === "}") {
      this.pos++;
      return o;
    }
    const seen = new Set<string>();
    for (;;) {
      if (this.s[this.pos] !== '"') {
        throw this.error(`unexpected ${this.describe()}, expected a member name`);
      }
      const at = this.pos;
      const name = this.string();
      if (seen.has(name)) {
        throw this.error(`member name ${JSON.stringify(name)} repeated`, at);
      }
      seen.add(name);
      this.skipSpace();
      if (this.s[this.pos] !== ":") {
        throw this.error(`unexpected ${this.describe()}, expected ':' after a member name`);
      }
      this.pos++;
      this.skipSpace();
      setMember(o, name, this.value(depth));
      this.skipSpace();
      const c = this.s[this.pos];
      if (c === ",") {
        this.pos++;
        this.skipSpace();
      } else if (c === "}") {
        this.pos++;
        return o;
      } else {
        throw this.error(`unexpected ${this.describe()}, expected ',' or '}'`);
      }
    }
  }

  array(depth: number): JsonValue[] {
    if (depth > this.maxDepth) {
      throw this.error(`nesting deeper than ${this.maxDepth}`);
    }
    this.pos++; // '['
    const a: JsonValue[] = [];
    this.skipSpace();
    if (this.s[this.pos] === "]") {
      this.pos++;
      return a;
    }
    for (;;) {
      a.push(this.value(depth));
      this.skipSpace();
      const c = this.s[this.pos];
      if (c === ",") {
        this.pos++;
        this.skipSpace();
      } else if (c === "]") {
        this.pos++;
        return a;
      } else {
        throw this.error(`unexpected ${this.describe()}, expected ',' or ']'`);
      }
    }
  }

  string(): string {
    this.pos++; // opening quote
    let out = "";
    let start = this.pos;
    for (;;) {
      if (this.pos >= this.s.length) {
        throw this.error("unexpected end of input inside a string");
      }
      const c = this.s.charCodeAt(this.pos);
      if (c === 0x22) {
        out += this.s.slice(start, this.pos);
        this.pos++;
        return out;
      }
      if (c === 0x5c) {
        out += this.s.slice(start, this.pos);
        out += this.escape();
        start = this.pos;
      } else if (c < 0x20) {
        throw this.error(`control character U+${c.toString(16).padStart(4, "0")} in a string must be escaped`);
      } else {
        this.pos++;
      }
    }
  }

  escape(): string {
    const at = this.pos;
    const c = this.s[this.pos + 1];
    this.pos += 2;
    switch (c) {
      case '"':
      case "\\":
      case "/":
        return c;
      case "b":
        return "\b";
      case "f":
        return "\f";
      case "n":
        return "\n";
      case "r":
        return "\r";
      case "t":
        return "\t";
      case "u": {
        const hi = this.hex4(at);
        if (hi >= 0xdc00 && hi <= 0xdfff) {
          throw this.error(`lone surrogate escape \\u${hex(hi)} (a low surrogate with no high surrogate before it)`, at);
        }
        if (hi < 0xd800 || hi > 0xdbff) {
          return String.fromCharCode(hi);
        }
        const lowAt = this.pos;
        if (this.s[this.pos] !== "\\" || this.s[this.pos + 1] !== "u") {
          throw this.error(`lone surrogate escape \\u${hex(hi)} (a high surrogate not followed by a \\u low surrogate)`, at);
        }
        this.pos += 2;
        const lo = this.hex4(lowAt);
        if (lo < 0xdc00 || lo > 0xdfff) {
          throw this.error(`lone surrogate escape \\u${hex(hi)} (followed by \\u${hex(lo)}, not a low surrogate)`, at);
        }
        return String.fromCharCode(hi, lo);
      }
      case undefined:
        throw this.error("unexpected end of input in an escape sequence", at);
      default:
        throw this.error(`invalid escape sequence ${JSON.stringify("\\" + c)}`, at);
    }
  }

  hex4(at: number): number {
    const digits = this.s.slice(this.pos, this.pos + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(digits)) {
      throw this.error("invalid \\u escape, expected four hex digits", at);
    }
    this.pos += 4;
    return parseInt(digits, 16);
  }

  number(): number {
    const start = this.pos;
    const m = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
    m.lastIndex = start;
    const found = m.exec(this.s);
    if (found === null) {
      throw this.error(`invalid number`);
    }
    this.pos = start + found[0].length;
    const next = this.s[this.pos];
    if (next !== undefined && /[0-9.eE+-]/.test(next)) {
      throw this.error(`invalid number`);
    }
    const lit = found[0];
    const f = Number(lit);
    if (this.bigNumbers && (!Number.isFinite(f) || Math.abs(f) > MAX_SAFE_MAGNITUDE || (Math.abs(f) === MAX_SAFE_MAGNITUDE && exceedsSafe(lit)))) {
      return lit.startsWith("-") ? -Infinity : Infinity;
    }
    if (!Number.isFinite(f)) {
      throw this.error(`number ${clip(lit)} is beyond the range of a double`, start);
    }
    const a = Math.abs(f);
    if (a > MAX_SAFE_MAGNITUDE || (a === MAX_SAFE_MAGNITUDE && exceedsSafe(lit))) {
      throw this.error(
        `number ${clip(lit)} is beyond ±2^53 (9007199254740992) and cannot be kept exactly; send big identifiers as strings`,
        start,
      );
    }
    return f;
  }
}

function hex(n: number): string {
  return n.toString(16).padStart(4, "0");
}

/** Shortens a long literal for an error message. */
export function clip(s: string): string {
  return s.length > 40 ? s.slice(0, 37) + "..." : s;
}

/**
 * Reports whether the exact decimal value of the well-formed number literal
 * `lit` has a magnitude above 2^53. Needed only when `lit` rounds to ±2^53,
 * where rounding hides a value just above it (such as 9007199254740993).
 */
function exceedsSafe(lit: string): boolean {
  const unsigned = lit.startsWith("-") ? lit.slice(1) : lit;
  const [mant = "", exp] = unsigned.toLowerCase().split("e");
  const [intPart = "", frac = ""] = mant.split(".");
  let digits = intPart + frac;
  // value = 0.digits × 10^point
  let point = intPart.length;
  if (exp !== undefined) {
    const e = Number(exp);
    if (!Number.isSafeInteger(e)) {
      return true;
    }
    point += e;
  }
  const trimmed = digits.replace(/^0+/, "");
  point -= digits.length - trimmed.length;
  digits = trimmed.replace(/0+$/, "");
  const safe = "9007199254740992"; // 2^53 = 0.9007199254740992 × 10^16
  if (point !== 16) {
    return point > 16;
  }
  return digits > safe;
}
