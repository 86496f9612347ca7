package effects

import (
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// DefaultApprovalTTL is how long an approval stays valid when the tools file
// does not say.
const DefaultApprovalTTL = time.Hour

// Policy is how the workers treat a tool's intents.
type Policy struct {
	// Class of the tool. Default intent.ClassUnsafe.
	Class intent.Class
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
	// Default intent.AbandonRetry.
	OnAbandoned intent.Abandon
	// UserApproves names the person at the agent's client as the approver
	// (intent.ApproverUser). Default false: an operator approves.
	UserApproves bool
	// MaxInFlight caps the tool's intents one worker handles at once (those
	// over it are delivered again a little later). Default 0: no cap beyond
	// the worker's concurrency.
	MaxInFlight int
	// OnFailure is what a later call of a failed operation does: replay the
	// failure, or retry (run it again). Default intent.OnFailureReplay.
	OnFailure intent.OnFailure
	// OnComplete is what a later call of a completed operation does: replay
	// the result, or reject it (answered already_done). Default
	// intent.OnCompleteReplay.
	OnComplete intent.OnComplete
}

// SafeToRetry reports whether a caller may repeat the tool's call without a
// key: true for reads and idempotent writes.
func (p Policy) SafeToRetry() bool {
	return p.Class == intent.ClassRead || p.Class == intent.ClassIdempotent
}

// DefaultPolicy is the policy of a tool that declares none.
func DefaultPolicy() Policy {
	return Policy{Class: intent.ClassUnsafe, Ledger: true, ApprovalTTL: DefaultApprovalTTL, OnAbandoned: intent.AbandonRetry,
		OnFailure: intent.OnFailureReplay, OnComplete: intent.OnCompleteReplay}
}
