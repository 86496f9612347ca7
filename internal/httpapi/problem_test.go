package httpapi

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

func TestAnswerStatus(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status, code string
		want         int
	}{
		{"completed", "", 200}, {"awaiting_approval", "", 202}, {"uncertain", "uncertain", 202},
		{"conflict", "conflict", 422}, {"failed", "effect_failed", 502}, {"denied", "denied", 403},
		{"rejected", "invalid_intent", 400}, {"rejected", "unknown_tool", 404}, {"rejected", "too_large", 413},
		{"rejected", "rate_limited", 429}, {"rejected", "wrong_state", 409}, {"rejected", "not_found", 404},
		{"rejected", "tool_mismatch", 400}, {"rejected", "budget_exceeded", 429},
	} {
		res := resultOf(c.status, c.code)
		got, problem := answerStatus(&res)
		require.Equal(t, c.want, got, "%s %s", c.status, c.code)
		require.Equal(t, c.want >= 400, problem)
	}
}

func resultOf(status, code string) intent.Result {
	res := intent.Result{Status: intent.Status(status)}
	if code != "" {
		res.Error = &intent.Error{Code: code}
	}
	return res
}
