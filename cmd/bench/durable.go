package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/internal/natsrv"
	"github.com/idemgate/idemgate/internal/worker"
	"github.com/idemgate/idemgate/pkg/dedup"
)

// durableMode is a row of the durable scenario: the server's sync policy,
// the workers' ledger batch (0: off) and batches in flight, and whether the
// work stream persists as the server does (the workers' SyncIntents) or
// asynchronously.
type durableMode struct {
	name        string
	sync        string
	batch       int
	inFlight    int
	syncIntents bool
	cluster     bool // also run on a cluster (where the work stream always persists as the server does)
}

// durableModes are the store settings the durable scenario sets side by
// side, after the worker's defaults (defaultMode, the row "durable"); a
// mode that is the defaults' is not run twice.
var durableModes = []durableMode{
	{name: "durable-synced-unbatched", sync: natsrv.SyncAlways, syncIntents: true, cluster: true},
	{name: "durable-synced-4", sync: natsrv.SyncAlways, batch: 500, inFlight: 4, syncIntents: true, cluster: true},
	{name: "durable-synced-1", sync: natsrv.SyncAlways, batch: 500, inFlight: 1, syncIntents: true, cluster: true},
	{name: "durable-async-unbatched", sync: natsrv.SyncAlways},
	{name: "durable-async-4", sync: natsrv.SyncAlways, batch: 500, inFlight: 4},
	{name: "durable-async-1", sync: natsrv.SyncAlways, batch: 500, inFlight: 1},
	{name: "lazy", sync: natsrv.SyncLazy, cluster: true},
	{name: "lazy-batched-1", sync: natsrv.SyncLazy, batch: 500, inFlight: 1, cluster: true},
}

// defaultName is the name of the durable rows of the worker's defaults:
// durable@64, durable@256.
const defaultName = "durable"

// defaultMode is what a worker does with no durability flag: an embedded
// server syncs always, the work stream persists asynchronously (as the
// server does on a cluster), the ledger group-commits with the default
// batch and batches in flight.
func defaultMode(cluster bool) durableMode {
	return durableMode{name: defaultName, sync: natsrv.SyncAlways, batch: worker.DefaultLedgerBatch, inFlight: worker.LedgerBatchInFlightFor(replicas(cluster)),
		cluster: true}
}

// replicas are the bench's stream and bucket replicas.
func replicas(cluster bool) int {
	if cluster {
		return 3
	}
	return 1
}

// same reports whether m sets what o sets.
func (m durableMode) same(o durableMode) bool {
	return m.sync == o.sync && m.batch == o.batch && m.inFlight == o.inFlight && m.syncIntents == o.syncIntents
}

func (m durableMode) String() string { return m.describe(false) }

// describe says what m sets; on a cluster the work stream persists as the
// server does whatever the mode asks (JetStream refuses async persistence
// for R>1).
func (m durableMode) describe(cluster bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sync %s, ", m.sync)
	switch {
	case cluster:
		b.WriteString("work stream R3, ")
	case m.syncIntents:
		b.WriteString("work stream synced, ")
	default:
		b.WriteString("work stream async, ")
	}
	if m.batch == 0 {
		b.WriteString("ledger unbatched")
	} else {
		fmt.Fprintf(&b, "ledger batch %d ×%d in flight", m.batch, m.inFlight)
	}
	return b.String()
}

// durable runs, at each of DurableInflight intents in flight: the baseline's
// messaging at sync always (its work stream synced, then async: the ceiling
// of any ledger), the ledger's writes alone at sync always (claim and
// complete, group-committed: the ledger's ceiling), every durable mode
// closed-loop for at least DurableFor, and the defaults' mode open-loop at
// half its closed-loop rate. Each closed-loop row is sized by an unmeasured
// first run of DurableWarmup intents.
func (b *bench) durable(parent context.Context) error {
	// Each row is bounded by -timeout on its own.
	var ctx context.Context
	var cancel context.CancelFunc = func() {}
	row := func() context.Context {
		cancel()
		ctx, cancel = context.WithTimeout(parent, b.cfg.Timeout)
		return ctx
	}
	defer func() { cancel() }()
	def := defaultMode(b.cfg.Cluster)
	fmt.Fprintf(b.out, "durable: the worker's defaults: %s\n", def.describe(b.cfg.Cluster))
	for _, inflight := range b.cfg.DurableInflight {
		for _, base := range []struct {
			name    string
			persist jetstream.PersistModeType
		}{{"baseline-always", jetstream.DefaultPersistMode}, {"baseline-always-async", jetstream.AsyncPersistMode}} {
			if (b.cfg.Cluster && base.persist == jetstream.AsyncPersistMode) || !b.cfg.wantsRow(base.name) {
				continue
			}
			e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, natsrv.SyncAlways)
			if err != nil {
				return err
			}
			_, err = b.runBaseline(row(), e, fmt.Sprintf("%s@%d", base.name, inflight), b.cfg.DurableWarmup, inflight, base.persist, b.cfg.DurableFor)
			e.close()
			if err != nil {
				return fmt.Errorf("%s at %d in flight: %w", base.name, inflight, err)
			}
		}
		if b.cfg.wantsRow("ledger-always") {
			if err := b.ledgerAlone(row(), inflight); err != nil {
				return fmt.Errorf("ledger-always at %d in flight: %w", inflight, err)
			}
		}
		for _, m := range append([]durableMode{def}, durableModes...) {
			if (b.cfg.Cluster && !m.cluster) || (m.name != def.name && m.same(def)) || !b.cfg.wantsRow(m.name) {
				continue
			}
			if err := b.durableRun(row(), m, inflight, false); err != nil {
				return fmt.Errorf("%s at %d in flight: %w", m.name, inflight, err)
			}
		}
		if !b.cfg.wantsRow(def.name + "-half") {
			continue
		}
		if err := b.durableRun(row(), def, inflight, true); err != nil {
			return fmt.Errorf("%s at half load: %w", def.name, err)
		}
	}
	return nil
}

// durableRun measures mode m at inflight intents in flight, closed-loop; or,
// when half, open-loop at half the rate its closed-loop row reached.
func (b *bench) durableRun(ctx context.Context, m durableMode, inflight int, half bool) error {
	name := fmt.Sprintf("%s@%d", m.name, inflight)
	var rate float64
	if half {
		peak, ok := b.rowOps(name)
		if !ok {
			return errors.New("no closed-loop rate to take half of")
		}
		rate, name = peak/2, fmt.Sprintf("%s-half@%d", m.name, inflight)
	}
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, m.sync)
	if err != nil {
		return err
	}
	defer e.close()
	o := workerOpts{concurrency: b.cfg.Concurrency, ledgerBatch: m.batch, batchInFlight: m.inFlight, syncIntents: m.syncIntents,
		answerCache: b.cfg.AnswerCache, drain: 5 * time.Second}
	n := b.cfg.DurableWarmup
	if half {
		n = max(int(rate*b.cfg.DurableFor.Seconds()), 1)
	}
	r, err := b.prepare(ctx, e, name+"-first", n, max(inflight, n), o)
	if err != nil {
		return err
	}
	g := r.g
	defer func() { _ = g.stop() }()
	var checks []verify
	loop := func(label string, keys []string, data [][]byte) (took time.Duration, lat []time.Duration, cpu time.Duration, err error) {
		runs := g.expectRuns(keys)
		var a *answers
		bt := idemBatch(g.names, data, keys, true)
		cpu, err = b.measure(label, func() error {
			var err error
			if half {
				var received []time.Time
				lat, took, received, a, err = r.p.openLoop(ctx, bt, rate, expect(false))
				_ = received
				return err
			}
			took, lat, a, err = r.p.closedLoop(ctx, bt, inflight, expect(false))
			return err
		})
		checks = append(checks, verify{name: label, runs: runs, want: 1, a: a})
		return took, lat, cpu, err
	}
	if !half {
		// The first run sizes the measured one: DurableFor at its rate.
		took, _, _, err := loop(name+"-first", r.keys, r.data)
		if err != nil {
			return fmt.Errorf("first run: %w", err)
		}
		n = min(max(int(float64(n)/took.Seconds()*b.cfg.DurableFor.Seconds()), b.cfg.DurableWarmup), maxDurableN)
		if r.data, r.keys, err = b.intents(n, name); err != nil {
			return err
		}
	}
	before := g.batchStats()
	took, lat, cpu, err := loop(name, r.keys, r.data)
	if err != nil {
		return err
	}
	st := g.batchStats()
	st.Batches, st.BatchedWrites, st.SingleWrites = st.Batches-before.Batches, st.BatchedWrites-before.BatchedWrites, st.SingleWrites-before.SingleWrites
	st.Resent, st.Fallbacks = st.Resent-before.Resent, st.Fallbacks-before.Fallbacks
	if err := g.stop(); err != nil {
		return err
	}
	if err := verifyAll(r.p, checks); err != nil {
		return err
	}
	p50, p99 := percentiles(lat)
	what := fmt.Sprintf("%d in flight", inflight)
	if half {
		what = fmt.Sprintf("open loop at %.0f/s (half of %s@%d)", rate, m.name, inflight)
	}
	b.add(row{name: name, ops: float64(n) / took.Seconds(), cpu: cpu / time.Duration(n),
		detail: fmt.Sprintf("%d intents in %s, %s, %s: p50 %s p99 %s%s", n, took.Round(time.Millisecond), what, m.describe(b.cfg.Cluster), ms(p50), ms(p99), batchDetail(st)),
		extra:  []float64{p50.Seconds(), p99.Seconds()}})
	return nil
}

// maxDurableN bounds the intents of one durable row.
const maxDurableN = 1_000_000

// ledgerAlone measures the ledger's writes without messaging at sync
// always: inflight goroutines each claiming a fresh key and completing it,
// through one group-committing ledger (the workers' default batch), for
// DurableFor. Each operation's claim must be Acquired.
func (b *bench) ledgerAlone(ctx context.Context, inflight int) error {
	name := fmt.Sprintf("ledger-always@%d", inflight)
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, natsrv.SyncAlways)
	if err != nil {
		return err
	}
	defer e.close()
	nc, err := e.connect("bench-ledger")
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "BENCH_LEDGER", Replicas: e.replicas},
		dedup.WithBatching(dedup.BatchConfig{Max: worker.DefaultLedgerBatch, InFlight: worker.LedgerBatchInFlightFor(e.replicas)}))
	if err != nil {
		return err
	}
	defer l.Close()
	result := []byte(`{"ok":true}`)
	var done atomic.Int64
	var took time.Duration
	cpu, err := b.measure(name, func() error {
		deadline := time.Now().Add(b.cfg.DurableFor)
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, inflight)
		for w := range inflight {
			wg.Go(func() {
				for i := 0; time.Now().Before(deadline); i++ {
					c, err := l.Claim(ctx, dedup.ClaimRequest{Key: fmt.Sprintf("bench.%s.%d.%d", b.runID, w, i), Tool: benchTool,
						Fingerprint: "bench", Holder: "bench"})
					if err == nil && c.Outcome != dedup.Acquired {
						err = fmt.Errorf("claim of a fresh key: %s", c.Outcome)
					}
					if err == nil {
						_, err = c.Lease.Complete(ctx, result, 1)
					}
					if err != nil {
						errs <- err
						return
					}
					done.Add(1)
				}
			})
		}
		wg.Wait()
		took = time.Since(start)
		close(errs)
		return <-errs
	})
	if err != nil {
		return err
	}
	n := done.Load()
	b.add(row{name: name, ops: float64(n) / took.Seconds(), cpu: cpu / time.Duration(max(n, 1)),
		detail: fmt.Sprintf("%d claims + completions, %d at once, in %s, ledger batch %d ×%d in flight%s", n, inflight,
			took.Round(time.Millisecond), worker.DefaultLedgerBatch, worker.LedgerBatchInFlightFor(e.replicas), batchDetail(l.BatchStats()))})
	return nil
}
