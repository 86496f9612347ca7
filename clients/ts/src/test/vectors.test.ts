/**
 * The protocol's test vectors, reproduced byte for byte: every vector's
 * material, key and fingerprint, and the rejection of every invalid envelope.
 * The build copies them into the package (dist/testdata), so these tests read
 * only the package's own files; one test checks the copy is still the
 * repository's (pkg/intent/testdata) when the package sits in it.
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { test } from "node:test";

import { deriveKey, IdemError, LAYOUT_COMPACT, LAYOUT_FULL, ledgerKey, parseEnvelope, partition, type KeySpec } from "../index.js";

/** The package's copy, made by scripts/copy-vectors.mjs at build. */
const TESTDATA = new URL("../testdata/", import.meta.url);
/** The repository's originals, from dist/test/. */
const ORIGINALS = new URL("../../../../pkg/intent/testdata/", import.meta.url);

interface Vector {
  name: string;
  envelope: string;
  spec: { key_args: string[]; window_seconds: number; volatile_args: string[] };
  msg_time: string;
  material: string;
  key: string;
  fingerprint: string;
  partition: Record<string, number>;
  ledger_key: Record<string, string>;
}

interface Invalid {
  name: string;
  envelope: string;
  code: string;
}

function load<T>(file: string): T[] {
  const v: unknown = JSON.parse(readFileSync(new URL(file, TESTDATA), "utf8"));
  assert.ok(Array.isArray(v) && v.length > 0, `${file} holds a non-empty list`);
  return v as T[];
}

test("the package's vectors are the repository's, byte for byte", (t) => {
  if (!existsSync(ORIGINALS)) {
    if (process.env["CI"] !== undefined && process.env["CI"] !== "") {
      assert.fail(`${ORIGINALS.pathname} is missing, and CI is set: the copy must be checked in CI`);
    }
    t.skip("not inside the idemgate repository: nothing to compare the copy with");
    return;
  }
  for (const f of ["vectors.json", "invalid.json"]) {
    const copy = readFileSync(new URL(f, TESTDATA), "utf8");
    const original = readFileSync(new URL(f, ORIGINALS), "utf8");
    assert.equal(copy, original, `dist/testdata/${f} differs from pkg/intent/testdata/${f}: run npm run build`);
  }
});

const vectors = load<Vector>("vectors.json");
const invalid = load<Invalid>("invalid.json");

for (const v of vectors) {
  test(`vector: ${v.name}`, () => {
    const env = parseEnvelope(v.envelope);
    const spec: KeySpec = v.spec;
    const id = deriveKey(env, spec, v.msg_time === "" ? undefined : v.msg_time);
    assert.equal(id.material, v.material, "material");
    assert.equal(id.key, v.key, "key");
    assert.equal(id.fingerprint, v.fingerprint, "fingerprint");
    assert.ok(Object.keys(v.partition).length > 0, "partition vectors");
    for (const [n, p] of Object.entries(v.partition)) {
      assert.equal(partition(id.key, Number(n)), p, `partition of ${n}`);
    }
    assert.deepEqual(Object.keys(v.ledger_key).sort(), [String(LAYOUT_FULL), String(LAYOUT_COMPACT)], "ledger key vectors");
    for (const [layout, stored] of Object.entries(v.ledger_key)) {
      assert.equal(ledgerKey(id.key, Number(layout)), stored, `ledger key in layout ${layout}`);
    }
  });
}

test("ledger keys: compact shape, other keys kept, the partition's bytes kept", () => {
  const key = vectors[0]?.key ?? "";
  const compact = ledgerKey(key, LAYOUT_COMPACT);
  assert.match(compact, /^send_email\.[A-Za-z0-9_-]{22}$/);
  // The digest's first 4 bytes, which pick the partition, are the compact key's first 4.
  const word = Buffer.from(compact.slice(compact.indexOf(".") + 1), "base64url").readUInt32BE(0);
  for (const n of [2, 8, 64, 256]) {
    assert.equal(word % n, partition(key, n), `partition of ${n}`);
  }
  for (const other of ["_scan", "test.k1", "noop.ABC", "send_email.EA5B3B5ECC3FA233989582335BB7067CD6C904CB4D46BAF4530950DE5B22B7F6"]) {
    assert.equal(ledgerKey(other, LAYOUT_COMPACT), other, other);
  }
  assert.equal(ledgerKey(compact, LAYOUT_COMPACT), compact, "a compact key is its own stored form");
  for (const n of [2, 8, 64, 256]) {
    assert.equal(partition(compact, n), partition(key, n), `a compact key is in its derived key's partition (${n})`);
  }
  assert.equal(ledgerKey(compact, LAYOUT_FULL), compact);
  assert.throws(() => ledgerKey(key, 3), { code: "unknown_layout" });
});

for (const v of invalid) {
  test(`invalid: ${v.name}`, () => {
    assert.throws(
      () => {
        const env = parseEnvelope(v.envelope);
        deriveKey(env, {}, new Date());
      },
      (err: unknown) => err instanceof IdemError && err.code === v.code,
    );
  });
}

test("invalid UTF-8 is rejected", () => {
  const prefix = new TextEncoder().encode('{"tool":"noop","args":{"s":"');
  const suffix = new TextEncoder().encode('"}}');
  for (const bad of [[0xff], [0xed, 0xa0, 0x80], [0xc3]]) {
    const data = new Uint8Array([...prefix, ...bad, ...suffix]);
    assert.throws(() => parseEnvelope(data), { code: "invalid_intent" }, `bytes ${bad.join(",")}`);
  }
});
