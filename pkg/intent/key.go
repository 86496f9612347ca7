package intent

import "time"

// KeySpec is how a tool derives keys and fingerprints from its intents.
// The zero value derives the key from all args, with no time window.
type KeySpec struct {
	// KeyArgs are the distinguishing arguments: when non-empty, only these
	// top-level args enter the key (a missing one is left out). Default: all args.
	KeyArgs []string
	// Window, when positive, scopes the key to floor(t / Window), where t is the
	// intent's creation time. Default: 0, no window.
	Window time.Duration
	// VolatileArgs are top-level args that are not part of the operation's
	// identity (timestamps, trace ids, a reworded body): they are left out of
	// the key material and of the fingerprint, so a repeat that differs only
	// in them is the same operation, not a second one and not a conflict.
	// Default: none.
	VolatileArgs []string
}

// Identity is what derivation yields for one intent.
type Identity struct {
	Key         string // <tool> "." hex(sha256(JCS(material)))
	Fingerprint string // hex(sha256(JCS({tool, session, args minus volatile})))
}

// ValidKey reports whether s has the shape of a derived key:
// <tool> "." 64 lower-case hex digits.
func ValidKey(s string) bool {
	i := len(s) - 65
	if i < 1 || s[i] != '.' || !ValidTool(s[:i]) {
		return false
	}
	for _, c := range s[i+1:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
