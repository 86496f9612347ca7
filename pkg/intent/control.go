package intent

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Operator decisions, published on Names.ControlSubject(op).
const (
	ControlApprove = "approve" // let an operation awaiting approval fire
	ControlDeny    = "deny"    // refuse an operation awaiting approval
	ControlResolve = "resolve" // settle an uncertain operation
	ControlProbe   = "probe"   // ask the downstream about an uncertain operation (its tool's probe)
	// ControlForget names an operator's forget in a forgotten record's
	// decision; it is not a control request (a forget goes through the
	// ledger and intent.Names.ForgetSubject).
	ControlForget = "forget"
	// ControlUserApprove and ControlUserDeny are the decisions of the
	// person at an agent's client (approver: user), published on subjects
	// of their own ("idem.control.user.approve", ".deny") so that NATS
	// permissions can grant them apart from an operator's: a worker applies
	// them only to an operation whose tool names the user as its approver,
	// and records them as an approval or a denial.
	ControlUserApprove = "user." + ControlApprove
	ControlUserDeny    = "user." + ControlDeny
)

// UserDecision returns the decision op stands for (ControlApprove for
// ControlUserApprove, ControlDeny for ControlUserDeny, op itself otherwise)
// and whether op is a user's decision.
func UserDecision(op string) (string, bool) {
	switch op {
	case ControlUserApprove:
		return ControlApprove, true
	case ControlUserDeny:
		return ControlDeny, true
	}
	return op, false
}

// Outcomes an operator may settle an uncertain operation with.
const (
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
)

// Control is an operator's decision on one key.
type Control struct {
	// Key is the operation's key. Required.
	Key string `json:"key"`
	// Fingerprint, when set, binds an approval to the arguments the operator
	// saw: it must equal the record's.
	Fingerprint string `json:"fingerprint,omitempty"`
	// By names the operator. Recorded.
	By string `json:"by,omitempty"`
	// Reason is recorded; for a deny it is the caller's error message.
	Reason string `json:"reason,omitempty"`
	// Outcome is OutcomeSucceeded or OutcomeFailed (resolve only).
	Outcome string `json:"outcome,omitempty"`
	// Result is the operation's result when it succeeded (resolve only).
	Result json.RawMessage `json:"result,omitempty"`
}

// DecodeControl decodes and checks a decision for op.
func DecodeControl(op string, data []byte) (Control, error) {
	var c Control
	op, _ = UserDecision(op)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("%w: %s decision: %v", ErrInvalid, op, err)
	}
	switch {
	case op != ControlApprove && op != ControlDeny && op != ControlResolve && op != ControlProbe:
		return c, fmt.Errorf("%w: unknown decision %q: use approve, deny, resolve, probe, user.approve or user.deny", ErrInvalid, op)
	case c.Key == "":
		return c, fmt.Errorf("%w: %s decision: no key", ErrInvalid, op)
	case op == ControlResolve && c.Outcome != OutcomeSucceeded && c.Outcome != OutcomeFailed:
		return c, fmt.Errorf("%w: resolve: outcome %q: use succeeded or failed", ErrInvalid, c.Outcome)
	case op != ControlResolve && (c.Outcome != "" || len(c.Result) > 0):
		return c, fmt.Errorf("%w: %s decision: outcome and result belong to resolve", ErrInvalid, op)
	case len(c.Result) > 0 && !json.Valid(c.Result):
		return c, fmt.Errorf("%w: resolve: result is not valid JSON", ErrInvalid)
	}
	return c, nil
}
