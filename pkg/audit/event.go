package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Version is the format version every event carries in its "v" member.
const Version = 1

// Kind names what an event records. The set is open: a verifier checks an
// event of a kind it does not know as it checks the others (its signature
// and its place in the chain), so new kinds need no new verifier.
type Kind string

// Kinds of events the workers write.
const (
	// KindClaimed: a worker claimed the operation's key (holder, attempt,
	// args_digest — or args, for a tool with audit_args).
	KindClaimed Kind = "claimed"
	// KindTakeover: a worker took the key over from a holder whose lease ran
	// out (reason, previous_holder, previous_attempt).
	KindTakeover Kind = "takeover"
	// KindFired: the holder handed the operation to its effect (effect,
	// destination, forwarded_key, attempt), which forwards the key
	// downstream. A claim fired at once is recorded by its fired event
	// alone, which then carries the claim's members too (tool, session,
	// fingerprint, intent_seq, args_digest or args).
	KindFired Kind = "fired"
	// KindReleased: the effect failed transiently; the holder gave the key
	// back for a retry (attempts, error_code, error_digest).
	KindReleased Kind = "released"
	// KindOutcome: an outcome was recorded in the ledger (status and the
	// digests of its result or error). A final one (completed, failed,
	// denied) is signed: it is the receipt every answer of the operation
	// carries.
	KindOutcome Kind = "outcome"
	// KindConflict: an intent used the key with other arguments and was
	// refused (fingerprint: the caller's; record_fingerprint: the
	// operation's). Signed: the conflict answer's receipt.
	KindConflict Kind = "conflict"
	// KindDecision: an operator's decision (op, by, reason) and the status
	// it left.
	KindDecision Kind = "decision"
	// KindForgotten: an operator deleted the operation's record so that it
	// may run again (by, reason).
	KindForgotten Kind = "forgotten"
	// KindProbed: a worker asked the operation's downstream, with the
	// tool's probe, whether the operation had happened (reason: the probe
	// answer, done, not_done or unknown; destination: what was asked).
	KindProbed Kind = "probed"
	// KindGap: a worker could not write events to the trail (the trail was
	// unreachable, or its queue full) and dropped them: dropped counts them,
	// from and to bound when they happened.
	KindGap Kind = "gap"
)

// Reasons of a takeover (Event.Reason of a KindTakeover event).
const (
	// ReasonConfirmedAbandoned: the lease ran out and the record stayed
	// unchanged for a further lease on the claimant's clock.
	ReasonConfirmedAbandoned = "confirmed_abandoned"
	// ReasonLeaseExpired: the lease ran out (taken over without a
	// confirmation).
	ReasonLeaseExpired = "lease_expired"
)

// Event is one thing that happened to an operation, as the trail records
// it. Members that do not apply are left out of its JSON (a zero value).
// Its canonical JSON (RFC 8785) without "sig" is what its signer signs.
type Event struct {
	V    int  `json:"v"`
	Kind Kind `json:"kind"`
	// Key, Tool, Session and Fingerprint identify the operation.
	Key         string `json:"key,omitempty"`
	Tool        string `json:"tool,omitempty"`
	Session     string `json:"session,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// Holder is the worker the event is about (the claimant, the firing
	// holder, the writer of a gap).
	Holder string `json:"holder,omitempty"`
	// Attempt is the claim's number (1-based); Attempts the effect's
	// invocations so far, retries included.
	Attempt   int    `json:"attempt,omitempty"`
	Attempts  int    `json:"attempts,omitempty"`
	IntentSeq uint64 `json:"intent_seq,omitempty"`
	// Status is the record's status the event left (outcome, decision,
	// conflict).
	Status intent.Status `json:"status,omitempty"`
	// ResultDigest is hex(sha256(JCS(result))) of the outcome's result; it
	// is left out for a result that has no canonical form (a number beyond
	// ±2^53), which the receipt then does not bind. ErrorCode and
	// ErrorDigest (hex(sha256(JCS({"code","message"})))) are the error's.
	ResultDigest string `json:"result_digest,omitempty"`
	ErrorCode    string `json:"error_code,omitempty"`
	ErrorDigest  string `json:"error_digest,omitempty"`
	// RecordFingerprint is, in a conflict, the fingerprint the key was
	// first used with.
	RecordFingerprint string `json:"record_fingerprint,omitempty"`
	// PreviousHolder and PreviousAttempt are a takeover's earlier claim.
	PreviousHolder  string `json:"previous_holder,omitempty"`
	PreviousAttempt int    `json:"previous_attempt,omitempty"`
	// Reason is why: a takeover's (ReasonConfirmedAbandoned, ...), an
	// operator's, as given.
	Reason string `json:"reason,omitempty"`
	// Op is a decision's: approve, deny or resolve. By names the operator.
	Op string `json:"op,omitempty"`
	By string `json:"by,omitempty"`
	// Effect is the tool's effect kind (webhook, smtp, ...); Destination
	// where it fires, when the effect names it; ForwardedKey what it sends
	// downstream to identify the operation when that is not the key itself
	// (an email's Message-ID). Every effect forwards the key.
	Effect       string `json:"effect,omitempty"`
	Destination  string `json:"destination,omitempty"`
	ForwardedKey string `json:"forwarded_key,omitempty"`
	// ArgsDigest is hex(sha256(JCS(args))) of the intent's whole args; Args
	// are the args themselves, only for a tool whose tools file sets
	// audit_args: true.
	ArgsDigest string          `json:"args_digest,omitempty"`
	Args       json.RawMessage `json:"args,omitempty"`
	// Dropped, From and To describe a gap.
	Dropped uint64    `json:"dropped,omitempty"`
	From    time.Time `json:"from,omitzero"`
	To      time.Time `json:"to,omitzero"`
	// At is when the event happened, on its writer's clock.
	At time.Time `json:"at"`
	// Signer is the id of the key that signed the event, Sig the signature
	// (base64url, no padding) and Proof the event's path to the signed
	// Merkle root when it was signed with others (see SignBatch), on signed
	// events only.
	Signer string   `json:"signer,omitempty"`
	Sig    string   `json:"sig,omitempty"`
	Proof  []string `json:"proof,omitempty"`
}

// appendCanonical appends e's canonical JSON (RFC 8785) to b: its members
// in the order of their names (written out below, which RFC 8785's order
// is for these ASCII names), zero values left out, "sig" and "proof" only
// when withSig.
func (e *Event) appendCanonical(b []byte, withSig bool) []byte {
	b, _ = e.appendCanonicalMarked(b, withSig)
	return b
}

// sigMarks are where, in an event's canonical JSON without "sig" and
// "proof", those members go: the offsets at which ',"proof":[...]' and
// ',"sig":"..."' are inserted (a member always comes before either: "at").
type sigMarks struct{ proof, sig int }

// appendCanonicalMarked is appendCanonical, and the offsets in b where
// "proof" and "sig" are, or would be, written.
func (e *Event) appendCanonicalMarked(b []byte, withSig bool) ([]byte, sigMarks) {
	var m sigMarks
	w := encoder{b: append(b, '{')}
	if len(e.Args) > 0 {
		if c, err := intent.Canonicalize(e.Args); err == nil {
			w.raw("args", c)
		}
	}
	w.str("args_digest", e.ArgsDigest)
	at := e.At
	if at.IsZero() {
		at = time.Unix(0, 0)
	}
	w.time("at", at)
	w.int("attempt", int64(e.Attempt))
	w.int("attempts", int64(e.Attempts))
	w.str("by", e.By)
	w.str("destination", e.Destination)
	w.uint("dropped", e.Dropped)
	w.str("effect", e.Effect)
	w.str("error_code", e.ErrorCode)
	w.str("error_digest", e.ErrorDigest)
	w.str("fingerprint", e.Fingerprint)
	w.str("forwarded_key", e.ForwardedKey)
	w.time("from", e.From)
	w.str("holder", e.Holder)
	w.uint("intent_seq", e.IntentSeq)
	w.str("key", e.Key)
	w.str("kind", string(e.Kind))
	w.str("op", e.Op)
	w.int("previous_attempt", int64(e.PreviousAttempt))
	w.str("previous_holder", e.PreviousHolder)
	m.proof = len(w.b)
	if withSig && len(e.Proof) > 0 {
		w.name("proof")
		w.b = append(w.b, '[')
		for i, step := range e.Proof {
			if i > 0 {
				w.b = append(w.b, ',')
			}
			w.b = intent.AppendCanonicalString(w.b, step)
		}
		w.b = append(w.b, ']')
	}
	w.str("reason", e.Reason)
	w.str("record_fingerprint", e.RecordFingerprint)
	w.str("result_digest", e.ResultDigest)
	w.str("session", e.Session)
	m.sig = len(w.b)
	if withSig {
		w.str("sig", e.Sig)
	}
	w.str("signer", e.Signer)
	w.str("status", string(e.Status))
	w.time("to", e.To)
	w.str("tool", e.Tool)
	w.int("v", Version)
	return append(w.b, '}'), m
}

// sizeHint is about the length of e's canonical JSON, with its signature:
// its strings and args, and the names and numbers around them.
func (e *Event) sizeHint() int {
	n := 224 + len(e.Args) + len(e.ArgsDigest) + len(e.By) + len(e.Destination) + len(e.Effect) + len(e.ErrorCode) +
		len(e.ErrorDigest) + len(e.Fingerprint) + len(e.ForwardedKey) + len(e.Holder) + len(e.Key) + len(e.Kind) +
		len(e.Op) + len(e.PreviousHolder) + len(e.Reason) + len(e.RecordFingerprint) + len(e.ResultDigest) +
		len(e.Session) + len(e.Sig) + len(e.Signer) + len(e.Status) + len(e.Tool)
	for _, step := range e.Proof {
		n += len(step) + 3
	}
	return n
}

// Canonical returns e's canonical JSON (RFC 8785) with its signature, if
// it has one. Its "v" is always Version.
func (e *Event) Canonical() []byte {
	return e.appendCanonical(make([]byte, 0, e.sizeHint()), true)
}

// Digest is hex(sha256(data)): the digests events carry.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// ResultDigest is the digest of a result as events carry it:
// hex(sha256(JCS(result))); false when result has no canonical form (a
// number beyond ±2^53, or not JSON).
func ResultDigest(result json.RawMessage) (string, bool) {
	if intent.IsCanonical(result) {
		return Digest(result), true // no second encoding
	}
	c, err := intent.Canonicalize(result)
	if err != nil {
		return "", false
	}
	return Digest(c), true
}

// ErrorDigest is the digest of an answer's error as events carry it:
// hex(sha256(JCS({"code":..., "message":...}))).
func ErrorDigest(e intent.Error) string {
	// Both members always: an empty message is still a member.
	b := intent.AppendCanonicalString(append(make([]byte, 0, 32+len(e.Code)+len(e.Message)), `{"code":`...), e.Code)
	b = intent.AppendCanonicalString(append(b, `,"message":`...), e.Message)
	return Digest(append(b, '}'))
}

// Outcome is the outcome event of a record of key as written (its status,
// result or error, attempts, intent sequence), at its completion time (or
// at, when it has none). It is unsigned: Signer.Sign makes it a receipt.
func Outcome(key string, tool, session, fingerprint string, status intent.Status, result json.RawMessage, e *intent.Error,
	attempts int, intentSeq uint64, at time.Time) Event {
	ev := Event{V: Version, Kind: KindOutcome, Key: key, Tool: tool, Session: session, Fingerprint: fingerprint,
		Status: status, Attempts: attempts, IntentSeq: intentSeq, At: at}
	if len(result) > 0 {
		ev.ResultDigest, _ = ResultDigest(result)
	}
	if e != nil {
		ev.ErrorCode, ev.ErrorDigest = e.Code, ErrorDigest(*e)
	}
	return ev
}

// Headers of an operator's announcement of a forget (on
// intent.Names.ForgetSubject), for the forgotten event a worker records:
// who forgot the key and why, and the fingerprint of the record deleted (an
// announcement without it deleted none, and is not recorded).
const (
	HeaderBy          = "Idem-By"
	HeaderReason      = "Idem-Reason"
	HeaderFingerprint = "Idem-Forgotten-Fingerprint"
)
