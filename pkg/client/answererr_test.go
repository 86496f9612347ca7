package client_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// AnswerErr turns an answer that reports an error into one, and an
// already_done answer into one that matches ErrAlreadyDone.
func TestAnswerErr(t *testing.T) {
	t.Parallel()
	done := &intent.Result{Key: "send.1", Status: intent.StatusAlreadyDone, Replayed: true,
		Error: &intent.Error{Code: intent.CodeAlreadyDone, Message: "the operation already ran"}}
	err := client.AnswerErr(done)
	require.ErrorIs(t, err, client.ErrAlreadyDone)
	var ae *client.AnswerError
	require.True(t, errors.As(err, &ae))
	require.Same(t, done, ae.Result)
	require.Contains(t, err.Error(), "already_done")

	failed := &intent.Result{Key: "send.2", Status: intent.StatusFailed, Error: &intent.Error{Code: intent.CodeEffectFailed, Message: "422"}}
	require.Error(t, client.AnswerErr(failed))
	require.NotErrorIs(t, client.AnswerErr(failed), client.ErrAlreadyDone)

	for _, ok := range []*intent.Result{nil, {Status: intent.StatusCompleted}, {Status: intent.StatusAwaitingApproval},
		{Status: intent.StatusUncertain, Error: &intent.Error{Code: intent.CodeUncertain}}} {
		require.NoError(t, client.AnswerErr(ok))
	}
}
