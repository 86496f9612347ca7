/**
 * Ledger key layouts (docs/protocol.md, section 6.2): the KV key under which
 * a ledger stores an operation's key. The key itself is the same in every
 * layout; only the ledger's KV key differs.
 *
 * @module
 */

import { IdemError } from "./errors.js";

/** Layout 1: every key is stored as it is (a ledger that records no layout). */
export const LAYOUT_FULL = 1;

/** Layout 2: a derived key is stored as `<tool>.` + 22 base64url characters of its digest; any other key as it is. */
export const LAYOUT_COMPACT = 2;

/** The stream metadata entry of partition 0 that records the layout. */
export const LAYOUT_METADATA = "idemgate.layout";

const DERIVED_KEY = /^([a-z0-9_-]{1,64})\.([0-9a-f]{64})$/;

/**
 * Whether `layout` is a ledger layout this client knows.
 *
 * @param layout - the layout
 * @returns true for {@link LAYOUT_FULL} and {@link LAYOUT_COMPACT}
 */
export function validLayout(layout: number): boolean {
  return layout === LAYOUT_FULL || layout === LAYOUT_COMPACT;
}

/**
 * The KV key under which a ledger of `layout` stores `key`: the key itself
 * in layout 1; in layout 2, for a derived key `<tool>.<64 hex>`,
 * `<tool>.` + the unpadded base64url of the digest's first 16 bytes, and
 * any other key as it is (a compact key is its own stored form).
 *
 * @param key - the operation's key
 * @param layout - the ledger's layout
 * @returns the KV key
 * @throws {@link IdemError} (`unknown_layout`) for a layout this client does
 * not know
 */
export function ledgerKey(key: string, layout: number): string {
  if (!validLayout(layout)) {
    throw new IdemError("unknown_layout", `ledger layout ${String(layout)}: this client knows layouts ${LAYOUT_FULL} and ${LAYOUT_COMPACT}: upgrade it`);
  }
  if (layout === LAYOUT_FULL) {
    return key;
  }
  const m = DERIVED_KEY.exec(key);
  if (m?.[1] !== undefined && m[2] !== undefined) {
    return `${m[1]}.${Buffer.from(m[2].slice(0, 32), "hex").toString("base64url")}`;
  }
  return key;
}
