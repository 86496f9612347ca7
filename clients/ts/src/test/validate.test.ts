/**
 * Validation of hand-built envelopes and key specs: what a worker would
 * reject, the client refuses before publishing.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { checkEnvelope, deriveKey, encodeEnvelope, parseEnvelope, parseRFC3339, type Envelope } from "../index.js";

const ok: Envelope = { tool: "send_email", args: { to: "ada@example.com", subject: "Welcome" }, session: "run-7" };

/** Casts a deliberately malformed value to the envelope type. */
function bad(v: unknown): Envelope {
  return v as Envelope;
}

test("a hand-built envelope derives the same key as its text", () => {
  const fromText = parseEnvelope(encodeEnvelope(ok));
  assert.deepEqual(deriveKey(ok), deriveKey(fromText));
  assert.equal(deriveKey(ok).key, "send_email.ea5b3b5ecc3fa233989582335bb7067cd6c904cb4d46baf4530950de5b22b7f6");
});

test("deriveKey rejects what a worker rejects", () => {
  const cases: [string, Envelope][] = [
    ["tool with a dot", { tool: "Send.Email", args: {} }],
    ["tool too long", { tool: "x".repeat(65), args: {} }],
    ["empty tool", { tool: "", args: {} }],
    ["missing tool", bad({ args: {} })],
    ["missing args", bad({ tool: "noop" })],
    ["null args", bad({ tool: "noop", args: null })],
    ["array args", bad({ tool: "noop", args: [] })],
    ["string args", bad({ tool: "noop", args: "{}" })],
    ["null session", bad({ tool: "noop", args: {}, session: null })],
    ["numeric session", bad({ tool: "noop", args: {}, session: 7 })],
    ["unknown field", bad({ tool: "noop", args: {}, sesion: "x" })],
    ["field in another case", bad({ Tool: "noop", args: {} })],
    ["empty key override", { tool: "noop", args: {}, key: "" }],
    ["key override over 256 bytes", { tool: "noop", args: {}, key: "k".repeat(257) }],
    ["key override over 256 bytes of UTF-8", { tool: "noop", args: {}, key: "é".repeat(129) }],
    ["created_at not RFC 3339", { tool: "noop", args: {}, created_at: "2025-01-06 10:00:00" }],
    ["created_at impossible date", { tool: "noop", args: {}, created_at: "2025-02-30T10:00:00Z" }],
    ["created_at lower-case t", { tool: "noop", args: {}, created_at: "2025-01-06t10:00:00Z" }],
    ["created_at zero time", { tool: "noop", args: {}, created_at: "0001-01-01T00:00:00Z" }],
    ["number beyond 2^53", { tool: "noop", args: { id: 2 ** 53 + 2 } }],
    ["1e21", { tool: "noop", args: { n: 1e21 } }],
    ["NaN", { tool: "noop", args: { n: NaN } }],
    ["Infinity", { tool: "noop", args: { n: [Infinity] } }],
    ["bigint", bad({ tool: "noop", args: { id: 12345678901234567890n } })],
    ["undefined member", bad({ tool: "noop", args: { a: undefined } })],
    ["function", bad({ tool: "noop", args: { f: () => 1 } })],
    ["Date", bad({ tool: "noop", args: { at: new Date(0) } })],
    ["Map", bad({ tool: "noop", args: { m: new Map() } })],
    ["lone surrogate", { tool: "noop", args: { s: "\ud83d" } }],
    ["lone surrogate in a name", { tool: "noop", args: { ["\ude00"]: 1 } }],
    ["lone surrogate in session", { tool: "noop", args: {}, session: "\ud83d" }],
  ];
  for (const [name, env] of cases) {
    assert.throws(() => deriveKey(env, {}, new Date()), { code: "invalid_intent" }, name);
  }
});

test("a cycle is rejected", () => {
  const args: Record<string, unknown> = {};
  args["self"] = args;
  assert.throws(() => checkEnvelope({ tool: "noop", args }), { code: "invalid_intent" });
});

test("2^53 itself is accepted; big identifiers belong in strings", () => {
  assert.doesNotThrow(() => deriveKey({ tool: "noop", args: { n: 2 ** 53, m: -(2 ** 53) } }));
  assert.doesNotThrow(() => deriveKey({ tool: "noop", args: { id: "12345678901234567890" } }));
  // In text, 2^53 + 1 is caught before it is rounded.
  assert.throws(() => parseEnvelope('{"tool":"noop","args":{"id":9007199254740993}}'), { code: "invalid_intent" });
  assert.doesNotThrow(() => parseEnvelope('{"tool":"noop","args":{"id":9007199254740992}}'));
  assert.doesNotThrow(() => parseEnvelope('{"tool":"noop","args":{"id":9007199254740992.0e0}}'));
  assert.throws(() => parseEnvelope('{"tool":"noop","args":{"id":9007199254740992.5}}'), { code: "invalid_intent" });
});

test("window tools need a time and a whole number of seconds", () => {
  const env: Envelope = { tool: "welcome_email", args: { user: 42 } };
  assert.throws(() => deriveKey(env, { window_seconds: 604800 }), { code: "invalid_intent" });
  assert.throws(() => deriveKey(env, { window_seconds: 1.5 }, new Date()), { code: "invalid_spec" });
  assert.throws(() => deriveKey(env, { window_seconds: -1 }, new Date()), { code: "invalid_spec" });
  const a = deriveKey(env, { window_seconds: 604800 }, new Date("2025-01-06T10:00:00Z"));
  const b = deriveKey(env, { window_seconds: 604800 }, "2025-01-06T10:00:00Z");
  assert.equal(a.key, b.key);
  assert.match(a.material, /"window":2870}$/);
});

test("windows floor toward negative infinity", () => {
  const env: Envelope = { tool: "t", args: {}, created_at: "1969-12-31T23:59:59Z" };
  assert.match(deriveKey(env, { window_seconds: 3600 }).material, /"window":-1}$/);
  assert.equal(parseRFC3339("1969-12-31T23:59:59.5Z"), -1);
  assert.equal(parseRFC3339("2025-01-09T01:30:00.25+02:00"), Date.UTC(2025, 0, 8, 23, 30) / 1000);
  assert.equal(parseRFC3339("2024-02-29T00:00:00Z"), Date.UTC(2024, 1, 29) / 1000);
  assert.throws(() => parseRFC3339("2025-02-29T00:00:00Z"), { code: "invalid_intent" });
  assert.throws(() => parseRFC3339("2025-01-01T24:00:00Z"), { code: "invalid_intent" });
  assert.throws(() => parseRFC3339("2025-01-01T00:00:60Z"), { code: "invalid_intent" });
  assert.throws(() => parseRFC3339("2025-01-01T00:00:00+24:00"), { code: "invalid_intent" });
});

test("a member named __proto__ is an ordinary arg", () => {
  const env = parseEnvelope('{"tool":"noop","args":{"__proto__":{"x":1},"a":2}}');
  assert.deepEqual(Object.keys(env.args), ["__proto__", "a"]);
  assert.equal(deriveKey(env).material, '{"args":{"__proto__":{"x":1},"a":2},"session":"","tool":"noop","v":1}');
});

test("size and depth limits", () => {
  const big = `{"tool":"noop","args":{"s":"${"x".repeat(300 * 1024)}"}}`;
  assert.throws(() => parseEnvelope(big), { code: "too_large" });
  let deep = "1";
  for (let i = 0; i < 31; i++) deep = `[${deep}]`;
  assert.throws(() => parseEnvelope(`{"tool":"noop","args":{"d":${deep}}}`), { code: "invalid_intent" });
  assert.doesNotThrow(() => parseEnvelope(`{"tool":"noop","args":{"d":${deep.slice(1, -1)}}}`));
});

test("volatile args leave the fingerprint, key args shape the key", () => {
  const spec = { key_args: ["order_id"], volatile_args: ["requested_at"] };
  const a = deriveKey({ tool: "ship_order", args: { order_id: "o-1", requested_at: "t1", note: "x" } }, spec);
  const b = deriveKey({ tool: "ship_order", args: { order_id: "o-1", requested_at: "t2", note: "x" } }, spec);
  const c = deriveKey({ tool: "ship_order", args: { order_id: "o-1", requested_at: "t1", note: "y" } }, spec);
  assert.equal(a.key, b.key);
  assert.equal(a.fingerprint, b.fingerprint);
  assert.equal(a.key, c.key);
  assert.notEqual(a.fingerprint, c.fingerprint, "same key, other fingerprint: a conflict");
});
