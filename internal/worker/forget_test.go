package worker

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// After Client.Forget a worker's answer cache no longer answers the key: the
// next intent fires again. Without it the cache replays a record the ledger
// no longer has.
func TestForgetClearsTheAnswerCache(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := start(t, Config{AnswerCache: time.Hour}, &effects.Tool{Name: "create_ticket", Effect: effects.EffectFunc(
		func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
			calls.Add(1)
			return effects.Outcome{Result: json.RawMessage(`{"ticket":"T-1"}`), Invocations: 1}, nil
		})})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := submit(t, b.client, "create_ticket", `{"title":"Disk full"}`)
	require.False(t, first.Replayed)
	require.EqualValues(t, 1, calls.Load())
	key := first.Key
	nc := natstest.Connect(t, b.url)
	// Each later intent is published without a Nats-Msg-Id, so that publish
	// dedup does not hide it: what answers it is the worker's choice.
	again := func() intent.Result {
		return sendRaw(t, nc, "create_ticket", `{"title":"Disk full"}`)
	}

	// The record deleted behind the workers' backs: the cache still answers.
	stored, serr := intent.LedgerKey(key, b.worker.store.Layout())
	require.NoError(t, serr)
	require.NoError(t, ledgerBucket(t, b.worker).Delete(ctx, stored))
	res := again()
	require.True(t, res.Replayed, "answered from the cache")
	require.EqualValues(t, 1, calls.Load())

	// Forget tells the workers (the record is gone already: not found).
	_, err := b.client.Forget(ctx, key)
	require.ErrorIs(t, err, client.ErrNotFound)
	uncached(t, b.worker, key)
	res = again()
	require.Equal(t, intent.StatusCompleted, res.Status)
	require.False(t, res.Replayed, "fired again")
	require.EqualValues(t, 2, calls.Load())

	// Forget of a recorded operation deletes it and clears the cache.
	rec, err := b.client.Forget(ctx, key)
	require.NoError(t, err)
	require.Equal(t, intent.StatusCompleted, rec.Status)
	uncached(t, b.worker, key)
	res = again()
	require.False(t, res.Replayed)
	require.EqualValues(t, 3, calls.Load())
	res = again()
	require.True(t, res.Replayed, "and the new record is replayed as usual")
	require.EqualValues(t, 3, calls.Load())
}

// uncached waits until w's answer cache has no entry for key.
func uncached(t *testing.T, w *Worker, key string) {
	t.Helper()
	require.Eventually(t, func() bool { _, ok := w.answers.get(key); return !ok }, 10*time.Second, 5*time.Millisecond,
		"the worker drops %s from its answer cache", key)
}
