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
	// closed.
	seen   []bool
	count  int
	last   time.Time
	badErr error

	extra    atomic.Int64 // answers to an index already answered
	unknown  atomic.Int64 // answers to no index of the batch
	answered atomic.Int64 // count, for reading while answers arrive
	stop     func()       // ends the subscription
}

// strays reports answers that were not asked for: a second answer to one
// intent, or an answer to none. It ends the subscription.
func (a *answers) strays() error {
	a.stop()
	if x, u := a.extra.Load(), a.unknown.Load(); x != 0 || u != 0 {
		return fmt.Errorf("answers: %d extra answers to intents already answered, %d to no intent", x, u)
	}
	return nil
}

func (a *answers) handle(m *nats.Msg) {
	at := time.Now()
	i, err := strconv.Atoi(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:])
	if err != nil || i < 0 || i >= a.n {
		a.unknown.Add(1)
		return
	}
	if a.seen[i] {
		a.extra.Add(1)
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

// subscribe starts receiving b's answers, until a.stop.
func (p *publisher) subscribe(b batch, a *answers) error {
	a.n = len(b.msgs)
	a.seen = make([]bool, a.n)
	a.done = make(chan struct{})
	sub, err := p.nc.Subscribe(b.inbox+".*", a.handle)
	if err != nil {
		return err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	a.stop = func() { _ = sub.Unsubscribe() }
	return nil
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
// returns the time from the first publish to the last answer, and each
// message's latency from its publish to its answer. The answers stay
// subscribed until a.strays is called (or an error).
func (p *publisher) closedLoop(ctx context.Context, b batch, inflight int, check func([]byte) error) (took time.Duration, lat []time.Duration, a *answers, err error) {
	sem := make(chan struct{}, inflight)
	sent := make([]time.Time, len(b.msgs))
	lat = make([]time.Duration, len(b.msgs))
	var mu sync.Mutex
	a = &answers{check: check, onRecv: func(i int, at time.Time) {
		mu.Lock()
		lat[i] = at.Sub(sent[i])
		mu.Unlock()
		<-sem
	}}
	if err := p.subscribe(b, a); err != nil {
		return 0, nil, nil, err
	}
	defer func() {
		if err != nil {
			a.stop()
		}
	}()
	start := time.Now()
	for i, m := range b.msgs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return 0, nil, nil, fmt.Errorf("publishing: %w", ctx.Err())
		}
		mu.Lock()
		sent[i] = time.Now()
		mu.Unlock()
		if _, err := p.js.PublishMsgAsync(m); err != nil {
			return 0, nil, nil, fmt.Errorf("publish %s: %w", m.Subject, err)
		}
	}
	if err := p.wait(ctx, a); err != nil {
		return 0, nil, nil, err
	}
	return a.last.Sub(start), lat, a, nil
}

// openLoop publishes b at rate messages per second on a fixed schedule,
// whatever the answers do, and returns each message's latency from its
// scheduled send time to its answer (no coordinated omission).
// The answers stay subscribed until a.strays is called (or an error);
// received[i] is when the i-th answer came (its scheduled send time is
// received[i] - lat[i]).
func (p *publisher) openLoop(ctx context.Context, b batch, rate float64, check func([]byte) error) (lat []time.Duration, sent time.Duration, received []time.Time, a *answers, err error) {
	n := len(b.msgs)
	// The answers' handler keeps its own slices: an error return sets the
	// results to nil while answers may still arrive.
	lats, recvs := make([]time.Duration, n), make([]time.Time, n)
	lat, received = lats, recvs
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	a = &answers{check: check, onRecv: func(i int, at time.Time) {
		lats[i] = at.Sub(start.Add(time.Duration(i) * interval))
		recvs[i] = at
	}}
	if err := p.subscribe(b, a); err != nil {
		return nil, 0, nil, nil, err
	}
	defer func() {
		if err != nil {
			a.stop()
		}
	}()
	t := time.NewTimer(0)
	defer t.Stop()
	for i, m := range b.msgs {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			t.Reset(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				return nil, 0, nil, nil, fmt.Errorf("publishing: %w", ctx.Err())
			}
		}
		if _, err := p.js.PublishMsgAsync(m); err != nil {
			return nil, 0, nil, nil, fmt.Errorf("publish %s: %w", m.Subject, err)
		}
	}
	sent = time.Since(start)
	if err := p.wait(ctx, a); err != nil {
		return nil, 0, nil, nil, err
	}
	return lat, sent, received, a, nil
}

// percentile returns the q-quantile (0..1) of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
