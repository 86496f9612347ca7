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
	// Retention is how long the ledger keeps a final record of the tool
	// (completed, failed, denied), and so how long a repeat is answered from
	// it; unresolved records never expire. Default 0: the ledger's (the
	// worker's ledger TTL).
	Retention time.Duration
	// Budget caps the tool's distinct operations per session (or in all)
	// per window; the zero value (Max 0) is no budget.
	Budget Budget
	// OnFailure is what a later call of a failed operation does: replay the
	// failure, or retry (run it again). Default intent.OnFailureReplay.
	OnFailure intent.OnFailure
	// OnComplete is what a later call of a completed operation does: replay
	// the result, or reject it (answered already_done). Default
	// intent.OnCompleteReplay.
	OnComplete intent.OnComplete
}

// MaxBudget is the largest Budget.Max: each operation counted in a window
// is kept in its count, so that a repeat never counts twice.
const MaxBudget = 1000

// Budget is a tool's effect budget: at most Max distinct operations per
// scope in each Window. The operation over it is answered budget_exceeded
// and never fired, or parked for approval (OverBudget).
type Budget struct {
	// Per is what the count is kept over. Default intent.BudgetPerSession.
	Per intent.BudgetScope
	// Max is how many distinct operations a window allows, 1 to MaxBudget;
	// 0 for no budget.
	Max int
	// Window is the length of a window, whole seconds; windows start at
	// its multiples since the Unix epoch.
	Window time.Duration
	// OverBudget is what happens to an operation over the budget. Default
	// intent.OverBudgetRefuse.
	OverBudget intent.OverBudget
}

// Info is the budget as the catalogue reports it; nil for no budget.
func (b Budget) Info() *intent.Budget {
	if b.Max == 0 {
		return nil
	}
	return &intent.Budget{Per: b.Per, Max: b.Max, WindowSeconds: int64(b.Window / time.Second), OverBudget: b.OverBudget}
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
