package toolsfile

import (
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// parsePolicy reads the policy fields of a tool.
func parsePolicy(s *section) effects.Policy {
	p := effects.DefaultPolicy()
	switch c := intent.Class(s.String("class", string(intent.ClassUnsafe))); c {
	case intent.ClassRead, intent.ClassIdempotent, intent.ClassUnsafe:
		p.Class = c
	default:
		s.Invalid("class", fmt.Sprintf("unknown class %q", c), "use read, idempotent or unsafe")
	}
	p.Ledger = p.Class != intent.ClassRead
	if s.Has("ledger") {
		p.Ledger = s.Bool("ledger", p.Ledger)
		switch {
		case p.Class == intent.ClassUnsafe && !p.Ledger:
			s.Invalid("ledger", "an unsafe tool needs the ledger", "remove ledger: false, or declare class: idempotent if repeats are harmless")
		case p.Class == intent.ClassRead && p.Ledger:
			s.Invalid("ledger", "a read never uses the ledger", "remove ledger, or declare class: idempotent")
		}
	}
	switch a := intent.Approval(s.String("approval", string(intent.ApprovalNone))); a {
	case intent.ApprovalNone:
	case intent.ApprovalRequired:
		p.Approval = true
	default:
		s.Invalid("approval", fmt.Sprintf("unknown approval %q", a), "use required or none")
	}
	if s.Has("approval_ttl") {
		p.ApprovalTTL = s.Duration("approval_ttl", effects.DefaultApprovalTTL)
		if !p.Approval {
			s.Invalid("approval_ttl", "is set but approval is not required", "add approval: required or remove approval_ttl")
		} else if p.ApprovalTTL < time.Second {
			s.Invalid("approval_ttl", "must be at least 1s", "write e.g. approval_ttl: 1h")
		}
	}
	if p.Approval && !p.Ledger {
		s.Invalid("approval", "an approval needs the ledger", "remove approval, or use the ledger (class idempotent or unsafe)")
	}
	switch a := intent.Abandon(s.String("on_abandoned", string(intent.AbandonRetry))); a {
	case intent.AbandonRetry, intent.AbandonHold:
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
	if s.Has("retention") {
		mark := s.Problems()
		p.Retention = s.Duration("retention", 0)
		switch {
		case s.Problems() > mark:
		case !p.Ledger:
			s.Invalid("retention", "a tool without the ledger keeps no record", "remove retention, or use the ledger (class idempotent or unsafe)")
		case p.Retention < time.Second:
			s.Invalid("retention", "must be at least 1s", "write e.g. retention: 1h, or remove it for the ledger's")
		case p.Retention%time.Second != 0:
			s.Invalid("retention", fmt.Sprintf("%s is not a whole number of seconds", p.Retention), "write e.g. retention: 1h")
		}
	}
	parseBudget(s, &p)
	if p.OnAbandoned == intent.AbandonHold && !p.Ledger {
		s.Invalid("on_abandoned", "hold needs the ledger", "remove on_abandoned for a tool without the ledger")
	}
	switch f := intent.OnFailure(s.String("on_failure", string(intent.OnFailureReplay))); f {
	case intent.OnFailureReplay, intent.OnFailureRetry:
		p.OnFailure = f
	default:
		s.Invalid("on_failure", fmt.Sprintf("unknown policy %q", f), "use replay or retry")
	}
	switch c := intent.OnComplete(s.String("on_complete", string(intent.OnCompleteReplay))); c {
	case intent.OnCompleteReplay, intent.OnCompleteReject:
		p.OnComplete = c
	default:
		s.Invalid("on_complete", fmt.Sprintf("unknown policy %q", c), "use replay or reject")
	}
	for _, f := range []string{"on_failure", "on_complete"} {
		if !p.Ledger && s.Has(f) {
			s.Invalid(f, "a re-run policy needs the ledger: without it every call runs", "remove "+f+" for a tool without the ledger")
		}
	}
	return p
}

// parseBudget reads budget ({per, max, window}) and over_budget.
func parseBudget(s *section, p *effects.Policy) {
	if !s.Has("budget") {
		if s.Has("over_budget") {
			s.String("over_budget", "")
			s.Invalid("over_budget", "is set but the tool has no budget", "add e.g. budget: {per: session, max: 5, window: 1h}, or remove over_budget")
		}
		return
	}
	b := s.Section("budget")
	mark := s.Problems()
	switch per := intent.BudgetScope(b.String("per", string(intent.BudgetPerSession))); per {
	case intent.BudgetPerSession, intent.BudgetPerTool:
		p.Budget.Per = per
	default:
		b.Invalid("per", fmt.Sprintf("unknown scope %q", per), "use session (a count per session) or tool (one count for every caller)")
	}
	switch {
	case !b.Has("max"):
		b.Invalid("", "has no max", "add max: the number of distinct operations a window allows, e.g. budget: {per: session, max: 5, window: 1h}")
	default:
		p.Budget.Max = b.Int("max", 5)
		if p.Budget.Max < 1 || p.Budget.Max > effects.MaxBudget {
			b.Invalid("max", fmt.Sprintf("%d is not from 1 to %d", p.Budget.Max, effects.MaxBudget), "write e.g. max: 5")
		}
	}
	switch {
	case !b.Has("window"):
		b.Invalid("", "has no window", "add window: the period the count covers, e.g. window: 1h")
	default:
		w := b.Duration("window", time.Hour)
		p.Budget.Window = w
		switch {
		case w < time.Second:
			b.Invalid("window", "must be at least 1s", "write e.g. window: 1h")
		case w%time.Second != 0:
			b.Invalid("window", fmt.Sprintf("%s is not a whole number of seconds", w), "write e.g. window: 1h")
		}
	}
	switch o := intent.OverBudget(s.String("over_budget", string(intent.OverBudgetRefuse))); o {
	case intent.OverBudgetRefuse, intent.OverBudgetApprove:
		p.Budget.OverBudget = o
	default:
		s.Invalid("over_budget", fmt.Sprintf("unknown policy %q", o), "use refuse (answered budget_exceeded) or approve (parked for an approval)")
	}
	if !p.Ledger {
		s.Invalid("budget", "a budget counts operations in the ledger", "remove budget, or use the ledger (class idempotent or unsafe)")
	}
	if s.Problems() > mark {
		p.Budget = effects.Budget{}
	}
}
