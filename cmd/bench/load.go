package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// publisher sends prepared intent messages with asynchronous JetStream
// publishes and receives the answers on one wildcard reply subscription: the
// i-th message names reply subject <inbox>.<i>.
type publisher struct {
	nc *nats.Conn
	js jetstream.JetStream

	mu     sync.Mutex
	pubErr error // first failed publish
}

// newPublisher returns a publisher on nc. inflight is how many intents it
// keeps unanswered: an answer can come before its publish acknowledgement,
// so up to twice as many acknowledgements may be pending.
func newPublisher(nc *nats.Conn, inflight int) (*publisher, error) {
	p := &publisher{nc: nc}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(max(2*inflight, 1024)),
		jetstream.WithPublishAsyncTimeout(time.Minute),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.pubErr == nil {
				p.pubErr = fmt.Errorf("publish %s: %w", m.Subject, err)
			}
		}))
	if err != nil {
		return nil, err
	}
	p.js = js
	return p, nil
}

func (p *publisher) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pubErr
}

// batch is a set of prepared messages and the reply inbox they name.
type batch struct {
	inbox string
	msgs  []*nats.Msg
}

// newBatch prepares n messages: subject and data per index, a reply header
// naming <inbox>.<i>, and Nats-Msg-Id when msgID returns one.
func newBatch(n int, replyHeader string, subject func(i int) string, data func(i int) []byte, msgID func(i int) string) batch {
	b := batch{inbox: "_INBOX.bench." + nuid.Next(), msgs: make([]*nats.Msg, n)}
	for i := range n {
		m := nats.NewMsg(subject(i))
		m.Data = data(i)
		m.Header.Set(replyHeader, b.inbox+"."+strconv.Itoa(i))
		if msgID != nil {
			m.Header.Set(jetstream.MsgIDHeader, msgID(i))
		}
		b.msgs[i] = m
	}
	return b
}

// answers collects the answers of one batch.
type answers struct {
	n      int
	check  func([]byte) error
	onRecv func(i int, at time.Time)
	done   chan struct{}

	// Only the subscription's callback goroutine writes these until done is
	// closed (or the subscription is drained).
	seen    []bool
	count   int
	last    time.Time
	badErr  error
	extra   int // answers to an index already answered
	unknown int

	answered atomic.Int64 // count, for reading while answers arrive
}

func (a *answers) handle(m *nats.Msg) {
	at := time.Now()
	i, err := strconv.Atoi(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:])
	if err != nil || i < 0 || i >= a.n {
		a.unknown++
		return
	}
	if a.seen[i] {
		a.extra++
		return
	}
	a.seen[i] = true
	if a.check != nil && a.badErr == nil {
		if err := a.check(m.Data); err != nil {
			a.badErr = fmt.Errorf("answer %d: %w", i, err)
		}
	}
	if a.onRecv != nil {
		a.onRecv(i, at)
	}
	a.count++
	a.answered.Add(1)
	a.last = at
	if a.count == a.n {
		close(a.done)
	}
}

// subscribe starts receiving b's answers; stop drains the subscription.
func (p *publisher) subscribe(b batch, a *answers) (stop func(), err error) {
	a.n = len(b.msgs)
	a.seen = make([]bool, a.n)
	a.done = make(chan struct{})
	sub, err := p.nc.Subscribe(b.inbox+".*", a.handle)
	if err != nil {
		return nil, err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// wait waits for every answer of a, a publish error, or ctx.
func (p *publisher) wait(ctx context.Context, a *answers) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-a.done:
			if a.badErr != nil {
				return a.badErr
			}
			return nil
		case <-t.C:
			if err := p.err(); err != nil {
				return err
			}
		case <-ctx.Done():
			return fmt.Errorf("%w: %d of %d answers", ctx.Err(), a.answered.Load(), a.n)
		}
	}
}

// closedLoop publishes b keeping at most inflight messages unanswered and
// returns the time from the first publish to the last answer.
func (p *publisher) closedLoop(ctx context.Context, b batch, inflight int, check func([]byte) error) (time.Duration, error) {
	sem := make(chan struct{}, inflight)
	a := &answers{check: check, onRecv: func(int, time.Time) { <-sem }}
	stop, err := p.subscribe(b, a)
	if err != nil {
		return 0, err
	}
	defer stop()
	start := time.Now()
	for _, m := range b.msgs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return 0, fmt.Errorf("publishing: %w", ctx.Err())
		}
		if _, err := p.js.PublishMsgAsync(m); err != nil {
			return 0, fmt.Errorf("publish %s: %w", m.Subject, err)
		}
	}
	if err := p.wait(ctx, a); err != nil {
		return 0, err
	}
	return a.last.Sub(start), nil
}

// closedLoopLatency is closedLoop that also returns each message's latency,
// from its publish to its answer.
func (p *publisher) closedLoopLatency(ctx context.Context, b batch, inflight int, check func([]byte) error) (time.Duration, []time.Duration, error) {
	sem := make(chan struct{}, inflight)
	sent := make([]time.Time, len(b.msgs))
	lat := make([]time.Duration, len(b.msgs))
	var mu sync.Mutex
	a := &answers{check: check, onRecv: func(i int, at time.Time) {
		mu.Lock()
		lat[i] = at.Sub(sent[i])
		mu.Unlock()
		<-sem
	}}
	stop, err := p.subscribe(b, a)
	if err != nil {
		return 0, nil, err
	}
	defer stop()
	start := time.Now()
	for i, m := range b.msgs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("publishing: %w", ctx.Err())
		}
		mu.Lock()
		sent[i] = time.Now()
		mu.Unlock()
		if _, err := p.js.PublishMsgAsync(m); err != nil {
			return 0, nil, fmt.Errorf("publish %s: %w", m.Subject, err)
		}
	}
	if err := p.wait(ctx, a); err != nil {
		return 0, nil, err
	}
	return a.last.Sub(start), lat, nil
}

// openLoop publishes b at rate messages per second on a fixed schedule,
// whatever the answers do, and returns each message's latency from its
// scheduled send time to its answer (no coordinated omission).
func (p *publisher) openLoop(ctx context.Context, b batch, rate float64, check func([]byte) error) ([]time.Duration, time.Duration, error) {
	n := len(b.msgs)
	lat := make([]time.Duration, n)
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	a := &answers{check: check, onRecv: func(i int, at time.Time) {
		lat[i] = at.Sub(start.Add(time.Duration(i) * interval))
	}}
	stop, err := p.subscribe(b, a)
	if err != nil {
		return nil, 0, err
	}
	defer stop()
	for i, m := range b.msgs {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return nil, 0, fmt.Errorf("publishing: %w", ctx.Err())
			}
		}
		if _, err := p.js.PublishMsgAsync(m); err != nil {
			return nil, 0, fmt.Errorf("publish %s: %w", m.Subject, err)
		}
	}
	sent := time.Since(start)
	if err := p.wait(ctx, a); err != nil {
		return nil, 0, err
	}
	return lat, sent, nil
}

// percentile returns the q-quantile (0..1) of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
