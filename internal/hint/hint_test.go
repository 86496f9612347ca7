package hint_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/hint"
	"github.com/idemgate/idemgate/pkg/intent"
)

var door = hint.Door{Check: func(key string) string { return fmt.Sprintf("idemgate_status {\"operation\": %q}", key) }}

// outcomes is every answer a model may read, with its code.
func outcomes() map[string]*intent.Result {
	at := time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC)
	key := "refund.ab12"
	errOf := func(code, msg string) *intent.Error { return &intent.Error{Code: code, Message: msg} }
	return map[string]*intent.Result{
		hint.Completed:        {Key: key, Status: intent.StatusCompleted, CompletedAt: at},
		hint.Replayed:         {Key: key, Status: intent.StatusCompleted, Replayed: true, CompletedAt: at},
		hint.Conflict:         {Key: key, Status: intent.StatusConflict, Fingerprint: "f2", RecordFingerprint: "f1", Error: errOf(intent.CodeConflict, "the key was used with other arguments")},
		hint.AwaitingApproval: {Key: key, Status: intent.StatusAwaitingApproval},
		hint.Approved:         {Key: key, Status: intent.StatusApproved},
		hint.Denied:           {Key: key, Status: intent.StatusDenied, Error: errOf("denied", "not this customer")},
		hint.BudgetExceeded:   {Key: key, Status: intent.StatusRejected, RetryAt: at, Error: errOf(intent.CodeBudgetExceeded, "5 refunds per hour")},
		hint.AlreadyDone:      {Key: key, Status: intent.StatusAlreadyDone, CompletedAt: at, Error: errOf("already_done", "completed")},
		hint.Failed:           {Key: key, Status: intent.StatusFailed, CompletedAt: at, Error: errOf(intent.CodeEffectFailed, "HTTP 500")},
		hint.Uncertain:        {Key: key, Status: intent.StatusUncertain},
		hint.Pending:          {Key: key, Status: intent.StatusPending},
		hint.RateLimited:      {Key: key, Status: intent.StatusRejected, Error: errOf(intent.CodeRateLimited, "over 10 per second")},
		hint.Rejected:         {Key: key, Status: intent.StatusRejected, Error: errOf(intent.CodeInvalidIntent, "amount: missing")},
	}
}

// invitations are phrasings that would have a model change key arguments
// to get past an answer, or call again for an operation that already ran.
var invitations = regexp.MustCompile(`(?i)must differ|differ in its key|use (other|different|new) (key )?arguments|with (a )?(different|new) key|change the key|try again with (other|different)|retry (it|the call)\b`)

// Each code's text says what happened first, and none invites changing key
// arguments or calling again for what already ran.
func TestTextsInviteNoWayAround(t *testing.T) {
	t.Parallel()
	for code, res := range outcomes() {
		h := hint.For(res, door)
		require.Equal(t, code, h.Code, "the code of %s", res.Status)
		require.NotRegexp(t, invitations, h.Text, code)
		require.Regexp(t, `^[A-Z][a-z]+( [a-z]+)*( \([a-z_]+\))?[:,]`, h.Text, "%s: the text starts by saying what happened", code)
		require.NotContains(t, h.Text, "%!", "%s: a formatting slip", code)
	}
}

// The outcomes past which a model must not find its way by other arguments
// say so in words, and answers that send the model back later send it back
// with the same arguments or to the status tool.
func TestTextsSayWhatToDo(t *testing.T) {
	t.Parallel()
	all := outcomes()
	for code, want := range map[string]string{
		hint.Conflict:         "Do not change the arguments to get around this: ask the user",
		hint.Denied:           "Do not call again, with these or other arguments",
		hint.AlreadyDone:      "Do not call again, with these or other arguments",
		hint.BudgetExceeded:   "Do not vary the arguments",
		hint.Uncertain:        "Do not call the tool again, with these or other arguments",
		hint.Replayed:         "its recorded result",
		hint.AwaitingApproval: "must approve",
		hint.Pending:          `idemgate_status {"operation": "refund.ab12"}`,
		hint.RateLimited:      "with the same arguments",
		hint.Failed:           "does not run it again",
	} {
		require.Contains(t, hint.For(all[code], door).Text, want, code)
	}
	retry := door
	retry.RetryFailed = true
	require.Contains(t, hint.For(all[hint.Failed], retry).Text, "runs operation refund.ab12 again")
}

// wrappers are what frameworks make of a tool's answer before the model
// reads it: LangGraph's ToolNode turns a tool error (MCP isError, thrown by
// its MCP adapters) into "Error: <text>\n Please fix your mistakes."; the AI
// SDK and the OpenAI Agents SDK drop isError and pass the text on.
var wrappers = map[string]func(text string, isError bool) string{
	"langgraph": func(text string, isError bool) string {
		if isError {
			return "Error: " + text + "\n Please fix your mistakes."
		}
		return text
	},
	"ai-sdk":     func(text string, _ bool) string { return text },
	"agents-sdk": func(text string, _ bool) string { return text },
}

// Only an answer whose fix is the model's to make (a call refused for its
// input, a failure) is an error: a conflict, a denial, an operation already
// done, over a budget or a rate limit, awaiting approval, uncertain or
// pending reads, after every framework's wrapping, without an invitation to
// fix anything.
func TestTextsReadRightAfterEachFramework(t *testing.T) {
	t.Parallel()
	fix := regexp.MustCompile(`(?i)fix your mistakes`)
	for code, res := range outcomes() {
		h := hint.For(res, door)
		for name, wrap := range wrappers {
			read := wrap(h.Text, hint.Error(h.Code))
			require.Contains(t, read, h.Text, "%s under %s keeps the text whole", code, name)
			require.NotRegexp(t, invitations, read, "%s under %s", code, name)
			switch code {
			case hint.Failed, hint.Rejected:
				require.True(t, hint.Error(code), code)
			default:
				require.False(t, hint.Error(code), "%s is an outcome, not an error", code)
				require.NotRegexp(t, fix, read, "%s under %s", code, name)
			}
		}
	}
	// A failure that a framework asks the model to fix still tells it what
	// a repeat does.
	read := wrappers["langgraph"](hint.For(outcomes()[hint.Failed], door).Text, true)
	require.True(t, strings.HasSuffix(read, "Please fix your mistakes."))
	require.Contains(t, read, "does not run it again")
}
