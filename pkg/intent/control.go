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
)

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
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("%w: %s decision: %v", ErrInvalid, op, err)
	}
	switch {
	case op != ControlApprove && op != ControlDeny && op != ControlResolve && op != ControlProbe:
		return c, fmt.Errorf("%w: unknown decision %q: use approve, deny, resolve or probe", ErrInvalid, op)
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
