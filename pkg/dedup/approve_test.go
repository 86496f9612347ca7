package dedup_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// An approval applies to an operation awaiting approval: repeated once it
// fired, it is answered with the firing's record; for an operation that
// never awaited approval (completed on its own) it is the wrong state.
func TestApproveAppliesToWhatAwaitedApproval(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "APPROVE"})
	require.NoError(t, err)
	claim := func(key string) dedup.ClaimResult {
		res, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Tool: "refund", Fingerprint: "fp", Holder: "w1"})
		require.NoError(t, err)
		return res
	}

	done := claim("refund.done")
	_, err = done.Lease.Complete(ctx, json.RawMessage(`{}`), 1)
	require.NoError(t, err)
	_, _, err = l.Approve(ctx, "refund.done", "", "ops", "", time.Hour)
	require.ErrorIs(t, err, dedup.ErrWrongState)
	require.ErrorContains(t, err, "never awaited approval")

	parked := claim("refund.parked")
	_, err = parked.Lease.AwaitApproval(ctx, json.RawMessage(`{}`))
	require.NoError(t, err)
	_, _, err = l.Approve(ctx, "refund.parked", "fp", "ops", "", time.Hour)
	require.NoError(t, err)
	fired := claim("refund.parked")
	require.Equal(t, dedup.Acquired, fired.Outcome)
	_, err = fired.Lease.Complete(ctx, json.RawMessage(`{"refunded":true}`), 1)
	require.NoError(t, err)
	rec, _, err := l.Approve(ctx, "refund.parked", "fp", "ops", "", time.Hour)
	require.NoError(t, err, "an approval repeated is answered with what it let fire")
	require.Equal(t, intent.StatusCompleted, rec.Status)
}
