package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/intent"
)

// baseline is the same messaging without the ledger: async JetStream publish
// to a work-queue stream, the worker's pull consumer settings and
// concurrency, a core-NATS reply, an ack.
func (b *bench) baseline(ctx context.Context) error {
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, b.cfg.Sync)
	if err != nil {
		return err
	}
	defer e.close()
	_, err = b.runBaseline(ctx, e, "baseline", b.cfg.N, b.cfg.Inflight, jetstream.DefaultPersistMode, 0)
	return err
}

// runBaseline measures n messages through the baseline with inflight
// unanswered on a work stream with the given persist mode, adds the row and
// returns its rate. With sizeFor, the n messages are an unmeasured first
// run, and the measured one is as many as that rate sends in sizeFor.
func (b *bench) runBaseline(ctx context.Context, e *env, name string, n, inflight int, persist jetstream.PersistModeType, sizeFor time.Duration) (float64, error) {
	nc, err := e.connect("bench-base-setup")
	if err != nil {
		return 0, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        "BENCH_BASE",
		Subjects:    []string{"bench.base.>"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    e.replicas,
		Duplicates:  2 * time.Minute,
		PersistMode: persist,
	})
	if err != nil {
		return 0, err
	}
	if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       "BENCH_BASE",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: max(4096, b.cfg.Concurrency*b.cfg.Workers),
		Replicas:      e.replicas,
	}); err != nil {
		return 0, err
	}
	var runs atomic.Pointer[tally]
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, b.cfg.Workers)
	stopAll := func() { cancel(); wg.Wait() }
	for i := range b.cfg.Workers {
		// Each handler's consumer, deliveries and acks are on its own
		// connection, as a worker's are.
		cnc, err := e.connectWorker(fmt.Sprintf("bench-base-%d", i+1), !b.cfg.WorkerInProcess)
		if err != nil {
			stopAll()
			return 0, err
		}
		cjs, err := jetstream.New(cnc)
		if err != nil {
			stopAll()
			return 0, err
		}
		cons, err := cjs.Consumer(ctx, "BENCH_BASE", "BENCH_BASE")
		if err != nil {
			stopAll()
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- consumeBaseline(runCtx, cons, cnc, b.cfg.Concurrency, &runs)
		}()
	}
	defer stopAll()

	pnc, err := e.connect("bench-publisher")
	if err != nil {
		return 0, err
	}
	p, err := newPublisher(pnc, inflight)
	if err != nil {
		return 0, err
	}
	var checks []verify
	pass := func(label string, n int) (took time.Duration, lat []time.Duration, cpu time.Duration, err error) {
		data, _, err := b.intents(n, label)
		if err != nil {
			return 0, nil, 0, err
		}
		t := newTally(n, nil)
		runs.Store(t)
		bt := newBatch(len(data), intent.HeaderReplyTo,
			func(int) string { return "bench.base." + benchTool },
			func(i int) []byte { return data[i] }, nil)
		var a *answers
		cpu, err = b.measure(label, func() error {
			var err error
			took, lat, a, err = p.closedLoop(ctx, bt, inflight, nil)
			return err
		})
		checks = append(checks, verify{name: label, runs: t, want: 1, a: a})
		return took, lat, cpu, err
	}
	if sizeFor > 0 {
		took, _, _, err := pass(name+"-first", n)
		if err != nil {
			return 0, fmt.Errorf("first run: %w", err)
		}
		n = min(max(int(float64(n)/took.Seconds()*sizeFor.Seconds()), n), maxDurableN)
	}
	took, lat, cpu, err := pass(name, n)
	if err != nil {
		return 0, err
	}
	stopAll()
	for range b.cfg.Workers {
		if err := <-errs; err != nil {
			return 0, err
		}
	}
	if err := verifyAll(p, checks); err != nil {
		return 0, err
	}
	ops := float64(n) / took.Seconds()
	p50, p99 := percentiles(lat)
	b.add(row{name: name, ops: ops, cpu: cpu / time.Duration(n),
		detail: fmt.Sprintf("%d msgs, %d in flight, in %s: p50 %s p99 %s", n, inflight, took.Round(time.Millisecond), ms(p50), ms(p99)),
		extra:  []float64{p50.Seconds(), p99.Seconds()}})
	return ops, nil
}

// consumeBaseline mirrors the worker's consume loop (pull with
// PullMaxMessages(concurrency), one goroutine per message up to concurrency)
// with a handler that only replies and acks, counting each message's
// handling in the tally runs holds (by the index its reply subject ends
// with).
func consumeBaseline(ctx context.Context, cons jetstream.Consumer, nc *nats.Conn, concurrency int, runs *atomic.Pointer[tally]) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(concurrency))
	if err != nil {
		return err
	}
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			it.Drain()
		case <-stopped:
		}
	}()
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return nil
		}
		if err != nil {
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := msg.Metadata(); err != nil {
				_ = msg.Term()
				return
			}
			if reply := msg.Headers().Get(intent.HeaderReplyTo); reply != "" {
				i, err := strconv.Atoi(reply[strings.LastIndexByte(reply, '.')+1:])
				if err != nil {
					i = -1
				}
				if t := runs.Load(); t != nil {
					t.ranIndex(i)
				}
				_ = nc.Publish(reply, msg.Data())
			}
			_ = msg.Ack()
		}()
	}
}
