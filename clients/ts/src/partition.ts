/**
 * Ledger partitions (docs/protocol.md, section 6.1): which of a ledger's
 * buckets holds a key.
 *
 * @module
 */

import { createHash } from "node:crypto";

/** The most partitions a ledger may have. */
export const MAX_PARTITIONS = 256;

/** The stream metadata entry of partition 0 that records the count. */
export const PARTITIONS_METADATA = "idemgate.partitions";

const DERIVED_KEY = /^[a-z0-9_-]{1,64}\.([0-9a-f]{64})$/;
const COMPACT_KEY = /^[a-z0-9_-]{1,64}\.([A-Za-z0-9_-]{22})$/;

/**
 * Whether `n` is a partition count: a power of two from 1 to
 * {@link MAX_PARTITIONS}.
 *
 * @param n - the count
 * @returns true when valid
 */
export function validPartitions(n: number): boolean {
  return Number.isInteger(n) && n >= 1 && n <= MAX_PARTITIONS && (n & (n - 1)) === 0;
}

/**
 * The partition, 0 to n-1, of `key` in a ledger of `n` partitions (0 for an
 * invalid n): for a derived key the first 8 hex digits of its digest as a
 * 32-bit number, modulo n, and the same for its compact ledger key (its
 * first 4 decoded bytes); for any other string the first 4 bytes of its
 * SHA-256, the same way.
 *
 * @param key - the key
 * @param n - the ledger's partition count
 * @returns the partition
 */
export function partition(key: string, n: number): number {
  if (!validPartitions(n) || n === 1) {
    return 0;
  }
  const m = DERIVED_KEY.exec(key);
  if (m?.[1] !== undefined) {
    return Number.parseInt(m[1].slice(0, 8), 16) % n;
  }
  // A compact ledger key (layout 2) is in its derived key's partition: its
  // first 4 decoded bytes are the digest's.
  const c = COMPACT_KEY.exec(key);
  if (c?.[1] !== undefined) {
    return Buffer.from(c[1], "base64url").readUInt32BE(0) % n;
  }
  return createHash("sha256").update(key, "utf8").digest().readUInt32BE(0) % n;
}

/**
 * The bucket of partition `i` of the ledger named `bucket`.
 *
 * @param bucket - the ledger's name (its partition 0's bucket)
 * @param i - the partition
 * @returns the bucket name
 */
export function partitionBucket(bucket: string, i: number): string {
  return i === 0 ? bucket : `${bucket}_P${i}`;
}
