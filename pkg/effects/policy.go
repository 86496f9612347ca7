package effects

import (
	"fmt"
	"time"
)

// Class says what repeating a tool's call does to the world, as the tools
// file declares it.
type Class string

// Tool classes.
const (
	// ClassRead: reads change nothing. They never touch the ledger: each
	// intent fires directly, and identical reads in flight on one worker are
	// coalesced into one call.
	ClassRead Class = "read"
	// ClassIdempotent: absolute writes (set a value, PUT, delete by id) whose
	// repeat leaves the same state. The ledger is optional (on by default:
	// callers then get the recorded answer and the downstream is spared).
	ClassIdempotent Class = "idempotent"
	// ClassUnsafe: creates, sends, charges, increments. The ledger is
	// required, and an intent whose key cannot be derived (a key arg missing
	// and no explicit key) is refused. The default class.
	ClassUnsafe Class = "unsafe"
)

// Abandon is what happens to a key whose holder vanished mid-effect (its
// lease expired without an outcome).
type Abandon string

// Abandoned-lease policies.
const (
	// AbandonRetry: the next claimant takes the key over and fires again with
	// the same key (a keyed downstream absorbs the repeat). The default.
	AbandonRetry Abandon = "retry"
	// AbandonHold: the record moves to uncertain and is never fired again on
	// its own; an operator settles it (submit resolve).
	AbandonHold Abandon = "hold"
)

// DefaultApprovalTTL is how long an approval stays valid when the tools file
// does not say.
const DefaultApprovalTTL = time.Hour

// Policy is how the workers treat a tool's intents.
type Policy struct {
	// Class of the tool. Default ClassUnsafe.
	Class Class
	// Ledger reports whether intents go through the ledger: always for
	// unsafe tools, never for reads, by default for idempotent ones.
	Ledger bool
	// Approval requires an operator's approval, bound to the key and the
	// fingerprint, before the effect fires. Default false.
	Approval bool
	// ApprovalTTL is how long an approval stays valid: a firing that has not
	// started by then needs a new approval. Default DefaultApprovalTTL.
	ApprovalTTL time.Duration
	// OnAbandoned is what happens to a key whose holder vanished mid-effect.
	// Default AbandonRetry.
	OnAbandoned Abandon
	// UserApproves names the person at the agent's client as the approver
	// (approver: user): a client that can ask them (MCP elicitation) does,
	// and the decision goes through the same path as an operator's. Default
	// false: an operator approves.
	UserApproves bool
	// MaxInFlight caps the tool's intents one worker handles at once (those
	// over it are delivered again a little later). Default 0: no cap beyond
	// the worker's concurrency.
	MaxInFlight int
}

// SafeToRetry reports whether a caller may repeat the tool's call without a
// key: true for reads and idempotent writes.
func (p Policy) SafeToRetry() bool { return p.Class == ClassRead || p.Class == ClassIdempotent }

// DefaultPolicy is the policy of a tool that declares none.
func DefaultPolicy() Policy {
	return Policy{Class: ClassUnsafe, Ledger: true, ApprovalTTL: DefaultApprovalTTL, OnAbandoned: AbandonRetry}
}

// parsePolicy reads the policy fields of a tool.
func parsePolicy(s *section) Policy {
	p := DefaultPolicy()
	switch c := Class(s.String("class", string(ClassUnsafe))); c {
	case ClassRead, ClassIdempotent, ClassUnsafe:
		p.Class = c
	default:
		s.Invalid("class", fmt.Sprintf("unknown class %q", c), "use read, idempotent or unsafe")
	}
	p.Ledger = p.Class != ClassRead
	if s.Has("ledger") {
		p.Ledger = s.Bool("ledger", p.Ledger)
		switch {
		case p.Class == ClassUnsafe && !p.Ledger:
			s.Invalid("ledger", "an unsafe tool needs the ledger", "remove ledger: false, or declare class: idempotent if repeats are harmless")
		case p.Class == ClassRead && p.Ledger:
			s.Invalid("ledger", "a read never uses the ledger", "remove ledger, or declare class: idempotent")
		}
	}
	switch a := s.String("approval", "none"); a {
	case "none":
	case "required":
		p.Approval = true
	default:
		s.Invalid("approval", fmt.Sprintf("unknown approval %q", a), "use required or none")
	}
	if s.Has("approval_ttl") {
		p.ApprovalTTL = s.Duration("approval_ttl", DefaultApprovalTTL)
		if !p.Approval {
			s.Invalid("approval_ttl", "is set but approval is not required", "add approval: required or remove approval_ttl")
		} else if p.ApprovalTTL < time.Second {
			s.Invalid("approval_ttl", "must be at least 1s", "write e.g. approval_ttl: 1h")
		}
	}
	if p.Approval && !p.Ledger {
		s.Invalid("approval", "an approval needs the ledger", "remove approval, or use the ledger (class idempotent or unsafe)")
	}
	switch a := Abandon(s.String("on_abandoned", string(AbandonRetry))); a {
	case AbandonRetry, AbandonHold:
		p.OnAbandoned = a
	default:
		s.Invalid("on_abandoned", fmt.Sprintf("unknown policy %q", a), "use retry or hold")
	}
	if s.Has("max_in_flight") {
		p.MaxInFlight = s.Int("max_in_flight", 0)
		if p.MaxInFlight < 1 {
			s.Invalid("max_in_flight", "must be at least 1", "remove it for no cap, or write e.g. max_in_flight: 16")
		}
	}
	if p.OnAbandoned == AbandonHold && !p.Ledger {
		s.Invalid("on_abandoned", "hold needs the ledger", "remove on_abandoned for a tool without the ledger")
	}
	return p
}
