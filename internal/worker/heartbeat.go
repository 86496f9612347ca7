package worker

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup"
)

// heartbeats keeps every intent in flight on a worker alive from one
// goroutine: each beat tells the consumer the intent is in progress every
// period and, for a lease holder, extends the lease. (A goroutine, a ticker
// and a context per intent cost about 9 KiB of stack each: 90 MiB at 10k in
// flight.) Extensions run on their own short-lived goroutines, so a slow one
// delays no other beat.
type heartbeats struct {
	mu    sync.Mutex
	queue beatQueue
	wake  chan struct{}
}

func newHeartbeats() *heartbeats { return &heartbeats{wake: make(chan struct{}, 1)} }

// inProgress is what a beat asks of a message (a jetstream.Msg).
type inProgress interface{ InProgress() error }

// beat is one intent's keep-alive.
type beat struct {
	ctx      context.Context // the beat ends with it, at its next due time
	msg      inProgress
	period   time.Duration
	lease    time.Duration
	extend   func(context.Context) error
	lost     func(cutOff bool)
	next     time.Time // when it is due
	deadline time.Time // the lease's deadline, as of the last successful extension
	index    int       // in the queue; -1 when out of it
	busy     bool      // an extension is running
	cutOff   bool      // lost(true) was called; cleared by a successful extension
	stopped  bool
	running  sync.WaitGroup // the extension in flight
}

// hold calls InProgress on msg every period until ctx is done (seen when
// the beat is next due) or the returned stop is called: a message held this
// way is not delivered again, and no delivery is spent.
func (hb *heartbeats) hold(ctx context.Context, msg inProgress, period time.Duration) (stop func()) {
	return hb.add(&beat{ctx: ctx, msg: msg, period: period})
}

// guard is hold for a lease holder (msg nil: it only extends, the message
// being held otherwise): every period it also extends the lease
// (of length lease) with extend, and stop waits for an extension in flight.
// It calls lost(false) and stops when extend reports dedup.ErrLeaseLost, or
// lost(true) once when three quarters of a lease past the lease's deadline
// (the last successful extension plus lease) have gone by without a
// successful extension — the ledger has been unreachable that long, and
// another claimant may take the key over once it has seen the record
// unchanged for a further lease, so the effect must stop before then. The
// beat goes on after that (the message held, extensions tried): a holder
// that knows its outcome keeps its claim until it can record it. (Not at the deadline
// itself: cancelling a request that reached the downstream can cost a
// repeat, so the holder gives the ledger as long as it safely can to
// return.) An extension in flight is never cancelled by stop: a write
// cancelled mid-way may land without its writer knowing, which would leave
// the holder with a stale revision.
func (hb *heartbeats) guard(ctx context.Context, msg inProgress, period, lease time.Duration, extend func(context.Context) error, lost func(cutOff bool)) (stop func()) {
	return hb.add(&beat{ctx: ctx, msg: msg, period: period, lease: lease, extend: extend, lost: lost})
}

// add schedules b's first beat one period from now.
func (hb *heartbeats) add(b *beat) (stop func()) {
	now := time.Now()
	b.next, b.deadline, b.index = now.Add(b.period), now.Add(b.lease), -1
	hb.mu.Lock()
	heap.Push(&hb.queue, b)
	first := b.index == 0
	hb.mu.Unlock()
	if first {
		hb.poke() // due before the one the scheduler waits for
	}
	// No context.AfterFunc per beat: its registration costs a few hundred
	// bytes per intent in flight; the scheduler checks ctx when the beat is
	// due instead.
	return func() {
		hb.remove(b)
		b.running.Wait()
	}
}

func (hb *heartbeats) poke() {
	select {
	case hb.wake <- struct{}{}:
	default:
	}
}

func (hb *heartbeats) remove(b *beat) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	b.stopped = true
	if b.index >= 0 {
		heap.Remove(&hb.queue, b.index)
	}
}

// run serves the beats until ctx is done.
func (hb *heartbeats) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		hb.mu.Lock()
		wait := time.Hour
		if len(hb.queue) > 0 {
			wait = max(time.Until(hb.queue[0].next), 0)
		}
		hb.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-hb.wake:
			timer.Stop()
			continue
		case <-timer.C:
		}
		for _, b := range hb.due(time.Now()) {
			hb.fire(b)
		}
	}
}

// due pops the beats due at now and puts each back one period later.
func (hb *heartbeats) due(now time.Time) []*beat {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	var out []*beat
	for len(hb.queue) > 0 && !hb.queue[0].next.After(now) {
		b := hb.queue[0]
		out = append(out, b)
		b.next = now.Add(b.period)
		heap.Fix(&hb.queue, 0)
	}
	return out
}

// fire runs one beat: InProgress, and the lease's extension when it is not
// already running.
func (hb *heartbeats) fire(b *beat) {
	if b.ctx.Err() != nil {
		hb.remove(b)
		return
	}
	if b.msg != nil {
		_ = b.msg.InProgress()
	}
	if b.extend == nil {
		return
	}
	hb.mu.Lock()
	switch {
	case b.stopped || b.busy:
		hb.mu.Unlock()
		return
	case !b.cutOff && time.Now().After(b.deadline.Add(b.lease*3/4)):
		// Cut off: the effect must stop, but the holder keeps its message
		// and goes on trying to extend: it may still record its outcome.
		b.cutOff = true
		hb.mu.Unlock()
		b.lost(true)
		hb.mu.Lock()
		if b.stopped {
			hb.mu.Unlock()
			return
		}
	}
	b.busy = true
	b.running.Add(1)
	hb.mu.Unlock()
	go func() {
		defer b.running.Done()
		started := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), b.period)
		err := b.extend(ctx)
		cancel()
		hb.mu.Lock()
		b.busy = false
		if err == nil {
			b.deadline, b.cutOff = started.Add(b.lease), false
		}
		stopped := b.stopped
		hb.mu.Unlock()
		if errors.Is(err, dedup.ErrLeaseLost) && !stopped {
			hb.remove(b)
			b.lost(false)
		}
	}()
}

// beatQueue is a min-heap of beats by due time.
type beatQueue []*beat

func (q beatQueue) Len() int           { return len(q) }
func (q beatQueue) Less(i, j int) bool { return q[i].next.Before(q[j].next) }
func (q beatQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *beatQueue) Push(x any) {
	b := x.(*beat)
	b.index = len(*q)
	*q = append(*q, b)
}
func (q *beatQueue) Pop() any {
	old := *q
	b := old[len(old)-1]
	old[len(old)-1] = nil
	b.index = -1
	*q = old[:len(old)-1]
	return b
}
