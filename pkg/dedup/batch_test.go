package dedup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The suite's tests of many concurrent writes through one ledger: with
// batching, they share atomic batches, and the refusal of one write must not
// change another's answer.
func init() {
	suite = append(suite, concurrencySuite...)
}

var concurrencySuite = []struct {
	name string
	run  func(t *testing.T, b *testBundle)
}{
	{"ManyIntentsOneLedger", func(t *testing.T, b *testBundle) {
		const n = 150
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				req := b.req("w1")
				req.Key = b.sub(strconv.Itoa(i))
				res, err := b.ledger.Claim(b.ctx, req)
				if !assertNoError(t, err) || !assertOutcome(t, dedup.Acquired, res) {
					return
				}
				rec, err := res.Lease.Complete(b.ctx, json.RawMessage(fmt.Sprint(i)), 1)
				if assertNoError(t, err) {
					assert.Equal(t, intent.StatusCompleted, rec.Status)
				}
			})
		}
		wg.Wait()
		for i := range n {
			rec, _, err := b.ledgers[1].Get(b.ctx, b.sub(strconv.Itoa(i)))
			require.NoError(t, err)
			require.Equal(t, intent.StatusCompleted, rec.Status)
			require.JSONEq(t, fmt.Sprint(i), string(rec.Result))
		}
		if b.batched {
			st := b.ledger.BatchStats()
			require.Greater(t, st.BatchedWrites, st.Batches, "some batch carried several writes: %+v", st)
		}
	}},
	{"RefusalsInOneBatch", func(t *testing.T, b *testBundle) {
		// Keys of five kinds, claimed together through one ledger: fresh,
		// completed, deleted (a delete marker), held with other arguments;
		// and stale leases completing next to live ones.
		const n = 20
		key := func(kind string, i int) string { return b.sub(kind + strconv.Itoa(i)) }
		other := b.plain
		stale, live := make([]*dedup.Lease, n), make([]*dedup.Lease, n)
		for i := range n {
			req := b.req("w0")
			req.Key = key("done", i)
			res, err := other.Claim(b.ctx, req)
			require.NoError(t, err)
			_, err = res.Lease.Complete(b.ctx, json.RawMessage(`"old"`), 1)
			require.NoError(t, err)

			req.Key = key("deleted", i)
			_, err = other.Claim(b.ctx, req)
			require.NoError(t, err)
			require.NoError(t, b.kvFor(req.Key).Delete(b.ctx, b.stored(req.Key)))

			req.Key = key("conflict", i)
			req.Fingerprint = "fp-other"
			_, err = other.Claim(b.ctx, req)
			require.NoError(t, err)

		}
		// The leases to complete belong to the ledger under test.
		var wg sync.WaitGroup
		for i := range n {
			for kind, leases := range map[string][]*dedup.Lease{"stale": stale, "live": live} {
				wg.Go(func() {
					req := b.req("w0")
					req.Key = key(kind, i)
					res, err := b.ledger.Claim(b.ctx, req)
					if assertNoError(t, err) && assertOutcome(t, dedup.Acquired, res) {
						leases[i] = res.Lease
					}
				})
			}
		}
		wg.Wait()
		require.False(t, t.Failed())
		later := b.plainAt(2 * time.Minute)
		for i := range n {
			req := b.req("w8")
			req.Key = key("stale", i)
			res, err := later.Claim(b.ctx, req)
			require.NoError(t, err)
			require.Equal(t, dedup.TookOver, res.Outcome)
		}
		before := b.ledger.BatchStats()

		want := map[string]dedup.Outcome{"fresh": dedup.Acquired, "done": dedup.Done, "deleted": dedup.Acquired, "conflict": dedup.Conflict}
		start := make(chan struct{})
		for kind, outcome := range want {
			for i := range n {
				wg.Go(func() {
					req := b.req("w1")
					req.Key = key(kind, i)
					<-start
					res, err := b.ledger.Claim(b.ctx, req)
					if assertNoError(t, err) && assertOutcome(t, outcome, res) && outcome == dedup.Acquired {
						assert.Equal(t, 1, res.Record.Attempt, kind)
					}
				})
			}
		}
		for i := range n {
			wg.Go(func() {
				<-start
				_, err := stale[i].Complete(b.ctx, json.RawMessage(`"stale"`), 1)
				assert.ErrorIs(t, err, dedup.ErrLeaseLost)
			})
			wg.Go(func() {
				<-start
				_, err := live[i].Complete(b.ctx, json.RawMessage(`"live"`), 1)
				assert.NoError(t, err)
			})
		}
		close(start)
		wg.Wait()
		for i := range n {
			rec, rev, err := b.ledgers[2].Get(b.ctx, key("live", i))
			require.NoError(t, err)
			require.Equal(t, live[i].Revision(), rev)
			require.Equal(t, intent.StatusCompleted, rec.Status)
			rec, _, err = b.ledgers[2].Get(b.ctx, key("stale", i))
			require.NoError(t, err)
			require.Equal(t, "w8", rec.Holder, "the new holder's record is intact")
		}
		if b.batched {
			st := b.ledger.BatchStats()
			require.Greater(t, st.Resent, before.Resent, "refusals were answered one by one and the rest re-sent: %+v", st)
		}
	}},
	{"CancelledContext", func(t *testing.T, b *testBundle) {
		ctx, cancel := context.WithCancel(b.ctx)
		cancel()
		_, err := b.ledger.Claim(ctx, b.req("w1"))
		require.ErrorIs(t, err, context.Canceled)
		_, _, err = b.ledger.Get(b.ctx, b.key)
		require.ErrorIs(t, err, dedup.ErrNotFound, "nothing written")
	}},
	{"CloseFlushesAndKeepsWorking", func(t *testing.T, b *testBundle) {
		var wg sync.WaitGroup
		for i := range 30 {
			wg.Go(func() {
				req := b.req("w1")
				req.Key = b.sub(strconv.Itoa(i))
				res, err := b.ledger.Claim(b.ctx, req)
				if assertNoError(t, err) {
					assertOutcome(t, dedup.Acquired, res)
				}
			})
		}
		b.ledger.Close()
		wg.Wait()
		b.ledger.Close()
		ls := b.acquire(t, "w1")
		_, err := ls.Complete(b.ctx, nil, 1)
		require.NoError(t, err)
	}},
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

func assertOutcome(t *testing.T, want dedup.Outcome, res dedup.ClaimResult) bool {
	t.Helper()
	if res.Outcome != want {
		t.Errorf("outcome %s, want %s (record %+v)", res.Outcome, want, res.Record)
		return false
	}
	return true
}

// TestBatchingWithoutAtomicPublish: a batching ledger over a bucket that
// refuses atomic batches still writes, one write at a time.
func TestBatchingWithoutAtomicPublish(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := dedup.EnsureBucket(ctx, js, dedup.BucketConfig{Bucket: "PLAIN"})
	require.NoError(t, err)
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "PLAIN"}, dedup.Bind(), dedup.WithBatching(dedup.BatchConfig{Min: 1}))
	require.NoError(t, err)
	defer l.Close()
	res, err := l.Claim(ctx, dedup.ClaimRequest{Key: "k", Fingerprint: "f", Holder: "h"})
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, res.Outcome)
	_, err = res.Lease.Complete(ctx, nil, 1)
	require.NoError(t, err)
	st := l.BatchStats()
	require.Zero(t, st.Batches)
	require.Equal(t, uint64(2), st.Fallbacks)
	require.Equal(t, uint64(2), st.SingleWrites)
}

func TestAtomicPublishStaysOn(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	allowed := func() bool {
		st, err := js.Stream(ctx, "KV_L")
		require.NoError(t, err)
		return st.CachedInfo().Config.AllowAtomicPublish
	}
	_, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "L"}, dedup.WithBatching(dedup.BatchConfig{}))
	require.NoError(t, err)
	require.True(t, allowed(), "Open with batching allows atomic publish")
	_, err = dedup.EnsureBucket(ctx, js, dedup.BucketConfig{Bucket: "L", TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, allowed(), "a writer without batching does not turn it off")
	st, err := js.Stream(ctx, "KV_L")
	require.NoError(t, err)
	require.True(t, st.CachedInfo().Config.AllowMsgTTL, "the update applied")
}

func TestBatchConfigValidation(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := dedup.BucketConfig{Storage: jetstream.MemoryStorage}
	for name, batch := range map[string]dedup.BatchConfig{
		"MaxTooLarge":      {Max: dedup.MaxBatch + 1},
		"NegativeMax":      {Max: -1},
		"MinAboveMax":      {Max: 10, Min: 11},
		"NegativeMin":      {Min: -1},
		"TooManyInFlight":  {InFlight: 9},
		"NegativeInFlight": {InFlight: -1},
		"NegativeAckWait":  {AckWait: -time.Second},
	} {
		_, err := dedup.Open(ctx, js, cfg, dedup.WithBatching(batch))
		require.ErrorIs(t, err, dedup.ErrInvalid, name)
	}
	l, err := dedup.Open(ctx, js, cfg, dedup.WithBatching(dedup.BatchConfig{Max: 8}))
	require.NoError(t, err, "Min defaults to at most Max")
	l.Close()
	unbatched, err := dedup.Open(ctx, js, cfg)
	require.NoError(t, err)
	unbatched.Close()
	require.Equal(t, dedup.BatchStats{}, unbatched.BatchStats())
}
