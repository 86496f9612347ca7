// Package intent is the protocol of idemgate: the intent envelope and its
// strict validation, RFC 8785 canonical JSON, the derivation of an
// operation's key and fingerprint, and the answer (Result) every caller
// receives.
//
// It is pure: no NATS, no clock, no I/O, standard library only. Every other
// package depends on it, and clients in other languages implement the same
// rules from docs/protocol.md, checked against testdata/vectors.json.
//
// # Decoding
//
// Decode accepts exactly one envelope form: a JSON object with the members
// tool, args, session, key, call_id and created_at (case-sensitive, each at
// most once, no others), valid UTF-8, no lone surrogate escapes, no number
// beyond ±2^53 and nothing over Limits. A typo therefore never silently
// changes a key: it is rejected. Errors wrap ErrInvalid, ErrTooLarge or
// ErrToolMismatch (see Code). Build assembles an envelope from its parts
// (a front door's, a client's) under the same rules, parsing the args once;
// CheckKeyArgs is the rule that an unsafe tool's intent names its key args
// or carries a key override, which every door and the workers apply.
//
// # Canonical JSON
//
// Canonicalize is the one RFC 8785 encoder of the module: the audit trail
// writes its strings with AppendCanonicalString and checks lines with
// IsCanonical and CanonicalScanner, so that receipts and keys agree byte
// for byte.
//
// # Derivation
//
// Derive maps an envelope and its tool's KeySpec to an Identity:
//
//	key         = tool "." hex(sha256(JCS(material)))
//	material    = {"v":1, "tool":T, "session":S, "args":A [, "window":W]}
//	            | {"v":1, "tool":T, "session":S, "key":K}      (override)
//	fingerprint = hex(sha256(JCS({"tool":T, "session":S, "args":args minus volatile})))
//
// The derivation guarantees:
//
//   - It is deterministic and language-neutral: it depends only on the
//     envelope, the spec and (for a window tool without created_at) the
//     message timestamp, never on the worker's clock, randomness or an
//     attempt counter.
//   - Member order, whitespace, escapes and number spelling do not matter:
//     {"a":1.0, "b":2} and {"b":2,"a":1} have the same key.
//   - call_id never enters a key or fingerprint; created_at enters a key only
//     through the window number.
//   - Values that do not survive canonicalization (numbers beyond ±2^53,
//     lone surrogates, repeated names) are rejected rather than collapsed,
//     so two different intents never share a key by accident.
//   - A key override names the operation fully: args and window do not
//     enter the key (they still enter the fingerprint).
//   - The key is "<tool>." plus 64 lowercase hex digits, a valid NATS subject
//     token and KV key.
package intent
