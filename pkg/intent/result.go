package intent

import (
	"encoding/json"
	"time"
)

// Status is the state an answer (and a ledger record) is in.
type Status string

// Statuses of an answer. A caller stops waiting at a final status (see
// Status.Final); StatusAwaitingApproval and StatusUncertain are answered too,
// and the caller may keep watching. StatusPending exists only in the ledger.
const (
	StatusPending          Status = "pending"
	StatusCompleted        Status = "completed"
	StatusFailed           Status = "failed"
	StatusConflict         Status = "conflict"
	StatusRejected         Status = "rejected"
	StatusAwaitingApproval Status = "awaiting_approval"
	StatusApproved         Status = "approved"
	StatusDenied           Status = "denied"
	StatusUncertain        Status = "uncertain"
)

// Final reports whether a caller stops waiting at s.
func (s Status) Final() bool {
	switch s {
	case StatusCompleted, StatusFailed, StatusDenied, StatusConflict, StatusRejected:
		return true
	}
	return false
}

// Answered reports whether s is worth answering a caller with: every final
// status, and the two a caller may keep watching (awaiting_approval, uncertain).
func (s Status) Answered() bool {
	return s.Final() || s == StatusAwaitingApproval || s == StatusUncertain
}

// Error codes carried in Error.Code.
const (
	CodeInvalidIntent = "invalid_intent" // the envelope is malformed or breaks a rule of the protocol
	CodeUnknownTool   = "unknown_tool"   // no tool of that name is configured
	CodeToolMismatch  = "tool_mismatch"  // the envelope's tool is not the subject's last token
	CodeTooLarge      = "too_large"      // the intent is over the size limit
	CodeConflict      = "conflict"       // the key was used before with other arguments
	CodeEffectFailed  = "effect_failed"  // the effect failed permanently
	CodeDenied        = "denied"         // an operator denied the operation
	CodeUncertain     = "uncertain"      // a holder vanished mid-effect; an operator must settle the outcome
	CodeWrongState    = "wrong_state"    // an operator decision does not apply to the operation's state
	CodeNotFound      = "not_found"      // no operation has that key
	CodeRateLimited   = "rate_limited"   // the session sent more intents than its rate allows; nothing was done
	CodeKeyMismatch   = "key_mismatch"   // the worker derives another key or fingerprint than the client's Idem-Key / Idem-Fingerprint
)

// Error is the error half of an answer.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Result is the answer every caller of an operation receives, whether its
// intent fired the effect or was answered from the ledger.
type Result struct {
	Key         string `json:"key"`
	Tool        string `json:"tool"`
	Status      Status `json:"status"`
	Replayed    bool   `json:"replayed"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// RecordFingerprint is, in a conflict, the fingerprint of the recorded
	// operation the key belongs to (Fingerprint is the caller's).
	RecordFingerprint string          `json:"record_fingerprint,omitempty"`
	Attempts          int             `json:"attempts"`
	Result            json.RawMessage `json:"result,omitempty"`
	Error             *Error          `json:"error,omitempty"`
	CallID            string          `json:"call_id,omitempty"`
	// CompletedAt is when the outcome was recorded; zero (and left out of
	// the JSON) in the non-final answers, awaiting_approval and uncertain.
	CompletedAt time.Time `json:"completed_at,omitzero"`
}
