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
	// StatusAlreadyDone answers a repeat of a completed operation of a tool
	// whose policy rejects repeats (OnCompleteReject): nothing fired, and
	// the answer carries what ran (its result, time and attempts).
	StatusAlreadyDone Status = "already_done"
	// StatusForgotten exists only in the ledger: an operator forgot the
	// operation (a tombstone, kept a short while); the next call runs it
	// again.
	StatusForgotten Status = "forgotten"
)

// Final reports whether a caller stops waiting at s.
func (s Status) Final() bool {
	switch s {
	case StatusCompleted, StatusFailed, StatusDenied, StatusConflict, StatusRejected, StatusAlreadyDone:
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
	CodeDeadLettered  = "dead_lettered"  // the intent could not be handled in its deliveries and was dead-lettered; retry it with the same key
	CodeKeyMismatch   = "key_mismatch"   // the client derived another key or fingerprint than the workers: its key spec is out of date
	CodeAlreadyDone   = "already_done"   // the operation ran already and its tool rejects repeats; nothing fired
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
	// RecordFingerprint is, in a conflict answer, the fingerprint of the
	// arguments the key was first used with (Fingerprint is the caller's).
	RecordFingerprint string `json:"record_fingerprint,omitempty"`
	Attempts          int    `json:"attempts"`
	// IntentSeq and Attempt name the run whose outcome a final answer
	// reports: the stream sequence of the intent whose claim recorded it,
	// and that claim's number (1-based, takeovers included). A conflict
	// answer's IntentSeq is the refused intent's. Its receipt binds both.
	IntentSeq uint64          `json:"intent_seq,omitempty"`
	Attempt   int             `json:"attempt,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *Error          `json:"error,omitempty"`
	CallID    string          `json:"call_id,omitempty"`
	// CompletedAt is when the outcome was reached; absent from an answer
	// that is not final (awaiting_approval, uncertain).
	CompletedAt time.Time `json:"completed_at,omitzero"`
	// Receipt is the signed event that recorded the outcome (see
	// pkg/audit and docs/audit.md): on every completed, failed and denied
	// answer, and on a conflict a worker answered. Anyone holding the
	// workers' public keys verifies it offline.
	Receipt json.RawMessage `json:"receipt,omitempty"`
	// RetryAt is, on a budget_exceeded answer, when the budget's window
	// ends and the same call may run.
	RetryAt time.Time `json:"retry_at,omitzero"`
}

// Rejected is the answer to an intent refused before anything was done: bad
// input, an unknown tool, a rate limit. It reports the call's own outcome, so
// it is not a replay. The caller sets Key, Tool, Fingerprint and CallID where
// it knows them.
func Rejected(code, message string) Result {
	return Result{
		Status:      StatusRejected,
		Error:       &Error{Code: code, Message: message},
		CompletedAt: time.Now().UTC(),
	}
}
