package worker

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The ledger scan counts every unresolved record by state and age — nothing
// expires them, so none may sit unseen — and gives a final record written
// without a per-message TTL (by an earlier version) its TTL.
func TestLedgerScanCountsUnresolvedAndRetainsUntimed(t *testing.T) {
	t.Parallel()
	b := start(t, Config{LedgerScan: NoLedgerScan, LedgerTTL: 3 * time.Second, DuplicateWindow: time.Second, AnswerCache: NoAnswerCache},
		&effects.Tool{Name: "refund",
			Policy: effects.Policy{Class: intent.ClassUnsafe, Ledger: true, Approval: true, ApprovalTTL: time.Hour, OnAbandoned: intent.AbandonRetry},
			Effect: noopEffect})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := b.worker
	parked := submit(t, b.client, "refund", `{"order":1}`)
	require.Equal(t, intent.StatusAwaitingApproval, parked.Status)
	// A holder that vanished: pending, its lease long over.
	gone, err := w.ledger.Claim(ctx, dedup.ClaimRequest{Key: "refund.gone", Fingerprint: "fp", Holder: "dead", Lease: time.Second})
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, gone.Outcome)
	// A completed record as an earlier version wrote it: no TTL.
	old := dedup.Record{Status: intent.StatusCompleted, Tool: "refund", Fingerprint: "fp", Attempt: 1, Attempts: 1,
		Result: json.RawMessage(`1`), CreatedAt: time.Now().Add(-time.Hour).UTC(), UpdatedAt: time.Now().Add(-time.Hour).UTC(),
		CompletedAt: time.Now().Add(-time.Hour).UTC()}
	data, err := json.Marshal(old)
	require.NoError(t, err)
	_, err = ledgerBucket(t, w).Put(ctx, "refund.untimed", data)
	require.NoError(t, err)

	time.Sleep(1100 * time.Millisecond) // the vanished holder's lease runs out
	require.NoError(t, w.scanRound(ctx, time.Hour))
	require.EqualValues(t, 1, testutil.ToFloat64(w.m.unresolved.WithLabelValues("awaiting_approval", "under_1h")))
	require.EqualValues(t, 1, testutil.ToFloat64(w.m.unresolved.WithLabelValues("pending_past_lease", "under_1h")))
	require.EqualValues(t, 0, testutil.ToFloat64(w.m.unresolved.WithLabelValues("uncertain", "under_1h")))
	require.Greater(t, testutil.ToFloat64(w.m.unresolvedOldest.WithLabelValues("pending_past_lease")), 1.0)
	require.EqualValues(t, 1, testutil.ToFloat64(w.m.retained))
	require.Eventually(t, func() bool {
		_, _, err := w.ledger.Get(ctx, "refund.untimed")
		return errors.Is(err, dedup.ErrNotFound)
	}, 10*time.Second, 50*time.Millisecond, "the untimed final record expires once given its TTL")
	_, _, err = w.ledger.Get(ctx, parked.Key)
	require.NoError(t, err, "the unresolved record stays")

	// Another worker on the same ledger in the same round does not scan:
	// its counts are cleared, so that their sum over workers is the ledger's.
	other := otherWorker(t, b)
	other.m.unresolved.WithLabelValues("awaiting_approval", "under_1h").Set(7)
	require.NoError(t, other.scanRound(ctx, time.Hour))
	require.EqualValues(t, 0, testutil.ToFloat64(other.m.unresolved.WithLabelValues("awaiting_approval", "under_1h")))
	require.EqualValues(t, 0, testutil.ToFloat64(other.m.scans))
}

// ledgerBucket returns the bucket of w's ledger's partition 0, for a test to
// write behind the ledger's back.
func ledgerBucket(t *testing.T, w *Worker) jetstream.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := w.res.js.KeyValue(ctx, w.res.names.Bucket)
	require.NoError(t, err)
	return kv
}

// otherWorker builds (without running it) a second worker on b's server.
func otherWorker(t *testing.T, b testBundle) *Worker {
	t.Helper()
	reg, err := effects.NewRegistry(&effects.Tool{Name: "refund", Effect: noopEffect})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := New(ctx, natstest.Connect(t, b.url), reg, zaptest.NewLogger(t),
		Config{Holder: "other", LedgerScan: NoLedgerScan, LedgerTTL: 3 * time.Second, DuplicateWindow: time.Second, AnswerCache: NoAnswerCache})
	require.NoError(t, err)
	return w
}

var noopEffect = effects.EffectFunc(func(context.Context, effects.Call) (effects.Outcome, error) {
	return effects.Outcome{Result: json.RawMessage(`1`), Invocations: 1}, nil
})

// The scan round spreads a replicated, partitioned ledger's leaders again:
// after a node restart they gather on the nodes that stayed up, and without
// this they would stay there until a worker restarts.
func TestLedgerScanSpreadsPartitionLeaders(t *testing.T) {
	t.Parallel()
	servers := natstest.RunCluster(t, 3)
	reg, err := effects.NewRegistry(&effects.Tool{Name: "refund", Effect: noopEffect})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc := natstest.Connect(t, servers[0].ClientURL())
	w, err := New(ctx, nc, reg, zaptest.NewLogger(t),
		Config{Holder: "w1", Replicas: 3, LedgerPartitions: 8, LedgerScan: NoLedgerScan, AnswerCache: NoAnswerCache})
	require.NoError(t, err)

	// Every leader on one node, as after the other two restarted.
	first := servers[0].Name()
	buckets := w.store.Buckets()
	require.Len(t, buckets, 8)
	kv := ledgerBucket(t, w)
	require.Eventually(t, func() bool {
		// Each try bounded: an API request may go unanswered during an
		// election.
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		leaders, err := w.store.Leaders(ctx)
		if err != nil {
			return false
		}
		all := true
		for i, ld := range leaders {
			if ld != first {
				all = false
				req := []byte(`{"placement":{"preferred":"` + first + `"}}`)
				_, _ = nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN.KV_"+buckets[i], req)
			}
		}
		return all
	}, time.Minute, 200*time.Millisecond, "every leader on %s", first)

	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		_ = kv.Purge(ctx, "_scan") // the election's key: a round of its own each time
		if err := w.scanRound(ctx, time.Hour); err != nil {
			t.Logf("scan: %v", err)
			return false
		}
		leaders, err := w.store.Leaders(ctx)
		if err != nil {
			return false
		}
		load := map[string]int{}
		for _, ld := range leaders {
			load[ld]++
		}
		t.Logf("leaders %v", load)
		return len(load) == 3 && load[first] <= 3
	}, time.Minute, 500*time.Millisecond, "the scan spreads the leaders over the three nodes")
}

// A scan round reads only what was written since the worker's last one,
// and finds what a scan of the whole ledger finds, also after another
// worker made the rounds between.
func TestLedgerScanFindsWhatAWholeScanFinds(t *testing.T) {
	t.Parallel()
	b := start(t, Config{LedgerScan: NoLedgerScan, AnswerCache: NoAnswerCache}, &effects.Tool{Name: "refund", Effect: noopEffect})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, other := b.worker, otherWorker(t, b)
	leases := map[string]*dedup.Lease{}
	claim := func(key string, lease time.Duration) {
		res, err := w.store.Claim(ctx, dedup.ClaimRequest{Key: key, Tool: "refund", Fingerprint: "fp", Holder: "h", Lease: lease})
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)
		leases[key] = res.Lease
	}
	// scan makes s win a round (the last round's election, a second long,
	// runs out first) and requires it to find what a whole scan finds.
	scan := func(s *Worker) {
		t.Helper()
		scans := testutil.ToFloat64(s.m.scans)
		require.Eventually(t, func() bool {
			require.NoError(t, s.scanRound(ctx, time.Second))
			return testutil.ToFloat64(s.m.scans) > scans
		}, 30*time.Second, 50*time.Millisecond, "the worker wins a round")
		now := time.Now()
		got := s.tally(s.tracked.Unresolved(), now)
		want := wholeTally(t, s, now)
		require.Equal(t, want.counts, got.counts)
		require.Equal(t, want.oldest, got.oldest)
		require.Equal(t, want.uncertain, got.uncertain)
	}
	// The oldest record stays as it is: the ledger's first message.
	claim("refund.first", time.Hour)
	for _, key := range []string{"refund.a", "refund.b", "refund.c", "refund.d", "refund.e"} {
		claim(key, time.Minute)
	}
	claim("refund.gone", time.Millisecond) // its holder vanished at once
	scan(w)

	_, err := leases["refund.a"].Complete(ctx, json.RawMessage(`1`), 1)
	require.NoError(t, err)
	_, err = leases["refund.b"].AwaitApproval(ctx, json.RawMessage(`{}`))
	require.NoError(t, err)
	claim("refund.f", time.Minute)
	scan(other)

	_, err = leases["refund.c"].Hold(ctx, "unsure")
	require.NoError(t, err)
	_, _, err = w.store.Approve(ctx, "refund.b", "fp", "op", "fine", time.Hour)
	require.NoError(t, err)
	require.NoError(t, leases["refund.d"].Release(ctx, 1))
	scan(w) // what was written since its last round, the other's round between
	scan(other)
}

// wholeTally is what a scan of w's whole ledger finds at now.
func wholeTally(t *testing.T, w *Worker, now time.Time) scanTally {
	t.Helper()
	want := scanTally{counts: map[[2]string]int{}, oldest: map[string]time.Duration{}}
	require.NoError(t, w.store.Walk(context.Background(), dedup.Query{Statuses: dedup.OpenStatuses}, func(r dedup.Listed) bool {
		state := string(r.Status)
		if r.Status == intent.StatusPending && r.LeaseExpired(now) {
			state = "pending_past_lease"
		}
		if w.probeable(r.Record) && len(want.uncertain) < maxScanProbes {
			want.uncertain = append(want.uncertain, r)
		}
		age := now.Sub(r.UpdatedAt)
		want.counts[[2]string{state, ageLabel(age)}]++
		want.oldest[state] = max(want.oldest[state], age)
		return true
	}))
	return want
}
