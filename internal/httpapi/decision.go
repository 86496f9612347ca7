package httpapi

import (
	"fmt"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// decidedOtherwise says why decision op does not apply to an operation an
// operator decided otherwise (after.Decision is set): who decided it, when
// and why, in the console's words.
func decidedOtherwise(op string, after *dedup.Record) string {
	d := after.Decision
	why := ""
	if d.Reason != "" {
		why = fmt.Sprintf(" (“%s”)", d.Reason)
	}
	return fmt.Sprintf("Not %s: %s by %s at %s%s; the operation is %s. Nothing changed and nothing fired.",
		pastTense(op), capitalized(pastTense(d.Op)), orElse(d.By, "an operator"), d.At.UTC().Format(time.RFC3339), why, statusLabel(after.Status))
}

// pastTense is a decision as done: approve is approved.
func pastTense(op string) string {
	switch op {
	case intent.ControlApprove:
		return "approved"
	case intent.ControlDeny:
		return "denied"
	case intent.ControlResolve:
		return "resolved"
	case intent.ControlProbe:
		return "probed"
	case "forget":
		return "forgotten"
	}
	return op
}

// statusLabel is a status as people say it.
func statusLabel(s intent.Status) string { return strings.ReplaceAll(string(s), "_", " ") }

func orElse(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

func capitalized(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
