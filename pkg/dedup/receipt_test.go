package dedup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A ledger WithReceipts stores the receipt of every final outcome it
// writes — a completion, a failure, a denial, a resolution — and answers
// carry it; records that are not final carry none.
func TestReceipts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := jetStream(t, natstest.RunServer(t).ClientURL())
	_, err := dedup.EnsureBucket(ctx, js, dedup.BucketConfig{Bucket: "RECEIPTS"})
	require.NoError(t, err)
	var n atomic.Int32
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "RECEIPTS"}, dedup.Bind(), dedup.WithReceipts(func(_ context.Context, key string, rec dedup.Record) json.RawMessage {
		require.True(t, rec.Status.Final())
		require.False(t, rec.CompletedAt.IsZero())
		return json.RawMessage(fmt.Sprintf(`{"n":%d,"key":%q,"status":%q}`, n.Add(1), key, rec.Status))
	}))
	require.NoError(t, err)
	defer l.Close()

	claim := func(key string) *dedup.Lease {
		c, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "fp", Holder: "w1", Tool: "test"})
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, c.Outcome)
		require.Empty(t, c.Record.Receipt)
		return c.Lease
	}
	done := claim(keyFor(t, "done"))
	require.NoError(t, done.Extend(ctx, time.Minute))
	require.Empty(t, done.Record().Receipt)
	rec, err := done.Complete(ctx, json.RawMessage(`{"ok":true}`), 1)
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(`{"n":1,"key":%q,"status":"completed"}`, keyFor(t, "done")), string(rec.Receipt))
	got, _, err := l.Get(ctx, keyFor(t, "done"))
	require.NoError(t, err)
	require.Equal(t, string(rec.Receipt), string(got.Receipt), "stored as made")
	res := got.Answer(dedup.Caller{Key: keyFor(t, "done"), Fingerprint: "fp"}, true)
	require.Equal(t, string(rec.Receipt), string(res.Receipt), "a replay carries it")
	conflict := got.Answer(dedup.Caller{Key: keyFor(t, "done"), Fingerprint: "other"}, false)
	require.Equal(t, intent.StatusConflict, conflict.Status)
	require.Empty(t, conflict.Receipt, "another operation's receipt is not the conflict's")

	failed := claim(keyFor(t, "failed"))
	rec, err = failed.Fail(ctx, intent.Error{Code: intent.CodeEffectFailed, Message: "no"}, 1)
	require.NoError(t, err)
	require.Contains(t, string(rec.Receipt), `"status":"failed"`)

	parked := claim(keyFor(t, "denied"))
	rec, err = parked.AwaitApproval(ctx, json.RawMessage(`{"tool":"test","args":{}}`))
	require.NoError(t, err)
	require.Empty(t, rec.Receipt)
	require.Empty(t, rec.Answer(dedup.Caller{Key: keyFor(t, "denied")}, false).Receipt)
	rec, _, err = l.Deny(ctx, keyFor(t, "denied"), "ops", "no")
	require.NoError(t, err)
	require.Contains(t, string(rec.Receipt), `"status":"denied"`)
	before := n.Load()
	again, _, err := l.Deny(ctx, keyFor(t, "denied"), "ops", "no")
	require.NoError(t, err)
	require.Equal(t, before, n.Load(), "a decision that changes nothing signs nothing")
	require.Equal(t, string(rec.Receipt), string(again.Receipt))

	approved := claim(keyFor(t, "approved"))
	_, err = approved.AwaitApproval(ctx, json.RawMessage(`{"tool":"test","args":{}}`))
	require.NoError(t, err)
	rec, _, err = l.Approve(ctx, keyFor(t, "approved"), "fp", "ops", "", time.Hour)
	require.NoError(t, err)
	require.Empty(t, rec.Receipt, "an approval is not an outcome")
}
