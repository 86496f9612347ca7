package intent

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
)

// Ledger layouts: how a ledger stores a key (docs/protocol.md, 6.2). The
// key itself — in headers, answers, logs and every API — is the same in
// both; only the ledger's KV key differs. A ledger records its layout when
// it is created.
const (
	// LayoutFull stores every key as it is. It is the layout of a ledger
	// that records none (one made before layouts existed).
	LayoutFull = 1
	// LayoutCompact stores a derived key (<tool> "." 64 hex digits) as
	// <tool> "." the unpadded base64url (RFC 4648, section 5) of the first
	// 16 bytes of its digest — 22 characters — and any other key as it is.
	LayoutCompact = 2
	// DefaultLayout is the layout a new ledger is created with.
	DefaultLayout = LayoutCompact
)

// compactDigest is how many characters of a compact ledger key follow the
// tool's dot: the base64url of 16 bytes, unpadded.
const compactDigest = 22

// ValidLedgerLayout reports whether layout is a ledger layout this package
// knows: LayoutFull or LayoutCompact.
func ValidLedgerLayout(layout int) bool {
	return layout == LayoutFull || layout == LayoutCompact
}

// LedgerKey returns the KV key under which a ledger of the given layout
// stores key. With LayoutFull it is key. With LayoutCompact a derived key
// becomes <tool> "." 22 base64url characters (its digest's first 16 bytes,
// so its partition, from the first 4, is the same); any other key stays as
// it is — a compact key among them, which is its own stored form (as a
// listing of such a ledger shows it). A ledger refuses to claim a key of
// the compact shape that is not derived, so that none can stand for
// another operation's record. The error wraps ErrInvalid, for a layout
// ValidLedgerLayout refuses.
func LedgerKey(key string, layout int) (string, error) {
	switch layout {
	case LayoutFull:
		return key, nil
	case LayoutCompact:
	default:
		return "", fmt.Errorf("%w: ledger layout %d: this version knows layouts %d and %d", ErrInvalid, layout, LayoutFull, LayoutCompact)
	}
	if ValidKey(key) {
		i := len(key) - 64
		var b [16]byte
		if _, err := hex.Decode(b[:], []byte(key[i:i+32])); err != nil {
			return "", fmt.Errorf("%w: key %q: %w", ErrInvalid, key, err) // unreachable: ValidKey checked the digits
		}
		return key[:i] + base64.RawURLEncoding.EncodeToString(b[:]), nil
	}
	return key, nil
}

// CompactLedgerKey reports whether s has the shape of a derived key as a
// LayoutCompact ledger stores it: <tool> "." 22 base64url characters.
func CompactLedgerKey(s string) bool { return compactShaped(s) }

// compactDigest16 returns the digest bytes a compact ledger key holds (the
// first 16 of its derived key's); ok is false for any other string.
func compactDigest16(s string) (b [16]byte, ok bool) {
	if !compactShaped(s) {
		return b, false
	}
	n, err := base64.RawURLEncoding.Decode(b[:], []byte(s[len(s)-compactDigest:]))
	return b, err == nil && n == 16
}

// compactShaped reports whether s has the shape of a derived key as a
// LayoutCompact ledger stores it: a tool name (ValidTool), a dot, and 22
// base64url characters (A-Z, a-z, 0-9, '-', '_').
func compactShaped(s string) bool {
	i := len(s) - compactDigest - 1
	if i < 1 || s[i] != '.' || !ValidTool(s[:i]) {
		return false
	}
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}
