package worker

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

var _ ledger = dedupLedger{}

// The unit tests' memLedger keeps the contract the stages rely on, as the
// JetStream ledger a worker opens does: every case runs on both.
func TestLedgerContract(t *testing.T) {
	t.Parallel()
	ledgers := []struct {
		name string
		open func(t *testing.T) ledger
	}{
		{"memory", func(*testing.T) ledger { return newMemLedger() }},
		{"jetstream", jetStreamLedger},
	}
	for _, lg := range ledgers {
		t.Run(lg.name, func(t *testing.T) {
			t.Parallel()
			l := lg.open(t)
			for _, c := range ledgerContract {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t, l, "send."+c.name)
				})
			}
		})
	}
}

// jetStreamLedger is the ledger a worker opens (New) on an embedded
// JetStream.
func jetStreamLedger(t *testing.T) ledger {
	s := natstest.RunServer(t)
	reg, err := effects.NewRegistry(&effects.Tool{Name: "send", Effect: noopEffect})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := New(ctx, natstest.Connect(t, s.ClientURL()), reg, zaptest.NewLogger(t),
		Config{LedgerBatch: NoLedgerBatch, DisableAudit: true, LedgerScan: NoLedgerScan})
	require.NoError(t, err)
	t.Cleanup(w.store.Close)
	return w.ledger
}

// ledgerContract are the cases of TestLedgerContract; each uses its own key.
var ledgerContract = []struct {
	name string
	run  func(t *testing.T, l ledger, key string)
}{
	{"create-only", func(t *testing.T, l ledger, key string) {
		first := claimAs(t, l, key, "h1", "fp", time.Minute, 0)
		require.Equal(t, dedup.Acquired, first.Outcome)
		require.NotNil(t, first.Lease)
		second := claimAs(t, l, key, "h2", "fp", time.Minute, 0)
		require.Equal(t, dedup.Busy, second.Outcome, "the key has a live holder")
		require.Nil(t, second.Lease)
		require.Equal(t, "h1", second.Record.Holder)
	}},
	{"conflict", func(t *testing.T, l ledger, key string) {
		claimAs(t, l, key, "h1", "fp1", time.Minute, 0)
		other := claimAs(t, l, key, "h2", "fp2", time.Minute, 0)
		require.Equal(t, dedup.Conflict, other.Outcome)
		require.Equal(t, "fp1", other.Record.Fingerprint)
	}},
	{"done", func(t *testing.T, l ledger, key string) {
		c := claimAs(t, l, key, "h1", "fp", time.Minute, 0)
		rec, err := c.Lease.Complete(t.Context(), json.RawMessage(`"ok"`), 1)
		require.NoError(t, err)
		require.Equal(t, intent.StatusCompleted, rec.Status)
		again := claimAs(t, l, key, "h2", "fp", time.Minute, 0)
		require.Equal(t, dedup.Done, again.Outcome)
		require.JSONEq(t, `"ok"`, string(again.Record.Result))
		require.ErrorIs(t, c.Lease.Extend(t.Context(), time.Minute), dedup.ErrLeaseDone)
	}},
	{"release", func(t *testing.T, l ledger, key string) {
		c := claimAs(t, l, key, "h1", "fp", time.Minute, 0)
		require.NoError(t, c.Lease.Release(t.Context(), 1))
		rec, _, err := l.Wait(t.Context(), key)
		require.NoError(t, err, "a waiter sees the key released")
		require.True(t, rec.Released())
		retry := claimAs(t, l, key, "h2", "fp", time.Minute, 0)
		require.Equal(t, dedup.Acquired, retry.Outcome, "a released key is nobody's")
		require.Equal(t, 2, retry.Record.Attempt)
		require.Equal(t, 1, retry.Record.Attempts)
	}},
	{"takeover-confirmed", func(t *testing.T, l ledger, key string) {
		c := claimAs(t, l, key, "h1", "fp", time.Second, 0)
		rec, rev, err := l.Wait(t.Context(), key) // the lease expires
		require.NoError(t, err)
		require.True(t, rec.LeaseExpired(time.Now()))
		unconfirmed := claimAs(t, l, key, "h2", "fp", time.Minute, 0)
		require.Equal(t, dedup.Busy, unconfirmed.Outcome, "an expired lease is not taken over unconfirmed")
		require.Equal(t, rev, unconfirmed.Revision)
		took := claimAs(t, l, key, "h2", "fp", time.Minute, rev)
		require.Equal(t, dedup.TookOver, took.Outcome)
		require.Equal(t, "h1", took.Previous.Holder)
		require.Equal(t, 2, took.Record.Attempt)
		_, err = c.Lease.Complete(t.Context(), json.RawMessage(`1`), 1)
		require.ErrorIs(t, err, dedup.ErrLeaseLost, "the old holder's write is a CAS on its revision")
	}},
	{"retry-failed", func(t *testing.T, l ledger, key string) {
		c := claimAs(t, l, key, "h1", "fp", time.Minute, 0)
		_, err := c.Lease.Fail(t.Context(), intent.Error{Code: intent.CodeEffectFailed, Message: "no"}, 1)
		require.NoError(t, err)
		require.Equal(t, dedup.Done, claimAs(t, l, key, "h2", "fp", time.Minute, 0).Outcome, "a failure answers a claim that does not retry")
		conflict, err := l.Claim(t.Context(), dedup.ClaimRequest{Key: key, Tool: "send", Fingerprint: "other", Holder: "h2", RetryFailed: true})
		require.NoError(t, err)
		require.Equal(t, dedup.Conflict, conflict.Outcome, "other arguments never retry")
		retry, err := l.Claim(t.Context(), dedup.ClaimRequest{Key: key, Tool: "send", Fingerprint: "fp", Holder: "h2", Lease: time.Minute, RetryFailed: true})
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, retry.Outcome, "a failure is taken over by a claim that retries failures")
		require.Equal(t, intent.StatusPending, retry.Record.Status)
		require.Nil(t, retry.Record.Error)
		require.Equal(t, 2, retry.Record.Attempt)
		require.Equal(t, 1, retry.Record.Attempts)
		again, err := l.Claim(t.Context(), dedup.ClaimRequest{Key: key, Tool: "send", Fingerprint: "fp", Holder: "h3", Lease: time.Minute, RetryFailed: true})
		require.NoError(t, err)
		require.Equal(t, dedup.Busy, again.Outcome, "one retry at a time: the retry holds the key")
		rec, err := retry.Lease.Complete(t.Context(), json.RawMessage(`"ok"`), 2)
		require.NoError(t, err)
		require.Equal(t, intent.StatusCompleted, rec.Status)
	}},
	{"forgotten", func(t *testing.T, l ledger, key string) {
		c := claimAs(t, l, key, "h1", "fp", time.Minute, 0)
		_, err := c.Lease.Complete(t.Context(), json.RawMessage(`"ok"`), 1)
		require.NoError(t, err)
		forget(t, l, key)
		rec, _, err := l.Wait(t.Context(), key)
		require.ErrorIs(t, err, dedup.ErrForgotten, "a waiter is told the operation was forgotten")
		require.ErrorIs(t, err, dedup.ErrReleased, "and claims again")
		require.Equal(t, intent.StatusForgotten, rec.Status)
		again := claimAs(t, l, key, "h2", "other", time.Minute, 0)
		require.Equal(t, dedup.Acquired, again.Outcome, "a forgotten key is claimed anew, whatever the arguments")
		require.Equal(t, 1, again.Record.Attempt)
		require.Equal(t, "other", again.Record.Fingerprint)
	}},
	{"wait-change", func(t *testing.T, l ledger, key string) {
		c := claimAs(t, l, key, "h1", "fp", time.Minute, 0)
		grace, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		changed, err := l.WaitChange(grace, key, c.Revision)
		require.NoError(t, err)
		require.False(t, changed, "nothing wrote the key during the grace")
		require.NoError(t, c.Lease.Extend(t.Context(), time.Minute))
		changed, err = l.WaitChange(t.Context(), key, c.Revision)
		require.NoError(t, err)
		require.True(t, changed)
	}},
	{"wait", func(t *testing.T, l ledger, key string) {
		c := claimAs(t, l, key, "h1", "fp", time.Minute, 0)
		waited := make(chan dedup.Record, 1)
		go func() {
			rec, _, err := l.Wait(t.Context(), key)
			assert(t, err)
			waited <- rec
		}()
		_, err := c.Lease.Fail(t.Context(), intent.Error{Code: intent.CodeEffectFailed, Message: "no"}, 1)
		require.NoError(t, err)
		rec := <-waited
		require.Equal(t, intent.StatusFailed, rec.Status)
		_, _, err = l.Get(t.Context(), "send.nothing-"+key[len("send."):])
		require.ErrorIs(t, err, dedup.ErrNotFound)
	}},
	{"approval", func(t *testing.T, l ledger, key string) {
		c := claimAs(t, l, key, "h1", "fp", time.Minute, 0)
		parked, err := c.Lease.AwaitApproval(t.Context(), json.RawMessage(`{"tool":"send","args":{}}`))
		require.NoError(t, err)
		require.Equal(t, intent.StatusAwaitingApproval, parked.Status)
		require.Equal(t, dedup.Done, claimAs(t, l, key, "h2", "fp", time.Minute, 0).Outcome, "awaiting approval answers")
		_, _, err = l.Approve(t.Context(), key, "other", "ops", "", time.Hour)
		require.ErrorIs(t, err, dedup.ErrFingerprintMismatch)
		rec, _, err := l.Approve(t.Context(), key, "fp", "ops", "", time.Hour)
		require.NoError(t, err)
		require.Equal(t, intent.StatusApproved, rec.Status)
		fire := claimAs(t, l, key, "h2", "fp", time.Minute, 0)
		require.Equal(t, dedup.Acquired, fire.Outcome)
		require.True(t, fire.Record.Approved(time.Now()))
		_, _, err = l.Deny(t.Context(), key, "ops", "too late")
		require.ErrorIs(t, err, dedup.ErrWrongState, "a firing is not denied")
	}},
	{"deny", func(t *testing.T, l ledger, key string) {
		c := claimAs(t, l, key, "h1", "fp", time.Minute, 0)
		_, err := c.Lease.AwaitApproval(t.Context(), json.RawMessage(`{"tool":"send","args":{}}`))
		require.NoError(t, err)
		rec, _, err := l.Deny(t.Context(), key, "ops", "no")
		require.NoError(t, err)
		require.Equal(t, intent.StatusDenied, rec.Status)
		require.Equal(t, intent.CodeDenied, rec.Error.Code)
	}},
	{"resolve", func(t *testing.T, l ledger, key string) {
		c := claimAs(t, l, key, "h1", "fp", time.Minute, 0)
		held, err := c.Lease.Hold(t.Context(), "it may have happened")
		require.NoError(t, err)
		require.Equal(t, intent.StatusUncertain, held.Status)
		require.Equal(t, intent.CodeUncertain, held.Error.Code)
		require.Equal(t, dedup.Done, claimAs(t, l, key, "h2", "fp", time.Minute, 0).Outcome, "uncertain answers")
		rec, _, err := l.Resolve(t.Context(), key, true, json.RawMessage(`"done"`), "ops", "checked")
		require.NoError(t, err)
		require.Equal(t, intent.StatusCompleted, rec.Status)
		_, _, err = l.Resolve(t.Context(), key, true, nil, "ops", "again")
		require.ErrorIs(t, err, dedup.ErrWrongState)
	}},
}

// forget forgets key's final record as an operator does: the JetStream
// ledger's Forget; the memory ledger writes the same forgotten record.
func forget(t *testing.T, l ledger, key string) {
	t.Helper()
	switch l := l.(type) {
	case dedupLedger:
		_, err := l.Forget(t.Context(), key, dedup.ForgetBy("ops", "test"))
		require.NoError(t, err)
	case *memLedger:
		rec, _, err := l.Get(t.Context(), key)
		require.NoError(t, err)
		now := time.Now().UTC()
		l.set(key, dedup.Record{Status: intent.StatusForgotten, Tool: rec.Tool, Fingerprint: rec.Fingerprint, Attempt: rec.Attempt,
			Attempts: rec.Attempts, Decision: &dedup.Decision{Op: intent.ControlForget, By: "ops", Reason: "test", At: now},
			CreatedAt: rec.CreatedAt, UpdatedAt: now})
	default:
		t.Fatalf("no forget for %T", l)
	}
}

// claimAs claims key for holder with fingerprint fp and lease, confirming
// the abandoned revision confirmed (0: none).
func claimAs(t *testing.T, l ledger, key, holder, fp string, lease time.Duration, confirmed uint64) claim {
	t.Helper()
	c, err := l.Claim(t.Context(), dedup.ClaimRequest{Key: key, Tool: "send", Fingerprint: fp, Holder: holder, Lease: lease, Confirmed: confirmed})
	require.NoError(t, err)
	return c
}

// assert reports err on a goroutine other than the test's.
func assert(t *testing.T, err error) {
	if err != nil {
		t.Error(err)
	}
}
