package worker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
)

// Workers started together on a fresh cluster race to create every stream,
// consumer and bucket, and each becomes ready without any JetStream request
// of its setup going unanswered: the test makes an unanswered request cost
// an hour (and a retry an hour's pause), so a worker that needed one would
// not be ready by the test's deadline. Each worker's time to ready is
// logged (run with -v to read it).
func TestWorkersStartTogetherOnAFreshCluster(t *testing.T) {
	t.Parallel()
	const workers = 3
	servers := natstest.RunCluster(t, workers)
	reg, err := effects.NewRegistry(&effects.Tool{Name: "refund", Effect: noopEffect})
	require.NoError(t, err)
	// The test's deadline, less time to report, bounds the wait.
	ctx := t.Context()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-30*time.Second))
		defer cancel()
	}
	conns := make([]*nats.Conn, workers)
	for i := range conns {
		conns[i] = natstest.Connect(t, servers[i].ClientURL())
	}
	var wg sync.WaitGroup
	start := time.Now()
	for i := range workers {
		wg.Go(func() {
			w, err := New(ctx, conns[i], reg, zaptest.NewLogger(t), Config{Holder: fmt.Sprintf("w%d", i+1), Replicas: 3,
				LedgerScan: NoLedgerScan, setupRequest: time.Hour, setupPause: time.Hour})
			if err != nil {
				t.Errorf("worker %d: %v", i+1, err)
				return
			}
			runCtx, stop := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(runCtx, 5*time.Second) }()
			t.Cleanup(func() { stop(); require.NoError(t, <-done) })
			select {
			case <-w.Ready():
				t.Logf("worker %d ready after %s", i+1, time.Since(start).Round(time.Millisecond))
			case err := <-done:
				t.Errorf("worker %d stopped before it was ready: %v", i+1, err)
			case <-ctx.Done():
				t.Errorf("worker %d not ready by the test's deadline", i+1)
			}
		})
	}
	wg.Wait()
}

// Two first starts with different ledger partition counts race on a fresh
// cluster: the one whose ledger is created first starts, the other refuses,
// naming both counts.
func TestRacingStartsWithOtherPartitionCountsOneRefuses(t *testing.T) {
	t.Parallel()
	servers := natstest.RunCluster(t, 3)
	reg, err := effects.NewRegistry(&effects.Tool{Name: "refund", Effect: noopEffect})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	counts := []int{2, 4}
	errs := make([]error, len(counts))
	var wg sync.WaitGroup
	for i, n := range counts {
		nc := natstest.Connect(t, servers[i].ClientURL())
		wg.Go(func() {
			_, errs[i] = New(ctx, nc, reg, zaptest.NewLogger(t).Named(fmt.Sprintf("w%d", i+1)), Config{Holder: fmt.Sprintf("w%d", i+1), Replicas: 3,
				LedgerPartitions: n, LedgerScan: NoLedgerScan})
		})
	}
	wg.Wait()
	require.True(t, (errs[0] == nil) != (errs[1] == nil), "exactly one starts: %v", errs)
	refused := errs[0]
	if refused == nil {
		refused = errs[1]
	}
	require.ErrorIs(t, refused, dedup.ErrPartitions)
	require.ErrorContains(t, refused, "started with")
}
