// Package hint writes what a model reads about an operation's outcome: one
// text per outcome, and a machine-readable code, for every door that answers
// a model (the MCP server's tool results, the HTTP front door's answers).
//
// Each text says plainly what happened and what to do next. None invites
// changing key arguments to get past a conflict, nor calling again for an
// operation that already ran: frameworks wrap a tool's answer in their own
// words (LangGraph ends a tool error with "Please fix your mistakes."; the
// AI SDK and the OpenAI Agents SDK pass an error's text on as an ordinary
// result), and the text must still steer the model right after any of them.
// Error reports which outcomes are errors of the call itself, which a
// framework may ask the model to fix.
package hint

import (
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Codes of a Hint: what the answer reports.
const (
	Completed        = "completed"         // the operation ran once; this call ran it
	Replayed         = "replayed"          // the operation had already run; this is its recorded result
	Conflict         = "conflict"          // the key was used with other arguments; nothing was done
	AwaitingApproval = "awaiting_approval" // a person must approve before it runs
	Approved         = "approved"          // approved, running
	Denied           = "denied"            // refused by its approver; it never runs
	BudgetExceeded   = "budget_exceeded"   // over the tool's budget; nothing was done
	AlreadyDone      = "already_done"      // the operation ran; this tool refuses to answer it again as a success
	Failed           = "failed"            // the operation failed; the failure is recorded
	Uncertain        = "uncertain"         // interrupted mid-way; an operator settles it
	Pending          = "pending"           // not finished, or its outcome not learnt yet
	Rejected         = "rejected"          // the call was refused before anything was done (bad input)
	RateLimited      = "rate_limited"      // the caller is over a rate limit; nothing was done
)

// Hint is what a model reads about an answer: Code for programs, Text for
// the model. It is the "hint" member of an MCP tool result's structured
// content and of the HTTP front door's answers; Text is, byte for byte, the
// text item an MCP result carries after its JSON.
type Hint struct {
	Code string `json:"code"`
	Text string `json:"text"`
}

// Door is how a door lets its reader follow an operation up.
type Door struct {
	// Check is how to read the operation key's state later, e.g.
	// `idemgate_status {"operation": "K"}` or `GET /v1/operations/K`.
	Check func(key string) string
	// RetryFailed is set for a tool that runs a failed operation again
	// when it is called again (on_failure: retry).
	RetryFailed bool
}

// For is the hint of an operation's answer at door d.
func For(res *intent.Result, d Door) Hint {
	code, msg := "", ""
	if res.Error != nil {
		code, msg = res.Error.Code, res.Error.Message
	}
	key := res.Key
	switch res.Status {
	case intent.StatusCompleted:
		if res.Replayed {
			return Hint{Replayed, fmt.Sprintf("Already done, not repeated: operation %s completed at %s, run by an earlier call; the result above is its recorded result. "+
				"Do not call the tool again for this operation.", key, when(res.CompletedAt))}
		}
		return Hint{Completed, fmt.Sprintf("Completed: operation %s ran once, at %s; its result is above.", key, when(res.CompletedAt))}
	case intent.StatusAwaitingApproval:
		return Hint{AwaitingApproval, fmt.Sprintf("Awaiting approval: nothing has run yet. A person must approve operation %s before it runs. "+
			"Tell the user it awaits their approval. Do not change its arguments to hurry it; check it later with %s, or call again later with the same arguments.", key, d.Check(key))}
	case intent.StatusApproved:
		return Hint{Approved, fmt.Sprintf("Approved and running: operation %s has not finished yet. Do not call the tool again; check it later with %s.", key, d.Check(key))}
	case intent.StatusPending:
		return Still(key, d)
	case intent.StatusUncertain:
		return Hint{Uncertain, fmt.Sprintf("Uncertain: operation %s was interrupted while it ran and may or may not have happened. An operator settles it. "+
			"Do not call the tool again, with these or other arguments; tell the user, and check it later with %s.", key, d.Check(key))}
	case intent.StatusAlreadyDone:
		return Hint{AlreadyDone, fmt.Sprintf("Already done: operation %s ran and completed at %s. This tool runs an operation only once, so this call did nothing; "+
			"the recorded result is above. Do not call again, with these or other arguments; if the user wants it done again, ask them.", key, when(res.CompletedAt))}
	case intent.StatusConflict:
		prints := ""
		if res.RecordFingerprint != "" {
			prints = fmt.Sprintf(" (its fingerprint %s, this call's %s)", res.RecordFingerprint, res.Fingerprint)
		}
		return Hint{Conflict, fmt.Sprintf("Conflict: nothing was done. Operation %s was already called with other arguments%s, and every call with these arguments is refused the same way. "+
			"Do not change the arguments to get around this: ask the user what they intend. If they meant the recorded operation, it already happened (check it with %s); "+
			"make a different call only if the user asks for a different operation.", key, prints, d.Check(key))}
	case intent.StatusDenied:
		return Hint{Denied, fmt.Sprintf("Denied: operation %s was refused by its approver (%s). Nothing was done and it will not run. "+
			"Do not call again, with these or other arguments, to get around it; tell the user.", key, msg)}
	case intent.StatusFailed:
		if d.RetryFailed {
			return Hint{Failed, fmt.Sprintf("Failed (%s): %s. This tool runs a failed operation again: calling again with the same arguments runs operation %s again, "+
				"so do it only once the cause is fixed; tell the user.", code, msg, key)}
		}
		return Hint{Failed, fmt.Sprintf("Failed (%s): %s. This outcome is recorded for operation %s: calling again with the same arguments returns this failure and does not run it again. "+
			"Tell the user; call again with other arguments only if this failure says the arguments were wrong.", code, msg, key)}
	case intent.StatusRejected:
		switch code {
		case intent.CodeBudgetExceeded:
			return Hint{BudgetExceeded, fmt.Sprintf("Over budget (budget_exceeded): %s. Nothing was done and nothing was recorded. Do not vary the arguments to get around it: "+
				"every distinct call counts. The same call may run from %s; tell the user, or call again with the same arguments then.", msg, when(res.RetryAt))}
		case intent.CodeRateLimited:
			return Hint{RateLimited, fmt.Sprintf("Rate limited: %s. Nothing was done; call again later with the same arguments.", msg)}
		}
		return Refused(fmt.Sprintf("Rejected (%s): %s. Nothing was done; fix the call before calling again.", code, msg))
	}
	return Hint{Pending, fmt.Sprintf("Operation %s is %s (%s: %s). Do not call the tool again; check it later with %s.", key, res.Status, code, msg, d.Check(key))}
}

// Still is the hint of an operation whose wait ran out: it goes on.
func Still(key string, d Door) Hint {
	return Hint{Pending, fmt.Sprintf("Still running: operation %s has not finished yet and goes on. Do not call the tool again; check it later with %s.", key, d.Check(key))}
}

// Unknown is the hint of a call whose outcome the door could not learn
// (text says why): it may run once, and calling again is safe.
func Unknown(text string) Hint { return Hint{Pending, text} }

// Refused is the hint of a call refused before anything was done (text
// says why and what to fix).
func Refused(text string) Hint { return Hint{Rejected, text} }

// Error reports whether an answer of code is an error of the call itself,
// which the caller fixes (a rejected call) or which ran and failed: only
// these are tool errors (MCP isError). A conflict, a denial, an operation
// already done, over budget or a rate limit, awaiting approval, uncertain or
// pending is an
// outcome to report, not a mistake to fix: a framework that asks the model
// to fix a tool error must not be given one, as the fix it invites (other
// arguments) is a new operation.
func Error(code string) bool { return code == Failed || code == Rejected }

func when(t time.Time) string {
	if t.IsZero() {
		return "an earlier time"
	}
	return t.UTC().Format(time.RFC3339)
}
