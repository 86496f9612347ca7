package client_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
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

// A watch of an operation that an operator forgets meanwhile ends, told so,
// with the forgotten record: who forgot it and why.
func TestWatchFinalToldOfAForget(t *testing.T) {
	t.Parallel()
	b := setupAnswers(t)
	const key = "send.parked"
	c, err := b.ledger.Claim(b.ctx, dedup.ClaimRequest{Key: key, Tool: "send", Fingerprint: "fp", Holder: "w1"})
	require.NoError(t, err)
	_, err = c.Lease.AwaitApproval(b.ctx, json.RawMessage(`{"tool":"send","args":{}}`))
	require.NoError(t, err)

	type watched struct {
		rec dedup.Record
		err error
	}
	done := make(chan watched, 1)
	go func() {
		rec, err := b.cl.WatchFinal(b.ctx, key)
		done <- watched{rec, err}
	}()
	// The watch goes on past awaiting_approval; forget it, forced.
	_, err = b.cl.Forget(b.ctx, key, client.Forced(), client.ForgetBy("ops", "asked twice"))
	require.NoError(t, err)
	select {
	case w := <-done:
		require.ErrorIs(t, w.err, client.ErrForgotten)
		require.ErrorContains(t, w.err, "forgotten by ops at")
		require.Equal(t, intent.StatusForgotten, w.rec.Status)
		require.Equal(t, "asked twice", w.rec.Decision.Reason)
	case <-b.ctx.Done():
		t.Fatal("the watch hangs past the forget")
	}
	rec, err := b.cl.Get(b.ctx, key)
	require.NoError(t, err)
	require.Equal(t, "forgotten by ops at "+rec.UpdatedAt.Format(time.RFC3339)+": asked twice", rec.ForgottenText())
}
