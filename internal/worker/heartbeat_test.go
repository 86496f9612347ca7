package worker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/dedup"
)

// countingMsg counts InProgress calls; the heartbeat uses nothing else.
type countingMsg struct {
	jetstream.Msg
	progress atomic.Int32
}

func (m *countingMsg) InProgress() error { m.progress.Add(1); return nil }

func runBeats(t *testing.T) *heartbeats {
	t.Helper()
	hb := newHeartbeats()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); hb.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return hb
}

func TestHeartbeatsKeepManyAlive(t *testing.T) {
	t.Parallel()
	hb := runBeats(t)
	msgs := make([]*countingMsg, 200)
	var extends atomic.Int32
	stops := make([]func(), len(msgs))
	for i := range msgs {
		msgs[i] = &countingMsg{}
		stops[i] = hb.guard(context.Background(), msgs[i], 20*time.Millisecond, time.Minute,
			func(context.Context) error { extends.Add(1); return nil }, func(bool) { t.Error("lost") })
	}
	require.Eventually(t, func() bool {
		for _, m := range msgs {
			if m.progress.Load() < 3 {
				return false
			}
		}
		// Extensions run on their own goroutines, after the beat's
		// InProgress: they may trail it.
		return extends.Load() >= int32(3*len(msgs))
	}, 10*time.Second, 10*time.Millisecond, "every message is kept in progress, and its lease extended")
	for _, stop := range stops {
		stop()
	}
	before := msgs[0].progress.Load()
	time.Sleep(100 * time.Millisecond) // five periods: a stopped beat must stay silent
	require.Equal(t, before, msgs[0].progress.Load())
}

func TestHeartbeatLostLeaseAndDeadline(t *testing.T) {
	t.Parallel()
	hb := runBeats(t)
	lost := make(chan string, 2)
	hb.guard(context.Background(), &countingMsg{}, 10*time.Millisecond, time.Minute,
		func(context.Context) error { return dedup.ErrLeaseLost }, func(cutOff bool) { lost <- fmt.Sprint("taken over ", cutOff) })
	require.Equal(t, "taken over false", <-lost)

	// The ledger never answers: three quarters of a lease past the deadline,
	// the holder gives up.
	start := time.Now()
	held := &countingMsg{}
	stop := hb.guard(context.Background(), held, 10*time.Millisecond, 100*time.Millisecond,
		func(context.Context) error { return errors.New("no responders") }, func(cutOff bool) { lost <- fmt.Sprint("deadline ", cutOff) })
	defer stop()
	require.Equal(t, "deadline true", <-lost)
	require.GreaterOrEqual(t, time.Since(start), 175*time.Millisecond)
	// Cut off, the holder still holds its message: it may yet record.
	n := held.progress.Load()
	require.Eventually(t, func() bool { return held.progress.Load() >= n+3 }, 5*time.Second, 5*time.Millisecond)
	require.Empty(t, lost, "told once")
}

func TestHeartbeatStopWaitsForTheExtension(t *testing.T) {
	t.Parallel()
	hb := runBeats(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	stop := hb.guard(context.Background(), &countingMsg{}, 10*time.Millisecond, time.Minute,
		func(ctx context.Context) error {
			select {
			case entered <- struct{}{}:
			default:
				return nil
			}
			<-release
			finished.Store(true)
			return nil
		}, func(bool) {})
	<-entered
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while an extension was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-stopped
	require.True(t, finished.Load())
}

func TestHeartbeatEndsWithItsContext(t *testing.T) {
	t.Parallel()
	hb := runBeats(t)
	ctx, cancel := context.WithCancel(context.Background())
	m := &countingMsg{}
	stop := hb.hold(ctx, m, 10*time.Millisecond)
	defer stop()
	require.Eventually(t, func() bool { return m.progress.Load() >= 2 }, 5*time.Second, 5*time.Millisecond)
	cancel()
	require.Eventually(t, func() bool {
		hb.mu.Lock()
		defer hb.mu.Unlock()
		return len(hb.queue) == 0
	}, 5*time.Second, 5*time.Millisecond, "a done context removes the beat")
}
