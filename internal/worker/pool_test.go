package worker

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The pool runs at most max handlers at once and queues the rest.
func TestHandlerPoolBoundsAndQueues(t *testing.T) {
	t.Parallel()
	p := newHandlerPool(2, time.Hour)
	defer p.close()
	release := make(chan struct{})
	var running, peak atomic.Int32
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		p.run(func(*poolRun) {
			defer wg.Done()
			n := running.Add(1)
			for old := peak.Load(); n > old && !peak.CompareAndSwap(old, n); old = peak.Load() {
			}
			<-release
			running.Add(-1)
		})
	}
	require.Eventually(t, func() bool { return running.Load() == 2 }, 5*time.Second, time.Millisecond)
	g, q := p.size()
	require.Equal(t, 2, g)
	require.Equal(t, 4, q)
	close(release)
	wg.Wait()
	require.EqualValues(t, 2, peak.Load())
	g, q = p.size()
	require.Equal(t, 2, g, "the goroutines stay, idle")
	require.Zero(t, q)
}

// Queued handlers run in the order they came.
func TestHandlerPoolQueueIsInOrder(t *testing.T) {
	t.Parallel()
	p := newHandlerPool(1, time.Hour)
	defer p.close()
	release := make(chan struct{})
	var order []int // one goroutine runs them all, one after another
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		p.run(func(*poolRun) {
			defer wg.Done()
			if i == 0 {
				<-release
			}
			order = append(order, i)
		})
	}
	close(release)
	wg.Wait()
	require.Equal(t, []int{0, 1, 2, 3, 4}, order)
}

// A handler that detaches before a long wait lets the queued ones run.
func TestHandlerPoolDetachedWaitDoesNotStarve(t *testing.T) {
	t.Parallel()
	p := newHandlerPool(1, time.Hour)
	defer p.close()
	wait := make(chan struct{})
	defer close(wait) // before close: the detached handler returns
	ran := make(chan struct{})
	p.run(func(r *poolRun) {
		r.detach()
		<-wait
	})
	p.run(func(*poolRun) { close(ran) })
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler queued behind a detached wait did not run")
	}
}

// Idle goroutines past the idle time exit; close waits for the others.
func TestHandlerPoolReapsAndCloses(t *testing.T) {
	t.Parallel()
	p := newHandlerPool(4, time.Minute)
	// Three handlers running at once, each on a goroutine of its own (one
	// that finished first would be handed the next).
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 3 {
		wg.Add(1)
		p.run(func(*poolRun) { wg.Done(); <-release })
	}
	wg.Wait()
	close(release)
	require.Eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return len(p.idle) == 3 }, 5*time.Second, time.Millisecond)
	p.reap(time.Now()) // none idle a minute yet
	g, _ := p.size()
	require.Equal(t, 3, g)
	p.reap(time.Now().Add(2 * time.Minute))
	g, _ = p.size()
	require.Zero(t, g)

	block := make(chan struct{})
	finished := make(chan struct{})
	p.run(func(*poolRun) { <-block; close(finished) })
	closed := make(chan struct{})
	go func() { p.close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("close returned while a handler ran")
	case <-time.After(50 * time.Millisecond):
	}
	close(block)
	<-closed
	select {
	case <-finished:
	default:
		t.Fatal("close returned before the handler finished")
	}
}
